"""The ``.tscope`` session file and the wire: one framed, compressed record stream.

Layout (all integers little-endian)::

    file   := HEADER frame*
    HEADER := b"\\x89TSCOPE\\n" u16 major u16 minor u32 reserved        (16 bytes)
    frame  := b"FRM1" u32 length u32 crc32 u32 seq u32 n_events u32 flags
              i64 step_lo i64 step_hi  payload[length]                (40-byte header)
    payload:= zlib( JSON lines, one event per line )

Why a frame stream and not SQLite as the file: the training process only ever appends, so a
SIGKILL at any moment leaves every whole frame readable and at most a torn tail, which the
reader drops (checked by length and CRC); there is no journal or WAL side-file to lose when
the file is mailed to a colleague; and a frame is exactly what goes over the wire to the
server, so there is one codec for both.  Random access comes from the 40-byte headers:
``index()`` walks headers only (seek past payloads), then a reader decompresses just the
frames whose step range it needs.  zlib is in the standard library, which the capture side
is limited to.

Data only: payloads are JSON, never pickle; lengths and counts are bounded by the limits in
``schema``; a frame that fails its CRC or bound ends the readable part of the file.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from .schema import MAX_EVENT_BYTES, MAX_FRAME_BYTES, MAX_FRAME_EVENTS, SCHEMA_VERSION

MAGIC = b"\x89TSCOPE\n"
_HEADER = struct.Struct("<8sHHI")
FRAME_TAG = b"FRM1"
_FRAME = struct.Struct("<4sIIIIIqq")
HEADER_SIZE = _HEADER.size  # 16
FRAME_HEADER_SIZE = _FRAME.size  # 40
NO_STEP = -1

# Frame flags.
FLAG_GRAPH = 1  # the frame holds a GraphEvent (kept in frames of their own for random access)


class SessionFileError(ValueError):
    """A file that is not a readable torchscope session; the message is one line for users."""


@dataclass(frozen=True)
class FrameInfo:
    seq: int
    offset: int  # file offset of the frame header
    length: int  # payload bytes
    n_events: int
    flags: int
    step_lo: int
    step_hi: int


def file_header(version: tuple[int, int] = SCHEMA_VERSION) -> bytes:
    return _HEADER.pack(MAGIC, version[0], version[1], 0)


def check_file_header(data: bytes, name: str = "file") -> tuple[int, int]:
    """Validate the 16-byte header; return (major, minor)."""
    if len(data) == 0:
        raise SessionFileError(f"{name} is empty, not a torchscope session file")
    if len(data) < HEADER_SIZE or not data.startswith(MAGIC):
        raise SessionFileError(f"{name} is not a torchscope session file (.tscope)")
    _, major, minor, _ = _HEADER.unpack(data[:HEADER_SIZE])
    if major > SCHEMA_VERSION[0]:
        raise SessionFileError(
            f"{name} was written by a newer torchscope (format {major}.{minor}); "
            f"this one reads up to {SCHEMA_VERSION[0]}.x — upgrade torchscope"
        )
    return major, minor


def _step_range(events: list[dict[str, Any]]) -> tuple[int, int]:
    steps = [e["step"] for e in events if isinstance(e.get("step"), int)]
    return (min(steps), max(steps)) if steps else (NO_STEP, NO_STEP)


def encode_frame(seq: int, events: list[dict[str, Any]], level: int = 1) -> bytes:
    """One frame: header + zlib(JSON lines).  Used by the file writer and the wire alike."""
    body = "\n".join(json.dumps(e, separators=(",", ":"), allow_nan=True) for e in events).encode()
    payload = zlib.compress(body, level)
    lo, hi = _step_range(events)
    flags = FLAG_GRAPH if any(e.get("kind") == "graph" for e in events) else 0
    header = _FRAME.pack(FRAME_TAG, len(payload), zlib.crc32(payload), seq, len(events), flags, lo, hi)
    return header + payload


def parse_frame_header(data: bytes, offset: int = 0) -> FrameInfo:
    if len(data) < FRAME_HEADER_SIZE:
        raise SessionFileError("truncated frame header")
    tag, length, _crc, seq, n, flags, lo, hi = _FRAME.unpack(data[:FRAME_HEADER_SIZE])
    if tag != FRAME_TAG:
        raise SessionFileError("bad frame tag")
    if length > MAX_FRAME_BYTES or n > MAX_FRAME_EVENTS:
        raise SessionFileError("frame exceeds the size limits")
    return FrameInfo(seq, offset, length, n, flags, lo, hi)


def decode_frame(data: bytes) -> tuple[FrameInfo, list[dict[str, Any]]]:
    """Decode one whole frame (header + payload), validating bounds and CRC."""
    info = parse_frame_header(data)
    payload = data[FRAME_HEADER_SIZE : FRAME_HEADER_SIZE + info.length]
    return info, decode_payload(info, payload, data)


def decode_payload(info: FrameInfo, payload: bytes, header: bytes | None = None) -> list[dict[str, Any]]:
    if len(payload) != info.length:
        raise SessionFileError("truncated frame")
    if header is not None:
        crc = _FRAME.unpack(header[:FRAME_HEADER_SIZE])[2]
        if zlib.crc32(payload) != crc:
            raise SessionFileError("frame checksum mismatch")
    d = zlib.decompressobj()
    try:
        body = d.decompress(payload, MAX_EVENT_BYTES)
    except zlib.error as exc:
        raise SessionFileError("frame payload is not valid compressed data") from exc
    if d.unconsumed_tail:
        raise SessionFileError("frame payload exceeds the size limits")
    events: list[dict[str, Any]] = []
    for line in body.splitlines():
        if not line:
            continue
        try:
            ev = json.loads(line)
        except ValueError as exc:
            raise SessionFileError("frame holds a record that is not JSON") from exc
        if not isinstance(ev, dict) or not isinstance(ev.get("kind"), str):
            raise SessionFileError("frame holds a record without a kind")
        events.append(ev)
    if len(events) != info.n_events:
        raise SessionFileError("frame event count mismatch")
    return events


class SessionFileWriter:
    """Append-only writer.  Owned by the capture's background thread; never the training thread."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._f: BinaryIO = open(self.path, "wb")  # noqa: SIM115 - lives as long as the writer
        self._f.write(file_header())
        self._f.flush()
        self.seq = 0
        self.frames: list[FrameInfo] = []

    def append(self, events: list[dict[str, Any]]) -> FrameInfo:
        frame = encode_frame(self.seq, events)
        offset = self._f.tell()
        self._f.write(frame)
        # flush to the OS so a SIGKILL of this process loses nothing already appended
        self._f.flush()
        info = parse_frame_header(frame, offset)
        self.frames.append(info)
        self.seq += 1
        return info

    def read_frame(self, info: FrameInfo) -> bytes:
        """The raw bytes of a frame already written (for resending over the wire)."""
        with open(self.path, "rb") as f:
            f.seek(info.offset)
            return f.read(FRAME_HEADER_SIZE + info.length)

    def close(self, fsync: bool = True) -> None:
        if self._f.closed:
            return
        self._f.flush()
        if fsync:
            os.fsync(self._f.fileno())
        self._f.close()


