"""The ingest protocol of docs/architecture.md: frames in order, duplicates ignored, a gap
answers 409 with the seq the server expects, a bad frame 400 with a one-line detail.  And
the other way frames come in: a session file imported (``POST /api/sessions/import``),
with its progress."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from .deps import HubDep, Rank, SessionId, SettingsDep, StoreDep
from .frames import BadFrames, Frame, split_frames
from .live import ingest_messages
from .models import ImportResult, NextSeq
from .store import RunConflict, SessionDeleted, Store
from .upload import OPENAPI_BODY, Imports, import_file, received_file

# The prefix is /api, not /api/ingest, so that the import is served here too.  app.py includes
# this router before routes_sessions's, whose older two-pass import handler this one replaces
# (it is never reached; to be removed there).
router = APIRouter(prefix="/api", tags=["ingest"])


async def get_imports(request: Request) -> Imports:
    """The app's imports in progress (made on first use: one per app; async, so on the event
    loop's thread, where no two requests make it at once)."""
    state = request.app.state
    if not hasattr(state, "imports"):
        state.imports = Imports()
    imports: Imports = state.imports
    return imports


ImportsDep = Annotated[Imports, Depends(get_imports)]


_DELETED = {"description": 'the session was deleted by a user: `{"detail": ..., "deleted": true}`; stop sending'}


def _gone(exc: SessionDeleted) -> JSONResponse:
    """The answer to a deleted session's run.  410, as for a rank that ended, but marked: on
    ``deleted`` the transport stops sending this run (it keeps recording to its file) instead of
    backing off and retrying, and says so once."""
    return JSONResponse({"detail": str(exc), "deleted": True}, status_code=410)


@router.get("/ingest/{session_id}/{rank}/next", response_model=NextSeq, responses={410: _DELETED})
async def next_seq(session_id: SessionId, rank: Rank, store: StoreDep) -> NextSeq | JSONResponse:
    """The next frame seq the server expects (0 for a new session); also a heartbeat."""
    try:
        return NextSeq(next_seq=await asyncio.wrap_future(store.touch(session_id, rank)))
    except SessionDeleted as exc:
        return _gone(exc)


@router.post("/ingest/{session_id}/{rank}", response_model=NextSeq,
             responses={400: {"description": "a bad frame"}, 409: {"description": "gap: rewind to next_seq"},
                        410: {"description": "the rank has ended: no frame but series frames goes after its end; "
                                             "or " + _DELETED["description"]}})
async def ingest(session_id: SessionId, rank: Rank, request: Request, store: StoreDep, hub: HubDep) -> JSONResponse:
    body = await request.body()
    if not body:
        raise HTTPException(400, "empty body: send one or more frames")
    try:
        # decoding is CPU work: keep it off the event loop so SSE and the API stay responsive
        frames = await run_in_threadpool(split_frames, body)
    except BadFrames as exc:
        raise HTTPException(400, str(exc)) from None
    _check_identity(session_id, frames)
    try:
        res = await asyncio.wrap_future(store.ingest(session_id, rank, frames))
    except RunConflict as exc:
        # not 409: to the transport a 409 means "rewind to next_seq", and it would resend these
        # frames until its deadline; any other refusal makes it back off and say why, once
        raise HTTPException(410, str(exc)) from None
    except SessionDeleted as exc:
        return _gone(exc)
    for msg in ingest_messages(session_id, rank, [f.events for f in res.stored]):
        hub.publish(msg)
    if any(ev.get("kind") == "end" for f in res.stored for ev in f.events):
        request.app.state.schedule_diagnostics(session_id, rank)
    elif res.stored and not res.ended:
        # a run going on is diagnosed too, now and then, and at once when it turns NaN/Inf: the
        # sessions list showed "none so far" for a NaN run until it ended (QA 51c)
        request.app.state.diagnose_live(session_id, rank, res.nonfinite)
    return JSONResponse({"next_seq": res.next_seq}, status_code=409 if res.gap else 200)


def _check_identity(session_id: str, frames: list[Frame]) -> None:
    """A 400 for a session event that names another session than the URL: stored under the
    URL's id, its export said the other one, and imported again it landed there (QA 53b).  The
    capture sends each run's frames under its session event's own id."""
    for n, f in enumerate(frames):
        for ev in f.events:
            if ev.get("kind") == "session" and "session_id" in ev and ev["session_id"] != session_id:
                raise HTTPException(400, f"frame {n}: its session event is of session {ev['session_id']!r}, "
                                         f"not {session_id!r} (the URL's)")


@router.get("/ingest/imports", response_description="per import in progress: name (the uploaded file's), "
            "total and done (bytes of frames read), stage (reading, then storing)")
def imports_in_progress(imports: ImportsDep) -> list[dict[str, Any]]:
    return imports.snapshot()


def _goes_on(store: Store, session_id: str, rank: int) -> bool:
    """An imported file whose run still writes it: unless its end is stored, the rank reads
    "running" (contact recorded now) while the file is imported again -- what `torchscope open`
    does until the run ends."""
    if store.ended(session_id, rank):
        return False
    store.touch(session_id, rank).result()
    return True


def _as_uploaded(exc: Exception, path: Path) -> str:
    """The reader's message with the upload's own name for the file: where the server keeps it
    while reading (its data folder) is no business of whoever sent it (QA 42b: the import
    dialog showed ``/srv/data/tmp/import-8d3batv2/notes.txt is not a torchscope session file``)."""
    return str(exc).replace(str(path), path.name)


@router.post("/sessions/import", tags=["sessions"], response_model=ImportResult, openapi_extra=OPENAPI_BODY,
             responses={400: {"description": "not a readable session file"},
                        409: {"description": "another run's frames are stored under the file's session id"},
                        413: {"description": "over 4 GiB"}})
async def import_session_file(request: Request, store: StoreDep, hub: HubDep, settings: SettingsDep,
                              imports: ImportsDep) -> ImportResult:
    """A ``.tscope`` file as multipart field ``file``: streamed to disk, then read once, frame
    by frame, in a worker thread (the event loop keeps serving); the session appears whole or,
    for a bad file, not at all."""
    async with received_file(request, settings.data_dir) as path:
        try:
            done = await run_in_threadpool(import_file, store, path, imports)
        except BadFrames as exc:
            raise HTTPException(400, _as_uploaded(exc, path)) from None
        except RunConflict as exc:
            raise HTTPException(409, _as_uploaded(exc, path)) from None
    for msg in done.messages:
        hub.publish(msg)
    going_on = done.writing and await run_in_threadpool(_goes_on, store, done.session_id, done.rank)
    if done.next_seq > done.before and not going_on:  # (a run going on: the doctor waits for its end or silence)
        request.app.state.schedule_diagnostics(done.session_id, done.rank)
    return ImportResult(id=done.session_id, url=f"/sessions/{done.session_id}", frames=done.next_seq,
                        new_frames=done.next_seq - done.before, rank=done.rank, note=done.note,
                        writing=done.writing, labeled=done.labeled)
