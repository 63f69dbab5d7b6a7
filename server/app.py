"""The FastAPI application: store, live hub, routers, static dashboard, security."""

from __future__ import annotations

import asyncio
import html
import json
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path, PurePath
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES, GZipMiddleware
from starlette.types import Scope

from .config import RUNNING_TIMEOUT_S, SILENT_SWEEP_S, Settings, is_loopback, version
from .diagnostics import DoctorQueue, stop_children
from .live import LiveHub
from .routes_ingest import router as ingest_router
from .routes_pages import router as pages_router
from .routes_sessions import router as sessions_router
from .security import SecurityMiddleware
from .store import DiskFull, Store, StoreClosed, disk_full

log = logging.getLogger("torchscope.server")
GZIP_MIN_BYTES = 1024  # a smaller body gains less than the header and the CPU cost


def _frontend_dir() -> Path:
    import torchscope.frontend

    return Path(torchscope.frontend.__file__).resolve().parent


class FrontendFiles(StaticFiles):
    """The dashboard's files under /static.  Its folder is a Python package (``torchscope.frontend``,
    so that it installs with torchscope): its ``__init__.py`` and compiled files are no part of
    the dashboard and are not served."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        name = PurePath(path)
        if name.suffix.lower() in (".py", ".pyc", ".pyo") or "__pycache__" in name.parts:
            raise StarletteHTTPException(404)
        return await super().get_response(path, scope)


async def _sweep(app: FastAPI, schedule: Callable[[str, int], None]) -> None:
    """Ranks that are over but undiagnosed get queued for the doctor: at startup, what a server
    stopped before its queue was drained left (ended runs and imports included); then every
    SILENT_SWEEP_S, runs killed mid-way, which send no end event (the event that starts a
    diagnosis), once their writer has been silent for RUNNING_TIMEOUT_S ("ended
    unexpectedly").  Each set of frames once: a doctor that failed is not retried on them.
    The change of status is published on the live channel, as ingest publishes an end."""
    tried: dict[tuple[str, int], int] = {}
    told: set[tuple[str, int]] = set()
    while True:
        try:
            store: Store = app.state.store
            before = time.time() - RUNNING_TIMEOUT_S
            silent = set(store.silent(before))
            for key in silent - told:  # open pages learn that "running" is over
                app.state.hub.publish({"session": key[0], "rank": key[1], "kind": "status", "status": "ended unexpectedly"})
            told = silent  # a writer heard from again is told about afresh when it goes silent
            for key in store.undiagnosed(before):
                frames = store.frame_count(*key)
                if tried.get(key) != frames:
                    tried[key] = frames
                    schedule(*key)
        except Exception:  # the sweep must not end the server; the next one tries again
            log.exception("torchscope: looking for runs to diagnose failed")
        await asyncio.sleep(SILENT_SWEEP_S)


def _json_error(status: int, detail: Any) -> Response:
    # ASCII JSON: a lone surrogate from the request is escaped, not an encoding error
    return Response(json.dumps({"detail": detail}, ensure_ascii=True, default=str), status_code=status,
                    media_type="application/json")


def _page_load(request: Request) -> bool:
    """A browser opening one of the dashboard's pages (a person reads the answer), not the API's
    or a page's own request for data."""
    return "text/html" in request.headers.get("accept", "") and not request.url.path.startswith(("/api/", "/static/"))


def _page(status: int, title: str, message: str) -> HTMLResponse:
    """A page of one notice (``message``: HTML, its data escaped by the caller) in the dashboard's style."""
    return HTMLResponse("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                        f"<title>{html.escape(title)} · torchscope</title><link rel=\"stylesheet\" href=\"/static/style.css\">"
                        f"</head><body><main><div class=\"notice error\" id=\"fatal\" role=\"alert\">{message}</div>"
                        "</main></body></html>", status_code=status)


# the parameters that name a session: the id in a page's path, and the Compare page's ids
_ID_PARAMS = {"session_id", "runs", *"abcdefghijklmnopqrstuvwxyz"}


def _said(error: Any) -> str:
    """One sentence for a browser of an address's part the routes refuse: an ill-formed session
    id as an unknown one is said (the Compare page's "No session ..."), with what an id may hold;
    anything else its parameter and pydantic's message."""
    loc = [str(x) for x in error.get("loc", ())]
    what = loc[-1] if loc else ""
    given = str(error.get("input", "")).encode("utf-8", "replace").decode()  # (a lone surrogate: not UTF-8)
    shown = given if len(given) <= 80 else given[:77] + "..."
    if error.get("type") == "string_pattern_mismatch" and what in _ID_PARAMS:
        return (f"No session \"{shown}\" on this server: that is not a session id (an id is 1 to 200 letters, "
                "digits and . _ : @ + = -, never a space or a /).")
    return f"{what or 'the address'}: {error.get('msg', 'not understood')}."


def _add_error_handlers(app: FastAPI, data_dir: Path) -> None:
    """Errors that are no bug of the server answer a one-line detail, not a 500."""

    async def full(request: Request, exc: Exception) -> Response:
        err = disk_full(exc, data_dir)
        if err is None:
            raise exc
        log.error("torchscope: %s %s: %s", request.method, request.url.path, err)
        return _json_error(507, str(err))

    async def closed(request: Request, exc: Exception) -> Response:
        return _json_error(503, str(exc))

    async def invalid(request: Request, exc: Exception) -> Response:
        # FastAPI's own handler echoes each error's input back, which fails on what JSON cannot
        # hold (NaN, a lone surrogate): the errors' place and message only
        assert isinstance(exc, RequestValidationError)
        if _page_load(request):  # a person reads it: sentences, not the API's error list (QA 52a)
            said = " ".join(_said(e) for e in exc.errors())
            return _page(422, "Bad address", f"{html.escape(said)} <a href=\"/\">All sessions</a>")
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                  for e in exc.errors()]
        return _json_error(422, errors)

    async def not_found(request: Request, exc: Exception) -> Response:
        # a page a browser asked for that is not there (a mistyped address): a page saying so,
        # with the way back, not the API's {"detail": "Not Found"} (QA 45c)
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404 and _page_load(request):
            return _page(404, "Not found", f"No page {html.escape(request.url.path)} on this torchscope server. "
                         "<a href=\"/\">All sessions</a>")
        return await http_exception_handler(request, exc)

    app.add_exception_handler(StarletteHTTPException, not_found)
    for cls in (DiskFull, sqlite3.OperationalError, OSError):
        app.add_exception_handler(cls, full)
    app.add_exception_handler(StoreClosed, closed)
    app.add_exception_handler(RequestValidationError, invalid)


