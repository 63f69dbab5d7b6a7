"""The ``.tscope`` session file and the wire: one framed, compressed record stream.

Layout (all integers little-endian)::

    file   := HEADER frame*
    HEADER := b"\\x89TSCOPE\\n" u16 major u16 minor u32 reserved        (16 bytes)
    frame  := b"FRM1" u32 length u32 crc32 u32 seq u32 n_events u32 flags
              i64 step_lo i64 step_hi  payload[length]                (40-byte header)
    payload:= zlib( JSON lines, one event per line )

Since format 1.1 the writer follows the step frames of each flush with one ``series`` frame
per part of ``series.PARTS`` (flags ``FLAG_SERIES`` plus a bit naming the part): the columns
``series.columns`` makes of the step events written since the previous series frame of that
part, so whole-run series read those small frames instead of every step event.

Why a frame stream and not SQLite as the file: the training process only ever appends, so a
SIGKILL at any moment leaves every whole frame readable and at most a torn tail, which the
reader drops (checked by length and CRC); there is no journal or WAL side-file to lose when
the file is mailed to a colleague; and a frame is exactly what goes over the wire to the
server, so there is one codec for both.  Random access comes from the 40-byte headers:
``index()`` walks headers only (seek past payloads), then a reader decompresses just the
frames whose step range it needs, or the series frames for a whole-run series.  zlib is in
the standard library, which the capture side is limited to.

Data only: payloads are JSON, never pickle; lengths and counts are bounded by the limits in
``schema``.  A damaged *last* frame is a torn tail and is dropped; damage anywhere else (CRC,
bounds, sequence, a header that disagrees with its payload) raises ``SessionFileError`` naming
the byte offset, rather than silently cutting the session short.  The whole-file readers
(``torchscope info``, the doctor, an import) read through ``salvage`` instead: the frames
before the first damaged one, and a note (``Readable.note``) saying what was dropped.  See
docs/session-format.md.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import struct
import time
import zlib
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from . import series
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
FLAG_SERIES = 2  # the frame holds one series record (1.1): columns of the step events before it
FLAG_SERIES_STEPS = 4  # with FLAG_SERIES: the record is the "steps" part
FLAG_SERIES_GRADS = 8  # with FLAG_SERIES: the record is the "grads" part (neither: "memory")
_KNOWN_FLAGS = FLAG_GRAPH | FLAG_SERIES | FLAG_SERIES_STEPS | FLAG_SERIES_GRADS  # others: 0 in every 1.x file
# a series frame's flags name its part, so a reader picks the frames of one part by header
SERIES_FLAGS = {
    "memory": FLAG_SERIES,
    "steps": FLAG_SERIES | FLAG_SERIES_STEPS,
    "grads": FLAG_SERIES | FLAG_SERIES_GRADS,
}
_SERIES_BITS = FLAG_SERIES | FLAG_SERIES_STEPS | FLAG_SERIES_GRADS


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


def may_hold_labels(info: FrameInfo) -> bool:
    """Whether a frame's header is a labels frame's (one record, no step, no series): the frame
    a torchscope server appends to a download of a renamed or tagged run (LogEvent.labels)."""
    return info.flags == 0 and info.n_events == 1 and info.step_lo == NO_STEP


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
    for e in events:  # a series record's steps are a column
        cols = e.get("columns") if e.get("kind") == "series" else None
        if isinstance(cols, _EncodedColumns) and cols.lo != NO_STEP:
            steps += (cols.lo, cols.hi)
        elif isinstance(cols, dict) and isinstance(cols.get("step"), list):
            steps.extend(s for s in cols["step"] if isinstance(s, int) and not isinstance(s, bool))
    return (min(steps), max(steps)) if steps else (NO_STEP, NO_STEP)


def _flags(events: list[dict[str, Any]]) -> int:
    flags = 0
    for e in events:
        kind = e.get("kind")
        if kind == "graph":
            flags |= FLAG_GRAPH
        elif kind == "series":
            # an unknown part gets flags no valid header has, so check_records rejects it
            flags |= SERIES_FLAGS.get(str(e.get("part")), _SERIES_BITS)
    return flags


def series_part(info: FrameInfo) -> str | None:
    """The series part a frame holds, from its header; None for other frames."""
    bits = info.flags & _SERIES_BITS
    return next((part for part, flags in SERIES_FLAGS.items() if flags == bits), None) if bits else None


class RawJSON:
    """A value already encoded as JSON text (the native op recorder writes a step's op and
    tensor records so): ``dumps_event`` splices it into its event as is.  ``len()`` is the
    number of records it holds."""

    __slots__ = ("text", "n")

    def __init__(self, text: str, n: int) -> None:
        self.text, self.n = text, n

    def __len__(self) -> int:
        return self.n


_RAW_MARK = "\x00torchscope-raw:"  # a placeholder no real value is


def dumps_event(e: dict[str, Any]) -> str:
    """One event as compact JSON, its top-level ``RawJSON`` values spliced in."""
    raws = [(k, v) for k, v in e.items() if isinstance(v, RawJSON)]
    if not raws:
        return json.dumps(e, separators=(",", ":"), allow_nan=True)
    text = json.dumps({**e, **{k: _RAW_MARK + k for k, _ in raws}}, separators=(",", ":"), allow_nan=True)
    for k, v in raws:
        text = text.replace(json.dumps(_RAW_MARK + k), v.text, 1)
    return text


_SURROGATE = re.compile("[\ud800-\udfff]")


def unicode_text(text: str) -> str:
    """``text`` without lone surrogates, which no UTF-8 file, database or reader takes: Python
    hands a byte that is not UTF-8 in ``sys.argv``, a path or an environment variable over as
    ``\\udcXX`` (surrogateescape), written here as the four characters ``\\xXX`` -- the byte
    stays readable and recoverable, as Python's ``backslashreplace`` shows it; any other lone
    surrogate becomes U+FFFD.  (A pair of surrogates is the one character it stands for.)"""
    if not _SURROGATE.search(text):
        return text
    text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")  # pairs joined
    return _SURROGATE.sub(
        lambda m: f"\\x{ord(m[0]) - 0xDC00:02x}" if 0xDC80 <= ord(m[0]) <= 0xDCFF else "\ufffd", text)


def _unicode_values(value: Any) -> Any:
    if isinstance(value, str):
        return unicode_text(value)
    if isinstance(value, dict):
        return {unicode_text(k) if isinstance(k, str) else k: _unicode_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unicode_values(v) for v in value]
    return value


def _unicode_line(line: str) -> str:
    """One event's JSON ``line`` with its lone surrogates (escaped by ``json.dumps``, or raw in
    a ``RawJSON`` text) made valid Unicode (``unicode_text``): a frame's text is always UTF-8
    every reader takes (QA 53b: a non-UTF-8 byte in ``sys.argv`` made the session event, and
    so the whole file, unreadable, and the server refused the run)."""
    try:
        ev = json.loads(line)
        json.dumps(ev, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(_unicode_values(ev), separators=(",", ":"), allow_nan=True)
    return line


def _suspect(text: str) -> bool:
    """Whether ``text`` (JSON) may hold a lone surrogate: an escaped one, or any non-ASCII
    character (``isascii`` is O(1): the common all-ASCII frame costs one substring search)."""
    return "\\ud" in text or "\\uD" in text or not text.isascii()


def encode_frame(seq: int, events: list[dict[str, Any]], level: int = 1, *, valid_text: bool = True) -> bytes:
    """One frame: header + zlib(JSON lines).  Used by the file writer and the wire alike.  Its
    text is valid UTF-8 whatever the events hold (``unicode_text``); ``valid_text=False`` only
    for tests that make the hostile frames a reader must refuse."""
    lines = [dumps_event(e) for e in events]
    text = "\n".join(lines)
    if valid_text and _suspect(text):
        text = "\n".join(_unicode_line(line) if _suspect(line) else line for line in lines)
    body = text.encode()
    payload = zlib.compress(body, level)
    lo, hi = _step_range(events)
    flags = _flags(events)
    header = _FRAME.pack(FRAME_TAG, len(payload), zlib.crc32(payload), seq, len(events), flags, lo, hi)
    return header + payload


def series_record(steps: list[dict[str, Any]], part: str) -> dict[str, Any]:
    """The ``series`` record (``schema.SeriesRecord``) of one part over these step events."""
    pending = _SeriesRows(part)
    pending.add(steps)
    return pending.record()


class _EncodedColumns(RawJSON):
    """A series record's columns as JSON text, with the step range its frame header needs."""

    __slots__ = ("lo", "hi")

    def __init__(self, text: str, lo: int, hi: int) -> None:
        super().__init__(text, 1)
        self.lo, self.hi = lo, hi


