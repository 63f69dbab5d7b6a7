"""REST API over stored sessions (docs/architecture.md): one short function per endpoint."""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from torchscope.sessionfile import decode_frame, file_header

from . import labels
from .deps import HubDep, SessionId, StoreDep, require_session
from .diagnostics import diagnostics as run_diagnostics
from .graphview import filter_graph
from .models import Deleted, GraphIndexEntry, SessionDetail, SessionPatch, SessionSummary
from .store import NotFound, api_json

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
    if patch.tags is not None and not all(isinstance(t, str) for t in patch.tags):
        # (the model takes any JSON so that this says it in one line, not pydantic's error list)
        raise HTTPException(422, "tags: every tag must be a string")
    name = None if patch.name is None else patch.name.strip()
    if name is not None and not name.strip(_INVISIBLE):  # a blank link on the sessions page (QA 48d, 48e)
        raise HTTPException(422, "name: a name needs a character that is not a space")
    # each tag as a name is taken: stripped, and a blank one refused (QA 52a: ["a", ""] stored an
    # empty tag, while a blank name is refused)
    tags = None if patch.tags is None else [t.strip()[:100] for t in patch.tags]
    if tags is not None and not all(t.strip(_INVISIBLE) for t in tags):
        raise HTTPException(422, "tags: a tag needs a character that is not a space")
    if tags is not None and not all(_unicode(t) for t in tags):  # a lone surrogate: JSON lets it through
        raise HTTPException(422, "tags: a tag holds text that is not valid Unicode")
    if not await asyncio.wrap_future(store.update(session_id, name, tags)):
        raise HTTPException(404, f"no session {session_id!r}")
    return store.session(session_id)


_INVISIBLE = labels.INVISIBLE  # (str.strip() keeps the zero-width ones)


def _unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


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
def graph(request: Request, session_id: SessionId, store: StoreDep, step: Annotated[int, Query(ge=0, le=2**62)],
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
    # the graph view and the memory view each ask for a step's graph (tens of MB of JSON on a
    # big model, QA 46c): the browser keeps it and asks again with its tag, answered without
    # a body while the stored frame is the same
    digest = hashlib.blake2b(raw, digest_size=12)
    digest.update(request.url.query.encode())  # (a module or op filter: another body)
    tag = f'"{digest.hexdigest()}"'
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if tag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    events = decode_frame(raw)[1]
    ev = next((e for e in events if e.get("kind") == "graph" and e.get("step") == step
               and (micro is None or e.get("micro", 0) == micro)), None)
    if ev is None:  # the index points at a frame: it holds the event, unless the store is damaged
        raise HTTPException(404, f"no graph captured at step {step}")
    return Response(api_json(filter_graph(ev, module, op)), media_type=JSON, headers=headers)


@router.get("/sessions/{session_id}/memory",
            response_description="columns step, t, live, peak, params, grads, optimizer, saved, ... (torchscope.series)")
def memory(session_id: SessionId, store: StoreDep, rank: RankQ = 0, start: StepQ = None) -> Response:
    require_session(store, session_id)
    # the columns were computed per step by torchscope.series.memory_series at ingest; ``start``:
    # the steps from there on only (a live chart asks for those after the ones it has)
    key = ("memory", session_id, rank, store.frame_count(session_id, rank), start)
    return Response(_cached(key, lambda: store.memory_json(session_id, rank, start)), media_type=JSON)


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


@router.get("/sessions/{session_id}/loss",
            response_description="columns step and loss (every step of the range; NaN/Infinity as strings, "
                                 "null: no loss), lr (each param group's learning rate per step; null: no "
                                 "optimizer) and nonfinite: the steps whose loss was NaN or infinite")
def loss(session_id: SessionId, store: StoreDep, rank: RankQ = 0, start: StepQ = None,
         end: StepQ = None) -> Response:
    require_session(store, session_id)
    # a few bytes a step, not the whole step event: the loss chart reads every step of a
    # 100,000-step run (sampling could skip the one NaN), a live one only the steps after its last
    key = ("loss", session_id, rank, store.frame_count(session_id, rank), start, end)
    return Response(_cached(key, lambda: api_json(store.loss_series(session_id, rank, start, end))),
                    media_type=JSON)


@router.get("/sessions/{session_id}/metrics",
            response_description="each name torchscope.log() recorded -> columns step and value (in step order; "
                                 "NaN/Infinity as strings)")
def metrics(session_id: SessionId, store: StoreDep, rank: RankQ = 0, start: StepQ = None) -> Response:
    require_session(store, session_id)
    key = ("metrics", session_id, rank, store.frame_count(session_id, rank), start)
    return Response(_cached(key, lambda: api_json(store.metric_series(session_id, rank, start))), media_type=JSON)


@router.get("/sessions/{session_id}/diagnostics", response_description="a list of Finding (torchscope.schema)")
async def diagnostics(request: Request, session_id: SessionId, store: StoreDep, hub: HubDep,
                      rank: RankQ = 0) -> Response:
    require_session(store, session_id)
    findings, fresh, behind = await run_in_threadpool(run_diagnostics, store, session_id, rank)
    if fresh:
        hub.publish({"session": session_id, "rank": rank, "kind": "finding", "count": len(findings)})
    elif behind:
        # another run's doctor held the lock: this rank's turn comes right after it, and its
        # "finding" event reloads the page (it used to wait for a poll that found the lock
        # free: a NaN on one of two live runs reached its page ~12 s late, QA 37d)
        request.app.state.schedule_diagnostics(session_id, rank)
    return Response(api_json(findings), media_type=JSON)


@router.get("/sessions/{session_id}/export", response_class=StreamingResponse,
            response_description="the .tscope session file of one rank")
def export(session_id: SessionId, store: StoreDep, rank: RankQ = 0) -> StreamingResponse:
    try:
        version = store.file_version(session_id, rank)
        # a name or tags given here go with the file, as its last frame (labels.py); none: the
        # stored frames, byte for byte
        extra = labels.to_append(store.session(session_id))
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None

    def body() -> Iterator[bytes]:
        yield file_header(version)
        seq = 0
        for raw in store.frames(session_id, rank):
            seq += 1
            yield raw
        if extra is not None:  # numbered on from the frames sent (a live run's may have grown meanwhile)
            yield labels.labels_frame(seq, *extra)

    suffix = "" if rank == 0 else f".rank{rank}"
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in session_id)
    return StreamingResponse(body(), media_type="application/octet-stream",
                             headers={"Content-Disposition": f'attachment; filename="{safe}{suffix}.tscope"'})
