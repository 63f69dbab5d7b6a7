"""Health, the live SSE channel, and the HTML shell (templates from the dashboard team)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from .config import MAX_COMPARE, TOKEN_COOKIE, version
from .deps import DOTS_ALONE, SESSION_ID_PATTERN, HubDep, SessionId, SettingsDep, StoreDep, valid_session_id
from .models import Health
from .store import WRITER_DEAD

router = APIRouter()
TEMPLATES = Path(__file__).resolve().parent / "templates"
_env: Any = None


def _render(name: str, request: Request, token: str | None, **context: Any) -> Response:
    global _env
    if not (TEMPLATES / name).is_file():
        # the dashboard's templates ship with the package; a checkout without them still answers
        return HTMLResponse(f"<!doctype html><title>torchscope</title><p>torchscope {version()}: the dashboard "
                            f"template {name} is not installed. The API is at <a href='/docs'>/docs</a>.</p>",
                            status_code=503)
    if _env is None:
        import jinja2

        _env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True)
    html = _env.get_template(name).render(token=token or "", version=version(), **context)
    resp = HTMLResponse(html)
    if token and request.query_params.get("token") == token:
        # the browser keeps the token so the page's own API calls and SSE carry it
        resp.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
    return resp


@router.get("/api/health", response_model=Health, tags=["server"], response_model_exclude_none=True,
            responses={503: {"model": Health, "description": "the store's writer stopped: writes cannot be stored"}})
def health(store: StoreDep) -> Any:
    if not store.writer_alive:
        return JSONResponse(Health(ok=False, version=version(), error=WRITER_DEAD).model_dump(), status_code=503)
    return Health(ok=True, version=version(), error=None)


@router.get("/api/live", tags=["server"], response_class=StreamingResponse,
            response_description='Server-Sent Events: data: {"session", "rank", "kind", "step"}')
def live(hub: HubDep) -> StreamingResponse:
    return StreamingResponse(hub.stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def index(request: Request, settings: SettingsDep) -> Response:
    return _render("index.html", request, settings.token)


@router.get("/sessions/{session_id}", response_class=HTMLResponse, include_in_schema=False)
def session_page(session_id: SessionId, request: Request, settings: SettingsDep) -> Response:
    return _render("session.html", request, settings.token, session_id=session_id)


# /compare: two to eight runs side by side (frontend/compare.js).  The runs are named by the
# letters a, b, c, ... (in letter order: today's ?a=&b= links keep their meaning, and a QA sweep
# link ?a=&b=&c=&d=&e= shows all five, not A and B silently) and then by ?runs=<id>,<id>,...
# (the compact form, for a sweep's list of ids and the sessions page's "Compare" button).
# Each id is checked as a session page's is (an ill-formed one: 422, as before; a browser gets
# a sentence, app.py); an id named twice is compared once (a run against itself, as A and B,
# showed two identical lines), and the page says which were; past MAX_COMPARE the rest are passed
# on as left out, with their names, and the page says which (never silently).
# One absent or unknown is said on the page, not here.
CompareId = Annotated[str | None, Query(pattern=SESSION_ID_PATTERN)]


def _compare_ids(request: Request, runs: str | None) -> list[str]:
    """The ids named by the query's single-letter parameters (a..z in letter order) and then by
    ``runs``, in that order; a malformed one raises the 422 a malformed ``a`` gets."""
    q = request.query_params
    named = [(k, q[k]) for k in sorted(q) if len(k) == 1 and "a" <= k <= "z"]
    named += [("runs", x.strip()) for x in (runs or "").split(",") if x.strip()]
    bad = [{"type": "string_pattern_mismatch", "loc": ("query", k), "input": v,
            "msg": DOTS_ALONE if v and not v.strip(".") else f"String should match pattern '{SESSION_ID_PATTERN}'"}
           for k, v in named if not valid_session_id(v)]
    if bad:
        raise RequestValidationError(bad)
    return [v for _, v in named if v]


@router.get("/compare", response_class=HTMLResponse, include_in_schema=False)
def compare_page(request: Request, settings: SettingsDep, store: StoreDep, a: CompareId = None, b: CompareId = None,
                 runs: Annotated[str | None, Query(max_length=20_000)] = None,
                 rank: Annotated[int, Query(ge=0, le=65535)] = 0) -> Response:
    named = _compare_ids(request, runs)
    times = Counter(named)
    ids = list(times)  # each run once, where it was first named
    repeated = [i for i in ids if times[i] > 1]
    left_out = ids[MAX_COMPARE:]
    # the runs left out by their names (QA 52a: their ids alone, "3aeaa1ee6ec34ecd", said not which
    # runs they were); an id no session has is null, and the page names it as given
    names = store.names(left_out) if left_out else {}
    # (a and b are passed on as given: with fewer than two runs the page says which one is missing)
    return _render("compare.html", request, settings.token, a=a or "", b=b or "", rank=rank,
                   runs=",".join(ids[:MAX_COMPARE]), left_out=",".join(left_out), max_runs=MAX_COMPARE,
                   left_out_names=json.dumps([names.get(i) for i in left_out]), repeated=",".join(repeated))
