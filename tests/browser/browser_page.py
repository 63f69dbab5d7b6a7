"""Headless Debian Chromium for the browser tests: the one launch recipe this machine needs,
and a page whose JavaScript errors fail the test that used it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def checked_context(browser: Any, width: int = 1280, height: int = 800) -> Iterator[Any]:
    """A page in a fresh context of ``browser``; on leaving, no uncaught error may have reached it."""
    ctx = browser.new_context(viewport={"width": width, "height": height})
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield page
    finally:
        ctx.close()
    assert errors == [], f"JavaScript errors: {errors}"


@contextlib.contextmanager
def checked_page(width: int = 1280, height: int = 800) -> Iterator[Any]:
    """A page in a fresh Chromium; on leaving, no uncaught error may have reached it."""
    with chromium() as b, checked_context(b, width, height) as page:
        yield page


def open_session(page: Any, base_url: str, sid: str, query: str = "") -> None:
    """A session's dashboard page (``query``: "?view=graph&step=3"...), once its app started."""
    page.goto(f"{base_url}/sessions/{sid}{query}")
    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    page.evaluate("window.__torchscope.ready")


def shot(page: Any, name: str) -> None:
    """A screenshot into test-artifacts/screenshots/ (a look at what a test saw)."""
    from conftest import ARTIFACTS

    shots = ARTIFACTS / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(150)  # one animation frame for the canvas
    page.screenshot(path=str(shots / f"{name}.png"))


def train_side_by_side(server: Any, script: Path, out: Path, runs: dict[str, list[str]],
                       ready: Callable[[dict[str, dict[str, Any]]], bool] = lambda listed: True) -> dict[str, str]:
    """Session ids by run name: real training runs of ``script`` (each with its arguments, and
    --server / --record added) streamed to ``server`` at once, once every one is finished there
    (and ``ready`` says the listing has what the test needs, e.g. the doctor's findings)."""
    running = {name: subprocess.Popen([sys.executable, str(script), "--server", server.url,
                                       "--record", str(out / f"{name}.tscope"), *args],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for name, args in runs.items()}  # fmt: skip
    for name, p in running.items():
        text, _ = p.communicate(timeout=240)
        assert p.returncode == 0, f"{name}: {text[-3000:]}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        listed = {s["name"]: s for s in server.get("/api/sessions")}
        if all(listed.get(n, {}).get("status") == "finished" for n in runs) and ready(listed):
            return {n: str(listed[n]["id"]) for n in runs}
        time.sleep(0.2)
    raise AssertionError(f"runs not finished (or not ready) on the server: {server.get('/api/sessions')}")
