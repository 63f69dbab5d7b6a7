"""Uploads straight to disk: the multipart body of ``POST /api/sessions/import`` is parsed as
it arrives and its ``file`` part written to a private temporary directory under the data dir,
so an import never holds a whole session file in memory (FastAPI's ``UploadFile`` would spool
it to the system temp dir, often a RAM disk).  The body limit of ``security.py`` bounds it."""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool

try:  # the package's import name since python-multipart 0.0.13
    from python_multipart.multipart import MultipartParser, parse_options_header
except ImportError:  # pragma: no cover - older python-multipart
    from multipart.multipart import MultipartParser, parse_options_header  # type: ignore[no-redef]

from .security import BodyTooLarge

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


@contextlib.asynccontextmanager
async def received_file(request: Request, data_dir: Path) -> AsyncIterator[Path]:
    """The upload's ``file`` part as a file in a fresh directory under ``DATA/tmp``, removed
    on exit.  A body that is not such an upload answers 400, one over the limit 413."""
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise HTTPException(400, f"send the session file as multipart/form-data, field {FIELD!r}")
    root = data_dir / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    _sweep(root)
    workdir = Path(tempfile.mkdtemp(prefix="import-", dir=root))
    try:
        receiver = _Receiver()
        callbacks: Any = {name: getattr(receiver, name) for name in dir(receiver) if name.startswith("on_")}
        parser = MultipartParser(boundary, callbacks=callbacks)
        part = workdir / "upload"
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
        path = workdir / safe_name(receiver.filename)
        part.rename(path)
        yield path
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
