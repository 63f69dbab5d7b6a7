"""REST API over stored sessions (docs/architecture.md): one short function per endpoint."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from torchscope.sessionfile import FrameInfo, decode_frame, file_header

from .deps import SESSION_ID_PATTERN, HubDep, SessionId, SettingsDep, StoreDep, require_session
from .diagnostics import diagnostics as run_diagnostics
from .frames import BadFrames, Frame, file_frames, file_index
from .graphview import filter_graph
from .live import ingest_messages
from .models import Deleted, GraphIndexEntry, ImportResult, SessionDetail, SessionPatch, SessionSummary
from .store import NotFound, api_json
from .upload import OPENAPI_BODY, received_file

router = APIRouter(prefix="/api", tags=["sessions"])

RankQ = Annotated[int, Query(ge=0, le=65535)]
StepQ = Annotated[int | None, Query(ge=0, le=2**62)]
JSON = "application/json"

# Series of a finished session never change: cache them by the frame count they were built
# on, so reopening a 100,000-step run does not rebuild its columns.
_series_cache: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
_SERIES_CACHE_SIZE = 32
# /grads without a range on a 100,000-step run would decode every step's gradient columns
# (seconds, tens of MB): by default it samples this many steps evenly over the range
GRADS_MAX_STEPS = 1000
# An import is stored in batches of frames of about this many bytes: memory stays bounded
# whatever the file's size, and live ingest of other runs is not held up behind one huge job.
IMPORT_BATCH_BYTES = 8 * 1024 * 1024


def _cached(key: tuple[Any, ...], build: Any) -> bytes:
    if key in _series_cache:
        _series_cache.move_to_end(key)
        return _series_cache[key]
    value: bytes = build()
    _series_cache[key] = value
    if len(_series_cache) > _SERIES_CACHE_SIZE:
        _series_cache.popitem(last=False)
    return value


@router.get("/sessions", response_model=list[SessionSummary])
def list_sessions(store: StoreDep) -> list[dict[str, Any]]:
    return store.sessions()


@router.get("/sessions/{session_id}", response_model=SessionDetail)
def get_session(session_id: SessionId, store: StoreDep) -> dict[str, Any]:
    try:
        return store.session(session_id)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None


@router.patch("/sessions/{session_id}", response_model=SessionDetail)
async def patch_session(session_id: SessionId, patch: SessionPatch, store: StoreDep) -> dict[str, Any]:
    tags = None if patch.tags is None else [str(t)[:100] for t in patch.tags]
    if not await asyncio.wrap_future(store.update(session_id, patch.name, tags)):
        raise HTTPException(404, f"no session {session_id!r}")
    return store.session(session_id)


@router.delete("/sessions/{session_id}", response_model=Deleted)
async def delete_session(session_id: SessionId, store: StoreDep, hub: HubDep) -> Deleted:
    if not await asyncio.wrap_future(store.delete(session_id)):
        raise HTTPException(404, f"no session {session_id!r}")
    _series_cache.clear()
    hub.publish({"session": session_id, "kind": "deleted"})
    return Deleted(deleted=session_id)


@router.get("/sessions/{session_id}/steps", response_description="a list of StepEvent (torchscope.schema)")
def steps(session_id: SessionId, store: StoreDep, rank: RankQ = 0, start: StepQ = None, end: StepQ = None,
          limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
          offset: Annotated[int, Query(ge=0, le=2**40)] = 0) -> Response:
    require_session(store, session_id)
    return Response(store.steps_json(session_id, rank, start, end, limit, offset), media_type=JSON)


@router.get("/sessions/{session_id}/graphs", response_model=list[GraphIndexEntry])
def graphs(session_id: SessionId, store: StoreDep, rank: RankQ = 0) -> list[dict[str, Any]]:
    require_session(store, session_id)
    return store.graphs(session_id, rank)


@router.get("/sessions/{session_id}/graph", response_description="the GraphEvent (torchscope.schema)")
def graph(session_id: SessionId, store: StoreDep, step: Annotated[int, Query(ge=0, le=2**62)],
          rank: RankQ = 0, micro: Annotated[int | None, Query(ge=0, le=2**31)] = None,
          module: Annotated[str | None, Query(max_length=500, description="module path prefix")] = None,
          op: Annotated[list[str] | None, Query(max_length=50, description="op kinds, e.g. addmm")] = None,
          ) -> Response:
    require_session(store, session_id)
    raw = store.graph_frame(session_id, rank, step, micro)
    if raw is None:
        captured = sorted({g["step"] for g in store.graphs(session_id, rank)})
        shown = ", ".join(map(str, captured[:20])) + (" ..." if len(captured) > 20 else "")
        raise HTTPException(404, f"no graph captured at step {step} (rank {rank}); captured steps: {shown or 'none'}")
    events = decode_frame(raw)[1]
    ev = next((e for e in events if e.get("kind") == "graph" and e.get("step") == step
               and (micro is None or e.get("micro", 0) == micro)), None)
    if ev is None:  # the index points at a frame: it holds the event, unless the store is damaged
        raise HTTPException(404, f"no graph captured at step {step}")
    return Response(api_json(filter_graph(ev, module, op)), media_type=JSON)


@router.get("/sessions/{session_id}/memory",
            response_description="columns step, t, live, peak, params, grads, optimizer, saved, ... (torchscope.series)")
def memory(session_id: SessionId, store: StoreDep, rank: RankQ = 0) -> Response:
    require_session(store, session_id)
    # the columns were computed per step by torchscope.series.memory_series at ingest
    key = ("memory", session_id, rank, store.frame_count(session_id, rank))
    return Response(_cached(key, lambda: store.memory_json(session_id, rank)), media_type=JSON)


@router.get("/sessions/{session_id}/grads",
            response_description="params, steps and per-step columns aligned with params (torchscope.series); "
                                 "total_steps in the range and the stride sampled")
def grads(session_id: SessionId, store: StoreDep, rank: RankQ = 0, start: StepQ = None, end: StepQ = None,
          max_steps: Annotated[int, Query(ge=1, le=100_000, description=(
              "at most this many steps, evenly spaced over the range (every stride-th step); "
              "ask a narrower start/end for every step"))] = GRADS_MAX_STEPS) -> Response:
    from torchscope.series import grad_series

    require_session(store, session_id)
    meta = store.rank_meta(session_id, rank) or {}
    params = [p for p in meta.get("params", []) if isinstance(p, dict)]

    def build() -> bytes:
        parts, total, stride = store.step_parts(session_id, rank, "grads", start, end, max_steps)
        return api_json({**grad_series(parts, params), "total_steps": total, "stride": stride})

    key = ("grads", session_id, rank, store.frame_count(session_id, rank), start, end, max_steps)
    return Response(_cached(key, build), media_type=JSON)


@router.get("/sessions/{session_id}/diagnostics", response_description="a list of Finding (torchscope.schema)")
async def diagnostics(session_id: SessionId, store: StoreDep, hub: HubDep, rank: RankQ = 0) -> Response:
    require_session(store, session_id)
    findings, fresh = await run_in_threadpool(run_diagnostics, store, session_id, rank)
    if fresh:
        hub.publish({"session": session_id, "rank": rank, "kind": "finding", "count": len(findings)})
    return Response(api_json(findings), media_type=JSON)


@router.get("/sessions/{session_id}/export", response_class=StreamingResponse,
            response_description="the .tscope session file of one rank")
def export(session_id: SessionId, store: StoreDep, rank: RankQ = 0) -> StreamingResponse:
    try:
        version = store.file_version(session_id, rank)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None

    def body() -> Iterator[bytes]:
        yield file_header(version)
        yield from store.frames(session_id, rank)

    suffix = "" if rank == 0 else f".rank{rank}"
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in session_id)
    return StreamingResponse(body(), media_type="application/octet-stream",
                             headers={"Content-Disposition": f'attachment; filename="{safe}{suffix}.tscope"'})


def _identity(frames: list[Frame]) -> tuple[str, int]:
    """Session id and rank of a file: from its session event (the capture writes it first),
    else an id derived from its first frame."""
    fallback = "import-" + hashlib.sha256(frames[0].raw).hexdigest()[:16]
    for f in frames:
        for ev in f.events:
            if ev.get("kind") == "session":  # validated: a str id and an int rank, when present
                sid, rank = ev.get("session_id"), ev.get("rank", 0)
                if isinstance(sid, str) and re.match(SESSION_ID_PATTERN, sid) and 0 <= rank <= 65535:
                    return sid, rank
                return fallback, 0
    return fallback, 0


def _next_batch(frames: Iterator[Frame]) -> list[Frame]:
    batch: list[Frame] = []
    size = 0
    for f in frames:
        batch.append(f)
        size += len(f.raw)
        if size >= IMPORT_BATCH_BYTES:
            break
    return batch


def _checked(path: Path) -> tuple[tuple[int, int], list[FrameInfo], list[Frame], str, int]:
    """The first pass over an uploaded file: every frame read and validated, so a bad file
    leaves the store untouched.  It keeps the first batch (all of a file up to
    ``IMPORT_BATCH_BYTES``: one read) and the session's identity."""
    version, infos = file_index(path)
    frames = file_frames(path, infos)
    first = _next_batch(frames)
    for _ in frames:
        pass
    return version, infos, first, *_identity(first[:4])  # the capture writes the session event first


