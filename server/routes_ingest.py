"""The ingest protocol of docs/architecture.md: frames in order, duplicates ignored, a gap
answers 409 with the seq the server expects, a bad frame 400 with a one-line detail."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from .deps import HubDep, Rank, SessionId, StoreDep
from .frames import BadFrames, split_frames
from .live import ingest_messages
from .models import NextSeq

router = APIRouter(prefix="/api/ingest", tags=["ingest"])


@router.get("/{session_id}/{rank}/next", response_model=NextSeq)
async def next_seq(session_id: SessionId, rank: Rank, store: StoreDep) -> NextSeq:
    """The next frame seq the server expects (0 for a new session); also a heartbeat."""
    return NextSeq(next_seq=await asyncio.wrap_future(store.touch(session_id, rank)))


@router.post("/{session_id}/{rank}", response_model=NextSeq,
             responses={400: {"description": "a bad frame"}, 409: {"description": "gap: rewind to next_seq"}})
async def ingest(session_id: SessionId, rank: Rank, request: Request, store: StoreDep, hub: HubDep) -> JSONResponse:
    body = await request.body()
    if not body:
        raise HTTPException(400, "empty body: send one or more frames")
    try:
        # decoding is CPU work: keep it off the event loop so SSE and the API stay responsive
        frames = await run_in_threadpool(split_frames, body)
    except BadFrames as exc:
        raise HTTPException(400, str(exc)) from None
    res = await asyncio.wrap_future(store.ingest(session_id, rank, frames))
    for msg in ingest_messages(session_id, rank, [f.events for f in res.stored]):
        hub.publish(msg)
    if any(ev.get("kind") == "end" for f in res.stored for ev in f.events):
        request.app.state.schedule_diagnostics(session_id, rank)
    return JSONResponse({"next_seq": res.next_seq}, status_code=409 if res.gap else 200)
