"""Imports of session files.  The upload: the multipart body of ``POST /api/sessions/import``
is parsed as it arrives and its ``file`` part written to a private temporary directory under
the data dir, so an import never holds a whole session file in memory (FastAPI's
``UploadFile`` would spool it to the system temp dir, often a RAM disk).  The body limit of
``security.py`` bounds it.  Then ``import_file`` reads it once, frame by frame, into a
``StagedImport`` next to it, and the store takes the staged session in one transaction."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
import re
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

try:  # the package's import name since python-multipart 0.0.13
    from python_multipart.multipart import MultipartParser, parse_options_header
except ImportError:  # pragma: no cover - older python-multipart
    from multipart.multipart import MultipartParser, parse_options_header  # type: ignore[no-redef]

from torchscope.series import PARTS
from torchscope.session import writer_alive
from torchscope.sessionfile import FRAME_HEADER_SIZE, FrameInfo, series_part

from . import labels
from .deps import valid_session_id
from .fileinfo import wrapped
from .frames import BadFrames, Frame, file_frames, file_index
from .live import ingest_messages
from .security import BodyTooLarge
from .store import RunConflict, StagedImport, Store, disk_full

FIELD = "file"
# What OpenAPI (/docs) shows for the body the route parses itself.
OPENAPI_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": [FIELD],
                    "properties": {FIELD: {"type": "string", "format": "binary"}},
                }
            }
        },
    }
}

_WRITE_BYTES = 1 << 20  # written to disk in pieces of about this size, off the event loop
_MAX_HEADER_BYTES = 16 * 1024  # a part's headers; a file name needs far less
_STALE_S = 24 * 3600  # an upload directory this old was left by a killed server


class _Receiver:
    """python-multipart callbacks: the first part named ``file`` goes to ``pending``, the
    bytes not yet written to ``out``."""

    def __init__(self) -> None:
        self.pending = bytearray()
        self.filename: str | None = None
        self.found = False
        self._in_file = False
        self._name = bytearray()  # of the header being read
        self._value = bytearray()
        self._disposition = b""

    def on_part_begin(self) -> None:
        self._disposition = b""
        self._in_file = False

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._name += data[start:end]
        self._check_size()

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]
        self._check_size()

    def _check_size(self) -> None:
        if len(self._name) + len(self._value) > _MAX_HEADER_BYTES:
            raise ValueError("part header too long")

    def on_header_end(self) -> None:
        if self._name.strip().lower() == b"content-disposition":
            self._disposition = bytes(self._value)
        self._name.clear()
        self._value.clear()

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        if options.get(b"name") == FIELD.encode() and not self.found:
            self._in_file = self.found = True
            self.filename = options.get(b"filename", b"").decode("utf-8", "replace")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._in_file:
            self.pending += data[start:end]

    def on_part_end(self) -> None:
        self._in_file = False


def safe_name(filename: str | None) -> str:
    """The upload's base name, reduced to characters safe in a path (it names the temporary
    file, so the reader's error messages name the user's file)."""
    base = re.split(r"[/\\]", filename or "")[-1]
    base = re.sub(r"[^A-Za-z0-9._ +=@()-]", "_", base).strip(" .")[:200]
    return base or "file"


def _sweep(root: Path) -> None:
    now = time.time()
    for old in root.glob("import-*"):
        with contextlib.suppress(OSError):
            if now - old.stat().st_mtime > _STALE_S:
                shutil.rmtree(old, ignore_errors=True)


async def _write(out: BinaryIO, receiver: _Receiver) -> None:
    data = bytes(receiver.pending)
    receiver.pending.clear()
    await run_in_threadpool(out.write, data)


async def _drain(request: Request) -> None:
    """Read the rest of a body that will not be stored: a client answered before it has sent
    it all sees its connection reset, not the answer."""
    with contextlib.suppress(BodyTooLarge, ClientDisconnect, RuntimeError):  # RuntimeError: read already
        async for _ in request.stream():
            pass


@contextlib.asynccontextmanager
async def received_file(request: Request, data_dir: Path) -> AsyncIterator[Path]:
    """The upload's ``file`` part as a file in a fresh directory under ``DATA/tmp``, removed
    on exit.  A body that is not such an upload answers 400, one over the limit 413, one the
    disk has no room for 507 (once the body is read: the client then reads the answer)."""
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise HTTPException(400, f"send the session file as multipart/form-data, field {FIELD!r}")
    root = data_dir / "tmp"
    workdir: Path | None = None
    try:
        try:
            root.mkdir(parents=True, exist_ok=True)
            _sweep(root)
            workdir = Path(tempfile.mkdtemp(prefix="import-", dir=root))
            part = workdir / "upload"
            name = await _receive(request, part, boundary)
        except OSError as exc:
            if (full := disk_full(exc, root)) is None:
                raise
            await _drain(request)
            raise HTTPException(507, str(full)) from None
        path = workdir / name
        part.rename(path)
        yield path
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


async def _receive(request: Request, part: Path, boundary: bytes) -> str:
    """The body's ``file`` part written to ``part``; its safe name."""
    receiver = _Receiver()
    callbacks: Any = {name: getattr(receiver, name) for name in dir(receiver) if name.startswith("on_")}
    parser = MultipartParser(boundary, callbacks=callbacks)
    with open(part, "wb") as out:
        try:
            async for chunk in request.stream():
                parser.write(chunk)
                if len(receiver.pending) >= _WRITE_BYTES:
                    await _write(out, receiver)
            parser.finalize()
        except BodyTooLarge as exc:
            raise HTTPException(413, f"request body over the {exc.limit} byte limit") from None
        except ValueError:  # python-multipart's parse errors are ValueErrors
            raise HTTPException(400, "the upload is not valid multipart/form-data") from None
        await _write(out, receiver)
    if not receiver.found:
        raise HTTPException(400, f"the upload has no {FIELD!r} field")
    return safe_name(receiver.filename)