@router.post("/sessions/import", response_model=ImportResult, openapi_extra=OPENAPI_BODY,
             responses={400: {"description": "not a readable session file"}, 413: {"description": "over 4 GiB"}})
async def import_session(request: Request, store: StoreDep, hub: HubDep, settings: SettingsDep) -> ImportResult:
    """A ``.tscope`` file as multipart field ``file``: streamed to disk, checked, then stored
    frame by frame (batches of ``IMPORT_BATCH_BYTES``), never whole in memory."""
    async with received_file(request, settings.data_dir) as path:
        try:
            version, infos, batch, session_id, rank = await run_in_threadpool(_checked, path)
        except BadFrames as exc:
            raise HTTPException(400, str(exc)) from None
        before = next_seq = store.frame_count(session_id, rank)
        rest = file_frames(path, infos, start=len(batch))  # the second pass: valid, as the first showed
        while batch:
            res = await asyncio.wrap_future(store.ingest(session_id, rank, batch, imported=True, version=version))
            next_seq = res.next_seq
            for msg in ingest_messages(session_id, rank, [f.events for f in res.stored]):
                hub.publish(msg)
            batch = await run_in_threadpool(_next_batch, rest)
    if next_seq > before:
        request.app.state.schedule_diagnostics(session_id, rank)
    return ImportResult(id=session_id, url=f"/sessions/{session_id}", frames=next_seq,
                        new_frames=next_seq - before, rank=rank)