def create_app(settings: Settings | None = None) -> Any:
    """The ASGI app (FastAPI wrapped in the security middleware); ``.fastapi`` is the inner app."""
    settings = settings or Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        def found(key: tuple[str, int], findings: list[dict[str, Any]]) -> None:
            # stored by now: the sessions list (which refetches on live events) shows the counts
            loop.call_soon_threadsafe(app.state.hub.publish, {
                "session": key[0], "rank": key[1], "kind": "finding", "count": len(findings)})

        # the doctor in the background once a run ended or was imported, so the sessions list
        # shows its error/warning counts without anyone asking
        doctor = DoctorQueue(app.state.store, found)
        app.state.schedule_diagnostics = doctor.schedule
        app.state.diagnose_live = doctor.diagnose_live  # running ranks too (routes_ingest)
        sweeper = asyncio.create_task(_sweep(app, doctor.schedule))
        try:
            yield
        finally:
            sweeper.cancel()
            app.state.hub.close()
            doctor.close()
            stop_children()
            app.state.store.close()

    # no /docs or /redoc: FastAPI's pages load their scripts from a CDN (blank offline, and the
    # dashboard loads nothing from outside); the schema itself is at /openapi.json
    app = FastAPI(title="torchscope", version=version(), lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Live view of PyTorch training runs: sessions, steps, graphs, memory, gradients.")
    app.state.settings = settings
    _add_error_handlers(app, settings.data_dir)
    app.state.store = Store(settings.db_path)
    app.state.hub = LiveHub()
    app.state.schedule_diagnostics = lambda session_id, rank: None  # replaced at startup
    app.state.diagnose_live = lambda session_id, rank, nonfinite=False: None
    # gzip for what is worth it: a 20k-node /graph is 30-40 MB of JSON.  Level 1: most of the
    # size win for a fifth of the CPU of Starlette's default 9 (~0.7 s instead of ~3.5 s for
    # 40 MB, in a worker thread), on a server that also ingests.  Not compressed: the live
    # channel (text/event-stream, excluded by Starlette: a compressor would hold its events
    # back) and the export (application/octet-stream: frames zlib-compressed already).
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES, compresslevel=1,
                       exclude_content_types=(*DEFAULT_EXCLUDED_CONTENT_TYPES, "application/octet-stream"))
    app.include_router(pages_router)
    app.include_router(ingest_router)
    app.include_router(sessions_router)
    app.mount("/static", FrontendFiles(directory=_frontend_dir()), name="static")
    wrapped = SecurityMiddleware(app, settings.allowed_hosts, settings.token, not is_loopback(settings.host),
                                 settings.read_timeout_s)
    wrapped.fastapi = app  # type: ignore[attr-defined]
    return wrapped