class _SeriesRows:
    """The rows of one series part over the step events written since its last series frame,
    encoded as they come.  Encoding 256 steps' columns at once held the GIL for 10-25 ms on
    the writer thread (json's float formatting of the per-parameter gradient lists): the
    training step running then waited that long, every 256 steps.  Encoded per flush, each
    piece is a few steps' worth, and no step event is kept until its series frame."""

    __slots__ = ("part", "texts", "n", "lo", "hi", "rank")

    def __init__(self, part: str) -> None:
        self.part = part
        self.texts: list[list[str]] = [[] for _ in series.PARTS[part]]  # per column, JSON pieces
        self.n = 0
        self.lo = self.hi = NO_STEP
        self.rank: int | None = None

    def add(self, steps: list[dict[str, Any]]) -> None:
        if not steps:
            return
        for texts, values in zip(self.texts, series.columns(steps, self.part).values(), strict=True):
            texts.append(json.dumps(values, separators=(",", ":"), allow_nan=True)[1:-1])
        self.n += len(steps)
        numbers = [s for e in steps if isinstance(s := e.get("step"), int) and not isinstance(s, bool)]
        if numbers:
            self.lo = min(numbers) if self.lo == NO_STEP else min(self.lo, *numbers)
            self.hi = max(self.hi, *numbers)
        if self.rank is None:
            self.rank = next((r for e in steps if isinstance(r := e.get("rank"), int) and not isinstance(r, bool)), None)

    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"kind": "series", "part": self.part}
        if self.rank is not None:  # readers that group records by rank (the doctor) file it with its steps
            record["rank"] = self.rank
        body = ",".join(f'"{k}":[{",".join(texts)}]' for k, texts in zip(series.PARTS[self.part], self.texts, strict=True))
        record["columns"] = _EncodedColumns("{" + body + "}", self.lo, self.hi)
        return record


