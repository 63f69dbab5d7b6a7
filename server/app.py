"""The FastAPI application: store, live hub, routers, static dashboard, security."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from .config import RUNNING_TIMEOUT_S, SILENT_SWEEP_S, Settings, version
from .diagnostics import diagnostics, stop_children
from .live import LiveHub
from .routes_ingest import router as ingest_router
from .routes_pages import router as pages_router
from .routes_sessions import router as sessions_router
from .security import SecurityMiddleware
from .store import Store

log = logging.getLogger("torchscope.server")


def _frontend_dir() -> Path:
    import torchscope.frontend

    return Path(torchscope.frontend.__file__).resolve().parent


async def _diagnose_silent(app: FastAPI, schedule: Any) -> None:
    """A run killed mid-way sends no end event, which is what starts its diagnosis: such runs
    are diagnosed once their writer has been silent for RUNNING_TIMEOUT_S ("ended
    unexpectedly"), each set of frames once (a doctor that failed is not retried on them).
    The change of status is published on the live channel, as ingest publishes an end."""
    tried: dict[tuple[str, int], int] = {}
    told: set[tuple[str, int]] = set()
    while True:
        await asyncio.sleep(SILENT_SWEEP_S)
        try:
            store: Store = app.state.store
            before = time.time() - RUNNING_TIMEOUT_S
            silent = set(store.silent(before))
            for key in silent - told:  # open pages learn that "running" is over
                app.state.hub.publish({"session": key[0], "rank": key[1], "kind": "status", "status": "ended unexpectedly"})
            told = silent  # a writer heard from again is told about afresh when it goes silent
            for key in store.silent_undiagnosed(before):
                frames = store.frame_count(*key)
                if tried.get(key) != frames:
                    tried[key] = frames
                    schedule(*key)
        except Exception:  # the sweep must not end the server; the next one tries again
            log.exception("torchscope: looking for silent runs to diagnose failed")


def create_app(settings: Settings | None = None) -> Any:
    """The ASGI app (FastAPI wrapped in the security middleware); ``.fastapi`` is the inner app."""
    settings = settings or Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        pool = ThreadPoolExecutor(1, thread_name_prefix="torchscope-doctor")

        def schedule_diagnostics(session_id: str, rank: int) -> None:
            """Run the doctor in the background once a run ended or was imported, so the
            sessions list shows its error/warning counts without anyone asking."""

            def job() -> None:
                try:
                    findings, fresh = diagnostics(app.state.store, session_id, rank)
                except Exception:
                    log.exception("torchscope: diagnostics of %s failed", session_id)
                    return
                if fresh:
                    loop.call_soon_threadsafe(app.state.hub.publish, {
                        "session": session_id, "rank": rank, "kind": "finding", "count": len(findings)})

            pool.submit(job)

        app.state.schedule_diagnostics = schedule_diagnostics
        sweeper = asyncio.create_task(_diagnose_silent(app, schedule_diagnostics))
        try:
            yield
        finally:
            sweeper.cancel()
            app.state.hub.close()
            pool.shutdown(wait=False, cancel_futures=True)
            stop_children()
            app.state.store.close()

    # no /docs or /redoc: FastAPI's pages load their scripts from a CDN (blank offline, and the
    # dashboard loads nothing from outside); the schema itself is at /openapi.json
    app = FastAPI(title="torchscope", version=version(), lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Live view of PyTorch training runs: sessions, steps, graphs, memory, gradients.")
    app.state.settings = settings
    app.state.store = Store(settings.db_path)
    app.state.hub = LiveHub()
    app.state.schedule_diagnostics = lambda session_id, rank: None  # replaced at startup
    app.include_router(pages_router)
    app.include_router(ingest_router)
    app.include_router(sessions_router)
    app.mount("/static", StaticFiles(directory=_frontend_dir()), name="static")
    wrapped = SecurityMiddleware(app, settings.allowed_hosts, settings.token)
    wrapped.fastapi = app  # type: ignore[attr-defined]
    return wrapped
