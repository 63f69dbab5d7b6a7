"""Health, the live SSE channel, and the HTML shell (templates from the dashboard team)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from .config import TOKEN_COOKIE, version
from .deps import SESSION_ID_PATTERN, HubDep, SessionId, SettingsDep, StoreDep
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


# /compare?a=<id>&b=<id>[&rank=N]: two runs side by side (frontend/compare.js).  The ids are
# checked as a session page's are; one absent or unknown is said on the page, not here.
CompareId = Annotated[str | None, Query(pattern=SESSION_ID_PATTERN)]


@router.get("/compare", response_class=HTMLResponse, include_in_schema=False)
def compare_page(request: Request, settings: SettingsDep, a: CompareId = None, b: CompareId = None,
                 rank: Annotated[int, Query(ge=0, le=65535)] = 0) -> Response:
    return _render("compare.html", request, settings.token, a=a or "", b=b or "", rank=rank)