def parse_frame_header(data: bytes, offset: int = 0) -> FrameInfo:
    if len(data) < FRAME_HEADER_SIZE:
        raise SessionFileError("truncated frame header")
    tag, length, _crc, seq, n, flags, lo, hi = _FRAME.unpack(data[:FRAME_HEADER_SIZE])
    if tag != FRAME_TAG:
        raise SessionFileError("bad frame tag")
    if length > MAX_FRAME_BYTES or n > MAX_FRAME_EVENTS:
        raise SessionFileError("frame exceeds the size limits")
    if flags & ~_KNOWN_FLAGS:
        raise SessionFileError("frame has unknown flags")
    # a series frame holds exactly one record, of one part, and nothing else
    series_bits = flags & _SERIES_BITS
    if series_bits and (series_bits not in SERIES_FLAGS.values() or flags & FLAG_GRAPH or n != 1):
        raise SessionFileError("frame header has impossible flags")
    # the header is outside the CRC, and index() trusts it: cheap sanity on the step range
    # (a graph frame holds one graph, so one step)
    if lo > hi or lo < NO_STEP or (lo == NO_STEP) != (hi == NO_STEP) or (flags & FLAG_GRAPH and not lo == hi >= 0):
        raise SessionFileError("frame header has an impossible step range")
    return FrameInfo(seq, offset, length, n, flags, lo, hi)


def decode_frame(data: bytes) -> tuple[FrameInfo, list[dict[str, Any]]]:
    """Decode one whole frame (header + payload), validating bounds and CRC."""
    info = parse_frame_header(data)
    payload = data[FRAME_HEADER_SIZE : FRAME_HEADER_SIZE + info.length]
    return info, decode_payload(info, payload, data)