def index(path: str | os.PathLike[str]) -> tuple[tuple[int, int], list[FrameInfo]]:
    """Walk frame headers only; return the format version and every whole frame.

    A torn or corrupt tail (a killed writer) ends the list silently: what came before it is
    the readable session.  CRCs are checked when a frame is read, not here.
    """
    name = os.path.basename(os.fspath(path))
    try:
        f = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        raise SessionFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SessionFileError(f"{path} is a directory, not a session file") from None
    except OSError as exc:
        raise SessionFileError(f"{path}: cannot read ({exc.strerror})") from None
    with f:
        version = check_file_header(f.read(HEADER_SIZE), name)
        size = os.fstat(f.fileno()).st_size
        frames: list[FrameInfo] = []
        offset = HEADER_SIZE
        while offset + FRAME_HEADER_SIZE <= size:
            f.seek(offset)
            try:
                info = parse_frame_header(f.read(FRAME_HEADER_SIZE), offset)
            except SessionFileError:
                break
            if offset + FRAME_HEADER_SIZE + info.length > size:
                break
            frames.append(info)
            offset += FRAME_HEADER_SIZE + info.length
    return version, frames


def read_frames(path: str | os.PathLike[str], frames: Iterable[FrameInfo]) -> Iterator[list[dict[str, Any]]]:
    """Decode the given frames; a frame failing its CRC ends the iteration (torn tail)."""
    with open(path, "rb") as f:
        for info in frames:
            f.seek(info.offset)
            raw = f.read(FRAME_HEADER_SIZE + info.length)
            try:
                yield decode_payload(info, raw[FRAME_HEADER_SIZE:], raw)
            except SessionFileError:
                return


def iter_events(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every readable event of a session file, in order."""
    _, frames = index(path)
    for events in read_frames(path, frames):
        yield from events


def raw_frames(path: str | os.PathLike[str]) -> Iterator[bytes]:
    """Every whole frame's raw bytes (header + payload) — what an import sends to the store."""
    _, frames = index(path)
    with open(path, "rb") as f:
        for info in frames:
            f.seek(info.offset)
            yield f.read(FRAME_HEADER_SIZE + info.length)