# ---------------------------------------------------------------------- reading it into the store
# Frames are read and staged in batches of about this many bytes: memory holds one batch,
# whatever the file's size.
IMPORT_BATCH_BYTES = 1024 * 1024
# the capture writes a series frame per part after the frames they cover, this part's last
_LAST_PART = list(PARTS)[-1]


@dataclass
class ImportProgress:
    """One import in progress, as ``GET /api/ingest/imports`` shows it: bytes of frames read
    into the staging database out of the file's; ``stage`` "reading" then "storing" (the
    staged session copied into the store)."""

    name: str
    total: int
    done: int = 0
    stage: str = "reading"


class Imports:
    """The imports in progress on this server (written by the importing threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, ImportProgress] = {}

    @contextlib.contextmanager
    def track(self, progress: ImportProgress) -> Iterator[ImportProgress]:
        with self._lock:
            self._running[id(progress)] = progress
        try:
            yield progress
        finally:
            with self._lock:
                del self._running[id(progress)]

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [vars(p).copy() for p in self._running.values()]


@dataclass
class Imported:
    session_id: str
    rank: int
    before: int  # frames of this rank the store held already
    next_seq: int
    note: str | None = None  # what of the file was dropped (``Readable.note``): a torn tail, damage
    writing: bool = False  # its run is still writing it, on this host (``session.writer_alive``)
    labeled: bool = False  # the file's name and tags (a download's labels) were given to the session
    # what the browsers are told once it is stored: the last session/graph/step/end message
    messages: list[dict[str, Any]] = field(default_factory=list)


def _identity(frames: list[Frame]) -> tuple[str, int]:
    """Session id and rank of a file: from its session event (the capture writes it first),
    else an id derived from its first frame."""
    fallback = "import-" + hashlib.sha256(frames[0].raw).hexdigest()[:16]
    for f in frames:
        for ev in f.events:
            if ev.get("kind") == "session":  # validated: a str id and an int rank, when present
                sid, rank = ev.get("session_id"), ev.get("rank", 0)
                if valid_session_id(sid) and 0 <= rank <= 65535:
                    return sid, rank
                return fallback, 0
    return fallback, 0


def _writing(frames: list[Frame]) -> bool:
    """Whether the process that writes this file still runs here (its session event's pid and
    start time): the bytes after its last whole frame are the frame being written."""
    session = next((ev for f in frames for ev in f.events if ev.get("kind") == "session"), None)
    return session is not None and writer_alive(session)


def _batches(frames: Iterator[Frame]) -> Iterator[list[Frame]]:
    """Frames in batches of about ``IMPORT_BATCH_BYTES``, each ending, where the file has them,
    with the series frames of its steps (the store then takes the steps' columns from them)."""
    while True:
        batch: list[Frame] = []
        size = 0
        for f in frames:
            batch.append(f)
            size += len(f.raw)
            # (a file without series frames: batches of at most twice the size)
            if size >= IMPORT_BATCH_BYTES and (series_part(f.info) == _LAST_PART or size >= 2 * IMPORT_BATCH_BYTES):
                break
        if not batch:
            return
        yield batch


def _last_messages(imported: Imported, frames: list[Frame]) -> None:
    """Keep, per kind, the latest live message of these frames: one import is one update for
    the browsers (thousands of messages at once would overflow their queues)."""
    latest = {m["kind"]: m for m in imported.messages}
    for msg in ingest_messages(imported.session_id, imported.rank, [f.events for f in frames]):
        latest.pop(msg["kind"], None)
        latest[msg["kind"]] = msg
    imported.messages = list(latest.values())


class _CollectorPause:
    """Python's cyclic garbage collector paused while any import runs.  An import allocates
    millions of containers (each step event's dicts and lists), and every full collection
    walks all of them alive at the time: a third of a 100,000-step import.  They hold no
    reference cycles, so reference counting frees them as they go; other threads' cyclic
    garbage waits for the end of the imports (the last one to finish turns it back on)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._was_enabled = False

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            self._running += 1
            if self._running == 1:
                self._was_enabled = gc.isenabled()
                gc.disable()
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                if self._running == 0 and self._was_enabled:
                    gc.enable()


_collector_paused = _CollectorPause()


def import_file(store: Store, path: Path, imports: Imports) -> Imported:
    """Read a session file on disk into the store, decoding each frame once.  A new rank is
    staged next to the file and committed whole; a rank the store holds already gets the
    frames it lacks, after the whole file was checked and found to be the same run.  Raises
    ``BadFrames`` or ``RunConflict`` (nothing stored)."""
    if (why := wrapped(path, path.name)) is not None:  # a .tscope.gz from an e-mail: the fix, not "not a session file"
        raise BadFrames(why)
    with _collector_paused():
        found = file_index(path)
        # a download's name and tags (its last frames: labels.py) are applied, not stored
        infos, given = labels.split(path, found.frames)
        version = found.version
        total = sum(FRAME_HEADER_SIZE + info.length for info in infos)
        with imports.track(ImportProgress(path.name, total)) as progress:
            batches = _batches(file_frames(path, infos))
            first = next(batches)
            imported = Imported(*_identity(first[:4]), 0, 0)  # the capture writes the session event first
            imported.writing = _writing(first[:4])
            imported.note = found.note(path.name, imported.writing)
            imported.before = store.frame_count(imported.session_id, imported.rank)
            if imported.before == 0 and _staged(store, path, version, itertools.chain([first], batches),
                                                imported, progress):
                _label(store, imported, given)
                return imported
            if imported.before:  # another run's frames under this id: said now, not after reading it all
                _check_same_run(store, path, imported, infos, imported.before)
            for batch in batches:  # a rank stored already: the file checked to the end first
                progress.done += sum(len(f.raw) for f in batch)
            progress.stage = "storing"
            _ingest_missing(store, path, imported, version, infos)
            _label(store, imported, given)
            return imported


def _label(store: Store, imported: Imported, given: tuple[str | None, list[str] | None] | None) -> None:
    """The name and tags a downloaded file carries, given to its session as a PATCH gives them
    (the file is imported after any rename here: the last one wins); the browsers told."""
    if given is None or given == (None, None):
        return
    store.update(imported.session_id, *given).result()
    imported.labeled = True
    if not any(m.get("kind") == "session" for m in imported.messages):
        imported.messages.append({"session": imported.session_id, "rank": imported.rank, "kind": "session"})


def _staged(store: Store, path: Path, version: tuple[int, int], batches: Iterator[list[Frame]],
            imported: Imported, progress: ImportProgress) -> bool:
    """A new rank: every frame ingested into a ``StagedImport`` next to the file, then
    committed whole.  False when the rank was stored meanwhile (nothing committed)."""
    staged = StagedImport(path.with_name(path.name + ".staged"), imported.session_id, imported.rank, version)
    try:
        for batch in batches:
            staged.add(batch)
            _last_messages(imported, batch)
            progress.done += sum(len(f.raw) for f in batch)
        progress.stage = "storing"
        res = store.commit_staged(staged, imported.writing).result()
    finally:
        staged.close()
    if res is None:
        return False
    imported.next_seq = res.next_seq
    return True


def _ingest_missing(store: Store, path: Path, imported: Imported, version: tuple[int, int],
                    infos: list[FrameInfo]) -> None:
    """The frames of a checked file that the store's rank lacks, ingested as a live run's, once
    the file is known to be the same run (``_check_same_run``)."""
    start = store.frame_count(imported.session_id, imported.rank)
    if start != imported.before:  # (checked already as it was; a live writer or an import since)
        _check_same_run(store, path, imported, infos, start)
    imported.next_seq = start
    for batch in _batches(file_frames(path, infos, start=start)):
        res = store.ingest(imported.session_id, imported.rank, batch, imported=True, version=version).result()
        imported.next_seq = res.next_seq
        _last_messages(imported, res.stored)


def _check_same_run(store: Store, path: Path, imported: Imported, infos: list[FrameInfo], stored: int) -> None:
    """Raise ``RunConflict`` unless the file is the run the store's rank holds ``stored``
    frames of: the same frames where both have them (compared by header, whose CRC covers the
    payload: the wire and the file carry the same bytes), and, if that run's end is stored, no
    frame after it but the series frames its writer puts there.  A session id names one run;
    a different file claiming it (a crafted one, a reused id) would otherwise be spliced onto
    it, after its end."""
    where = f"session {imported.session_id} rank {imported.rank}"
    with open(path, "rb") as f:
        for info, head in zip(infos, store.frame_headers(imported.session_id, imported.rank, stored), strict=False):
            f.seek(info.offset)
            if f.read(FRAME_HEADER_SIZE) != head:
                raise RunConflict(f"{path.name}: another run with the same session id is already stored "
                                  f"({where}: its frame {info.seq} differs from the file's)")
    extra = next((info for info in infos[stored:] if series_part(info) is None), None)
    if extra is not None and store.ended(imported.session_id, imported.rank):
        raise RunConflict(f"{path.name}: another run with the same session id is already stored ({where} "
                          "has ended, and the file goes on after its end)")