def decode_payload(info: FrameInfo, payload: bytes, header: bytes | None = None) -> list[dict[str, Any]]:
    body = decompress_payload(info, payload, header)
    events: list[dict[str, Any]] = []
    for line in body.splitlines():
        if not line:
            continue
        try:
            ev = json.loads(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
            raise SessionFileError("frame holds a record that is not JSON") from exc
        if not isinstance(ev, dict) or not isinstance(ev.get("kind"), str):
            raise SessionFileError("frame holds a record without a kind")
        if b"\\ud" in line or b"\\uD" in line:  # a surrogate escape: json.loads lets a lone one through
            try:
                json.dumps(ev, ensure_ascii=False).encode()  # which no UTF-8 writer or database takes
            except UnicodeEncodeError:
                raise SessionFileError("frame holds text that is not valid Unicode") from None
        events.append(ev)
    check_records(info, events)
    return events


def decompress_payload(info: FrameInfo, payload: bytes, header: bytes | None = None) -> bytes:
    """A frame's JSON-lines body, checked (length, CRC when ``header`` is given) and
    decompressed within the size limits; for readers that parse the lines their own way (the
    server validates each line straight from JSON).  Follow with ``check_records``."""
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
    if not d.eof:
        raise SessionFileError("frame payload is cut short")
    return body


def check_records(info: FrameInfo, events: list[dict[str, Any]]) -> None:
    """The header is outside the CRC: check that its event count, step range and flags (which
    random access trusts) say what the decoded records hold.  (The columns of a series record
    are checked by the reader that reads them: ``series.check_columns``.)"""
    if len(events) != info.n_events:
        raise SessionFileError("frame event count mismatch")
    if _step_range(events) != (info.step_lo, info.step_hi) or _flags(events) != info.flags:
        raise SessionFileError("frame header does not match its records")


def claim(path: str) -> None:
    """Create ``path`` holding only the file header, failing with ``FileExistsError`` where it
    exists: a run reserves its record path so (its writer, on a background thread, replaces it
    later).  The header is there from the first moment the name is -- written beside it, then
    hard-linked to the name, which fails where it is taken (an exclusive create that cannot be
    seen empty: the empty file O_EXCL left was read as "not a torchscope session file" by a
    reader polling a run just started).  A file system without hard links: O_EXCL, then write."""
    tmp = f"{path}.{os.getpid()}.claim"
    try:
        with open(tmp, "wb") as f:
            f.write(file_header())
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            if os.write(fd, file_header()) != HEADER_SIZE:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from None
        except OSError:
            os.unlink(path)  # (a full disk: no empty file left behind under the name)
            raise
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _create(path: str) -> BinaryIO:
    """A new file at ``path`` holding the file header, which no reader ever sees empty: the
    header goes into a file beside it that then replaces ``path`` in one rename.  (Opening
    ``path`` itself left a moment where ``torchscope open`` -- or a poll of a live run's file
    -- read 0 bytes and called it "not a torchscope session file".)  A path that is not a
    regular file -- a FIFO, /dev/null -- is opened as it is: it must not be renamed over."""
    target = os.path.realpath(path)  # write through a symlink, as open() does
    renamed = not os.path.exists(target) or os.path.isfile(target)
    tmp = f"{target}.{os.getpid()}.new" if renamed else target
    # (readable too: a file deleted during the run is copied from it, SessionFileWriter.check)
    f = open(tmp, "w+b" if renamed else "wb")  # noqa: SIM115 - lives as long as the writer
    try:
        f.write(file_header())
        f.flush()
        if renamed:
            os.replace(tmp, target)
    except BaseException:
        f.close()
        if renamed:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    return f


class _PositionalReader:
    """``seek`` and ``read`` of a descriptor by ``os.pread``: its own position, none shared."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pos = fd, 0

    def seek(self, pos: int) -> int:
        self.pos = pos
        return pos

    def read(self, n: int) -> bytes:
        data = os.pread(self.fd, n, self.pos)
        self.pos += len(data)
        return data


class SessionFileWriter:
    """Append-only writer.  Owned by the capture's background thread; never the training thread.

    A frame goes to the disk whole or not at all: it is written at the writer's own offset
    (``os.pwrite``, no buffer in between), and a write that fails -- a full disk -- is cut off
    again, so the file always ends at a frame boundary.  The frame is then *held*, with its seq:
    ``append`` raises the ``OSError`` having taken the events, ``write_held`` retries the same
    bytes, and nothing else is written before it is.  A frame takes its seq when it is on the
    disk (``seq`` counts those), so a retry never repeats one.  (Through a buffered file, a
    failed frame stayed in the buffer, reached the disk with the next write, and was followed
    by a second frame of its seq: every reader stopped there, QA 53b.)"""

    RECENT_FRAMES = 4096  # offsets kept for the latest 4096-8191 frames (resent after a blip)
    MARK_EVERY = 1024
    KEEP_BYTES = 4 << 20  # the first frames kept in memory to write the file again (``check``)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._f: BinaryIO = _create(self.path)
        self._regular = stat.S_ISREG(os.fstat(self._f.fileno()).st_mode)
        self.seq = 0  # frames written so far
        # Where each frame lies, for resending (``spans``) -- kept small however long the run:
        # the offsets of the latest frames, and of every MARK_EVERY-th frame since the start;
        # a frame between two marks is found by reading the headers after the mark before it.
        # (A FrameInfo kept per frame cost ~200 B each: ~480 MB over a week of 0.25 s flushes.)
        self._recent = array("q")  # offsets of frames _recent_base .. seq - 1
        self._recent_base = 0
        self._marks = array("q")  # offset of frame k * MARK_EVERY
        self._end = HEADER_SIZE  # offset just past the last frame
        # per series part: the rows of the step events appended since that part's last series frame
        self._unseries = {part: _SeriesRows(part) for part in series.PARTS}
        self.held: bytes | None = None  # the frame (numbered seq) the disk refused, written first
        # the frames without a step (the session event's, the script's), by seq, while they are
        # few: a file cut short by another program is written again with them (``check``)
        self._kept: dict[int, bytes] = {}
        self._kept_bytes = 0
        self._unchecked = False  # a file that could not be written again: not looked at again
        self._rewrite_waits = False  # a rewrite the full disk refused (said once, retried at each check)
        self._read_fd: int | None = None  # kept by close() for reading frames back (reading, release)

    def append(self, events: list[dict[str, Any]]) -> FrameInfo:
        """Write ``events`` as the next frame.  ``OSError``: the disk refused it, and the frame is
        held to be written by ``write_held`` (the events are taken either way) -- or an earlier
        held frame still cannot be written, and these events are not taken (a caller that calls
        ``write_held`` first never sees that)."""
        if self.held is not None:
            self.write_held()
        frame = encode_frame(self.seq, events)
        info = parse_frame_header(frame, self._end)  # before writing: never put a bad frame on disk
        steps = [e for e in events if e.get("kind") == "step"] if not info.flags & (FLAG_GRAPH | FLAG_SERIES) else []
        if steps:
            for pending in self._unseries.values():  # (a held frame is the next on the disk)
                pending.add(steps)
        if (info.seq == 0 or not info.flags and info.step_lo == NO_STEP) and self._kept_bytes < self.KEEP_BYTES:
            # (the first frame may hold step 0 too: kept without it, as no series frame covers it then)
            kept = encode_frame(info.seq, [e for e in events if e.get("kind") != "step"]) if steps else frame
            self._kept[info.seq] = kept
            self._kept_bytes += len(kept)
        self.held = frame
        self.write_held()
        return info

    def write_held(self) -> bool:
        """Write the frame the disk refused before, if any; ``OSError`` when it still cannot.
        Returns whether there was one."""
        frame = self.held
        if frame is None:
            return False
        offset = self._end
        try:
            self._write_at(frame, offset)
        except OSError:
            # cut the partial frame off again, so the file stays a clean frame chain (later frames
            # after a half frame would read as corruption); a retry writes over it anyway
            if self._regular:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._f.fileno(), offset)
            raise
        self.held = None
        self._placed(offset)
        self._end = offset + len(frame)
        self.seq += 1
        return True

    def _write_at(self, data: bytes, offset: int) -> None:
        fd = self._f.fileno()
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset) if self._regular else os.write(fd, view)
            if n <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view, offset = view[n:], offset + n

    def _placed(self, offset: int) -> None:
        """Note where frame ``seq`` lies."""
        if self.seq % self.MARK_EVERY == 0:
            self._marks.append(offset)
        self._recent.append(offset)
        if len(self._recent) >= 2 * self.RECENT_FRAMES:
            del self._recent[: self.RECENT_FRAMES]
            self._recent_base += self.RECENT_FRAMES

    @property
    def series_pending(self) -> int:
        """Step events appended and not yet in a series frame (of every part)."""
        return max(pending.n for pending in self._unseries.values())

    def append_series(self) -> None:
        """Write the series frames of the step events appended since the last ones: one frame
        per part of ``series.PARTS``, in that order.  A frame the disk refuses is held (``append``),
        and the parts after it wait for the next call, so a series frame always covers exactly
        the step frames between it and the previous series frame of its part."""
        self.write_held()  # (raises before any part's rows are taken)
        for part, pending in self._unseries.items():
            if pending.n:
                self._unseries[part] = _SeriesRows(part)
                self.append([pending.record()])

    # ------------------------------------------------------------------ the file under us
    def check(self) -> str | None:
        """Whether another program deleted or truncated the file during the run; if so, write it
        again and return one line saying what happened (None: nothing did).  One ``fstat`` and a
        read of the 16-byte header.

        Deleted (no name left): the whole run so far is still in the open file, and is copied to
        a new file at its path (beside it, when another file took the path).  Truncated (shorter
        than what was written): what was cut is gone; the file is written again from its
        header, with the frames kept in memory (the session event's, the script's), an empty
        frame for each frame lost (their seqs stay the run's, as the server has them), and a
        ``log`` warning saying so -- the run from there on stays readable."""
        if not self._regular or self._f.closed or self._unchecked:
            return None
        st = os.fstat(self._f.fileno())
        if st.st_nlink == 0:
            return self._recreate()
        # shorter than written, or cut and then written past by this writer (zeros where the
        # header was: `: > file` between two checks)
        if st.st_size < self._end or os.pread(self._f.fileno(), HEADER_SIZE, 0) != file_header():
            return self._rewrite(st.st_size)
        return None

    def _recreate(self) -> str:
        old = self._f
        target = self.path
        for n in range(1, 100):
            stem = self.path[: -len(".tscope")] if self.path.endswith(".tscope") else self.path
            target = self.path if n == 1 else f"{stem}-{n}.tscope"
            if not os.path.lexists(target):
                break
        tmp = f"{target}.{os.getpid()}.new"
        try:
            os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)  # (`rm -r` of its folder)
            with open(tmp, "wb") as new:
                pos = 0
                while pos < self._end:
                    chunk = os.pread(old.fileno(), min(1 << 20, self._end - pos), pos)
                    if not chunk:
                        break
                    new.write(chunk)
                    pos += len(chunk)
            os.link(tmp, target)  # never over a file that took the name meanwhile
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            self._unchecked = True
            return (f"torchscope: {self.path} was deleted during the run, and cannot be written again "
                    f"({exc.strerror or exc}): this run's recording is lost when it ends")
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        self._f = open(target, "r+b")  # noqa: SIM115 - lives as long as the writer
        old.close()
        was, self.path = self.path, target
        where = "at its path" if target == was else f"at {target} (another file took its name)"
        return (f"torchscope: {was} was deleted during the run; written again {where} with the whole run "
                "so far, and recording continues there")

    def _rewrite(self, size: int) -> str | None:
        lost = [k for k in range(self.seq) if k not in self._kept]
        fd = self._f.fileno()
        offsets: list[int] = []
        to = f", to {size:,} bytes" if size < self._end else ""  # (else: cut, then written past by this writer)
        note = encode_frame(lost[0], [{
            "kind": "log", "t": time.time(), "level": "warning",
            "message": (f"torchscope: this file was cut short during the run (by another program{to}); its frames {lost[0]}-{lost[-1]} were lost and are empty here: the run reads "
                        "on from the frame after them"),
        }]) if lost else b""
        parts = [file_header()]
        pos = HEADER_SIZE
        for k in range(self.seq):
            frame = self._kept.get(k) or (note if k == lost[0] else encode_frame(k, []))
            offsets.append(pos)
            parts.append(frame)
            pos += len(frame)
        data = b"".join(parts)
        try:
            self._write_at(data, 0)
            os.ftruncate(fd, len(data))
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                # a full disk: tried again at the next check (QA 53d: never retried, the file
                # stayed unreadable after the disk had room), said once
                said, self._rewrite_waits = self._rewrite_waits, True
                return None if said else (f"torchscope: {self.path} was cut short during the run (by another program), "
                                          "and the disk has no room to write it again yet: retried as it frees")
            self._unchecked = True
            return (f"torchscope: {self.path} was cut short during the run (by another program), and cannot "
                    f"be written again ({exc.strerror or exc}): it is unreadable")
        self._rewrite_waits = False
        self._end = len(data)
        self._marks = array("q", offsets[:: self.MARK_EVERY])
        self._recent_base = max(0, self.seq - self.RECENT_FRAMES)
        self._recent = array("q", offsets[self._recent_base :])
        # the step frames the series frames would cover are gone: the next ones start afresh
        self._unseries = {part: _SeriesRows(part) for part in series.PARTS}
        return (f"torchscope: {self.path} was cut short during the run (by another program); written again "
                f"from its header: the {len(lost):,} frames cut off are lost (said in the file), "
                "recording continues")

    @contextlib.contextmanager
    def reading(self) -> Iterator[_PositionalReader | BinaryIO]:
        """The file as this writer wrote it, to read frames back (the server's stream): through
        a duplicate of the writer's own descriptor, so a file moved (``mv``) or deleted during
        the run is still this run's -- opened by its name, the stream found nothing there and
        the run said its server was "not reachable (FileNotFoundError)" (QA 53d).  Read with
        ``os.pread`` (a duplicate shares its file offset with every other one: two buffered
        readers of it read each other's positions).  Only a file that is no regular one
        (opened write-only) is opened by its name."""
        fd: int | None = None
        if self._regular:
            with contextlib.suppress(OSError, ValueError):
                own = self._read_fd if self._f.closed else self._f.fileno()
                fd = os.dup(own) if own is not None else None
        if fd is None:
            with open(self.path, "rb") as f:
                yield f
            return
        try:
            yield _PositionalReader(fd)
        finally:
            os.close(fd)

    def spans(self, start: int) -> Iterator[tuple[int, int]]:
        """(file offset, bytes) of each frame written, from seq ``start`` on: the latest from
        memory, older ones from their headers in the file (a server that lost its data asks
        for them; at most MARK_EVERY headers are read to reach the first)."""
        if not 0 <= start < self.seq:
            return
        base = self._recent_base
        if start < base:  # older than the offsets in memory: their headers, from the file
            with self.reading() as f:
                offset = self._marks[start // self.MARK_EVERY]
                for _ in range(start % self.MARK_EVERY):
                    offset = self._after(f, offset)
                for _ in range(start, base):
                    nxt = self._after(f, offset)
                    yield offset, nxt - offset
                    offset = nxt
        recent = self._recent
        for k in range(max(start, base), self.seq):
            nxt = recent[k + 1 - base] if k + 1 < self.seq else self._end
            yield recent[k - base], nxt - recent[k - base]

    @staticmethod
    def _after(f: _PositionalReader | BinaryIO, offset: int) -> int:
        """The offset of the frame after the one at ``offset`` (its header says its length)."""
        f.seek(offset)
        return offset + FRAME_HEADER_SIZE + parse_frame_header(f.read(FRAME_HEADER_SIZE), offset).length

    def close(self, fsync: bool = True) -> None:
        if self._f.closed:
            return
        try:
            if self._regular and os.fstat(self._f.fileno()).st_size > self._end:
                os.ftruncate(self._f.fileno(), self._end)  # a frame cut off that could not be cut then
            self._f.flush()
            if fsync:
                os.fsync(self._f.fileno())
        finally:
            if self._regular and self._read_fd is None:
                # (the stream's last frames are read back after the file is closed: through a
                # descriptor of its own, the file moved or deleted meanwhile too; release())
                with contextlib.suppress(OSError, ValueError):
                    self._read_fd = os.dup(self._f.fileno())
            self._f.close()

    def release(self) -> None:
        """Close the descriptor ``close`` kept for reading frames back (the transport's last send)."""
        fd, self._read_fd = self._read_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def index(path: str | os.PathLike[str]) -> tuple[tuple[int, int], list[FrameInfo]]:
    """Walk frame headers only; return the format version and every whole frame.

    A torn tail (what a killed writer leaves: a frame cut short by the end of the file, a
    last frame failing its CRC, or zero bytes left by a crashed file system) ends the list
    silently: what came before it is the readable session.  Anything else that breaks the
    chain (a bad frame header or an out-of-order seq with real data after it) is corruption
    and raises ``SessionFileError``.  CRCs of earlier frames are checked when a frame is
    read, not here, so indexing costs one small read per frame.
    """
    name = os.fspath(path)
    with _open(path) as f:
        version = check_file_header(f.read(HEADER_SIZE), name)
        frames, damage, at = _walk(f, os.fstat(f.fileno()).st_size, crcs=False)
        if damage:
            raise SessionFileError(f"{name} is corrupt at byte {at}: {damage}")
        if frames and not _crc_ok(f, frames[-1]):
            frames.pop()  # a last frame whose bytes never all reached the disk
    return version, frames


def _walk(f: BinaryIO, size: int, crcs: bool) -> tuple[list[FrameInfo], str | None, int]:
    """The whole frames from the first on, each checked against its CRC when ``crcs``, up to the
    end, a torn tail, or damage: (the frames, what the damage is -- None for none or a torn
    tail --, the offset where the walk stopped)."""
    frames: list[FrameInfo] = []
    offset = HEADER_SIZE
    while offset + FRAME_HEADER_SIZE <= size:
        f.seek(offset)
        head = f.read(FRAME_HEADER_SIZE)
        try:
            info = parse_frame_header(head, offset)
            if info.seq != len(frames):
                raise SessionFileError(f"frame {len(frames)} is out of sequence")
        except SessionFileError as exc:
            return frames, None if _zeros_to_end(f, offset) else str(exc), offset
        end = offset + FRAME_HEADER_SIZE + info.length
        if end > size:
            # cut short by the end of the file (the writer was killed inside this frame): a torn
            # tail, unless a whole later frame follows -- then the length lies
            return frames, "bad frame length" if _later_frame(f, offset + FRAME_HEADER_SIZE, info.seq + 1) else None, offset
        if crcs and not _crc_streamed(f, offset + FRAME_HEADER_SIZE, info.length, _FRAME.unpack(head)[2]):
            # a last frame whose bytes never all reached the disk is a torn tail
            return frames, None if end == size or _zeros_to_end(f, end) else "frame checksum mismatch", offset
        frames.append(info)
        offset = end
    return frames, None, offset


def _open(path: str | os.PathLike[str]) -> BinaryIO:
    try:
        # a pipe (`torchscope info <(...)`, `... | torchscope info /dev/stdin`) cannot be read
        # by seeking from frame header to frame header: it read as "63 holds no complete frame",
        # and one with no writer hung the open (QA 36c)
        if stat.S_ISFIFO(os.stat(path).st_mode):
            raise SessionFileError(f"{path} is a pipe, not a session file: save it to a file and give that")
        # unbuffered: index() reads 40-byte headers between seeks, and a buffered reader
        # would pull 8 kB per header, i.e. most of a file of small frames
        return open(path, "rb", buffering=0)  # noqa: SIM115 - the caller closes it
    except FileNotFoundError:
        raise SessionFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SessionFileError(f"{path} is a directory, not a session file") from None
    except OSError as exc:
        raise SessionFileError(f"{path}: cannot read ({exc.strerror})") from None


def _zeros_to_end(f: BinaryIO, offset: int) -> bool:
    f.seek(offset)
    while chunk := f.read(1 << 20):
        if chunk.strip(b"\0"):
            return False
    return True


def _later_frame(f: BinaryIO, start: int, seq: int) -> bool:
    """Is there a whole, CRC-valid frame numbered ``seq`` after ``start``?  Only asked when a
    frame claims to run past the end of the file, so a torn tail costs one read of itself."""
    f.seek(start)
    # the next frame starts where this one really ends, at most one maximal frame away, and
    # itself spans at most one more: a bounded read even for a huge corrupt file
    rest = f.read(2 * (FRAME_HEADER_SIZE + MAX_FRAME_BYTES))
    pos = rest.find(FRAME_TAG)
    while pos >= 0:
        try:
            info = parse_frame_header(rest[pos : pos + FRAME_HEADER_SIZE])
        except SessionFileError:
            info = None
        if info is not None and info.seq == seq and pos + FRAME_HEADER_SIZE + info.length <= len(rest):
            payload = rest[pos + FRAME_HEADER_SIZE : pos + FRAME_HEADER_SIZE + info.length]
            if zlib.crc32(payload) == _FRAME.unpack(rest[pos : pos + FRAME_HEADER_SIZE])[2]:
                return True
        pos = rest.find(FRAME_TAG, pos + 1)
    return False


def _crc_ok(f: BinaryIO, info: FrameInfo) -> bool:
    f.seek(info.offset)
    raw = f.read(FRAME_HEADER_SIZE + info.length)
    return zlib.crc32(raw[FRAME_HEADER_SIZE:]) == _FRAME.unpack(raw[:FRAME_HEADER_SIZE])[2]


def read_frames(path: str | os.PathLike[str], frames: Iterable[FrameInfo]) -> Iterator[list[dict[str, Any]]]:
    """Decode the given frames (from ``index``); a frame that fails its CRC or does not
    decode raises ``SessionFileError`` naming its offset (``index`` already dropped a torn tail)."""
    name = os.fspath(path)
    with _open(path) as f:
        for info in frames:
            f.seek(info.offset)
            raw = f.read(FRAME_HEADER_SIZE + info.length)
            try:
                yield decode_payload(info, raw[FRAME_HEADER_SIZE:], raw)
            except SessionFileError as exc:
                raise SessionFileError(f"{name} is corrupt at byte {info.offset}: {exc}") from None


def iter_events(path: str | os.PathLike[str], frames: list[FrameInfo] | None = None) -> Iterator[dict[str, Any]]:
    """Every readable event of a session file, in order: the events of ``frames`` (default: the
    frames ``salvage`` keeps; ``torn_bytes`` says how many bytes it left out).  Series frames
    (1.1) are skipped: their records are derived from the step events, not events."""
    if frames is None:
        frames = salvage(path).frames
    for events in read_frames(path, [f for f in frames if not f.flags & FLAG_SERIES]):
        yield from events


def check_frames(path: str | os.PathLike[str], frames: Iterable[FrameInfo]) -> Iterator[FrameInfo]:
    """The given frames (from ``index``), each checked against its CRC but not decoded (a
    summary that only counts graph frames); a frame that fails raises ``SessionFileError``
    naming its offset, as ``read_frames`` does."""
    name = os.fspath(path)
    with _open(path) as f:
        for info in frames:
            if not _crc_ok(f, info):
                raise SessionFileError(f"{name} is corrupt at byte {info.offset}: frame checksum mismatch")
            yield info


def torn_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes after the last frame ``salvage`` keeps, which readers drop: a writer killed
    mid-write, a file cut short in transit, or everything from a damaged frame on."""
    return salvage(path).dropped


def no_frames(path: str | os.PathLike[str]) -> str:
    """Why a file with no whole frame has none, in one line: a header alone is a run that
    ended (or was killed) before its writer's first write; anything else is cut or damaged."""
    return _no_frames(os.fspath(path), os.path.getsize(path))


def _no_frames(name: str, size: int) -> str:
    if size == HEADER_SIZE:
        return (f"{name} holds no events: the run ended (or was killed) before its first write, within "
                "a fraction of a second of its first forward")
    return f"{name} holds no complete frame (truncated or corrupt)"


def raw_frames(path: str | os.PathLike[str], frames: Iterable[FrameInfo] | None = None) -> Iterator[bytes]:
    """The raw bytes (header + payload) of ``frames`` (default: every frame ``salvage`` keeps)
    — what an import sends to the store."""
    if frames is None:
        frames = salvage(path).frames
    with _open(path) as f:
        for info in frames:
            f.seek(info.offset)
            yield f.read(FRAME_HEADER_SIZE + info.length)


# ---------------------------------------------------------------------- salvage
@dataclass(frozen=True)
class Readable:
    """What the whole-file readers keep of a file (``salvage``): its whole frames, each
    checksum-valid, up to the first damaged one, and what they leave out."""

    version: tuple[int, int]
    frames: list[FrameInfo]
    size: int  # of the file
    damage: str | None = None  # why reading stopped before the end; None: the end, or a torn tail
    damage_at: int = -1  # the byte offset of the damaged frame

    @property
    def end(self) -> int:
        """The offset just past the last frame kept."""
        last = self.frames[-1] if self.frames else None
        return last.offset + FRAME_HEADER_SIZE + last.length if last else HEADER_SIZE

    @property
    def dropped(self) -> int:
        """Bytes after the last frame kept."""
        return max(self.size - self.end, 0)

    def error(self, name: str) -> str:
        """The one line of a file of which nothing could be kept."""
        if self.damage:
            return f"{name} is corrupt at byte {self.damage_at}: {self.damage}"
        return _no_frames(name, self.size)

    def note(self, name: str, writing: bool = False) -> str | None:
        """One line saying what readers left out, None when nothing: a file must never be read
        short silently.  ``writing``: its run is still writing it (``session.writer_alive``),
        so the bytes after its last whole frame are the frame being written, not a loss."""
        if writing and not self.damage:
            return (f"{name} is still being written (its run is going on): what it holds so far is read; "
                    "read it again for the rest") if self.dropped else None
        if self.damage:
            return (f"{name} is damaged at byte {self.damage_at:,} ({self.damage}): the {self.dropped:,} "
                    f"bytes from there to its end were dropped; the {len(self.frames):,} frame"
                    f"{'s' if len(self.frames) != 1 else ''} before it are read")
        if self.dropped:
            return (f"{name} is incomplete: the {self.dropped:,} bytes after its last whole frame were dropped "
                    "(the run was killed, or the file was cut short)")
        return None


_CRC_CHUNK = 1 << 20


def salvage(path: str | os.PathLike[str]) -> Readable:
    """The frames of a file that can be read, for the readers that read it whole (info, the
    doctor, an import): like ``index``, but every frame's checksum is checked as it goes (one
    pass over the file, 1 MiB at a time), and damage that is not a torn tail stops the walk
    instead of raising: the frames before the damaged one are kept, and ``Readable.damage``
    says why the rest is not.  The frames after it are not read even when they look whole:
    the seq chain (the store's key), the series frames' coverage of the step frames and the
    headers (outside the checksum) all assume an unbroken file, and a reader that skipped a
    frame would get a session no writer wrote.  Raises ``SessionFileError`` only for a file
    that is not a session file at all (missing, foreign, newer major version)."""
    name = os.fspath(path)
    with _open(path) as f:
        version = check_file_header(f.read(HEADER_SIZE), name)
        size = os.fstat(f.fileno()).st_size
        frames, damage, at = _walk(f, size, crcs=True)
    return Readable(version, frames, size, damage, at if damage else -1)


def _crc_streamed(f: BinaryIO, start: int, length: int, crc: int) -> bool:
    f.seek(start)
    value = 0
    while length > 0:
        chunk = f.read(min(length, _CRC_CHUNK))
        if not chunk:
            return False
        value = zlib.crc32(chunk, value)
        length -= len(chunk)
    return value == crc
