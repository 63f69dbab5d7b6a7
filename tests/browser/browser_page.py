"""Headless Debian Chromium for the browser tests: the one launch recipe this machine needs,
and a page whose JavaScript errors fail the test that used it."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import forkrun
import pytest

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


@pytest.fixture(scope="module")
def module_browser() -> Iterator[Any]:
    """One Chromium for a test module (import it, with ``checked``, into the module)."""
    with chromium() as b:
        yield b


@pytest.fixture
def checked(module_browser: Any) -> Iterator[Any]:
    """A checked page (``checked_context``) of the module's Chromium."""
    with checked_context(module_browser) as p:
        yield p


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


def session_id(srv: Any, name: str, status: str | None = None, timeout: float = 60) -> str:
    """The id of the session called ``name`` on the server (with that status), once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for s in srv.get("/api/sessions"):
            if s["name"] == name and (status is None or s["status"] == status):
                return str(s["id"])
        time.sleep(0.2)
    raise AssertionError(f"no session {name!r} ({status}) on the server: {srv.get('/api/sessions')}")


def killed_and_swept(page: Any, proc: forkrun.Forked | subprocess.Popen[Any], data: Path, sid: str) -> None:
    """SIGKILL a training process whose run ``page`` shows, make the run's last contact 31 s old
    in the server's real SQLite file (instead of waiting), and wait for the server's sweep
    (every 5 s) to find it silent and tell the open page."""
    import signal
    import sqlite3

    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    with sqlite3.connect(data / "torchscope.db") as db:
        db.execute("UPDATE ranks SET last_seen = last_seen - 31 WHERE session_id = ?", (sid,))
    page.wait_for_function("document.getElementById('session-status').textContent === 'ended unexpectedly'",
                           timeout=20_000)


GRAPH_SETTLED = """(() => { const v = window.__torchscope.app.views.graph?.obj;
  return !!v && !v.inFlight && v.waiters.length === 0 && !v.canvas.pending; })()"""


def graph_settled(page: Any, timeout: float = 15_000) -> None:
    """Wait until the graph view has no layout in its worker (``inFlight``), no caller waiting
    on one (``waiters``, resolved once the newest layout is drawn) and no canvas draw queued
    (``canvas.pending``): a key that expands or selects returns before the worker answered, so
    a fixed sleep read the old scene on a busy machine (frontend/graph/view.js, render.js)."""
    page.wait_for_function(GRAPH_SETTLED, timeout=timeout)


def frame(page: Any) -> None:
    """Wait two animation frames: what a chart (not the graph) queued with requestAnimationFrame
    is drawn after them, where a fixed sleep only guessed how long that takes."""
    page.evaluate("new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")


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
    running = {name: forkrun.spawn([str(script), "--server", server.url, "--record", str(out / f"{name}.tscope"), *args])
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


DASHBOARD_TRAIN = Path(__file__).resolve().parent / "dashboard_train.py"


def train(srv: Any, tmp: Path, name: str, *args: str) -> forkrun.Forked | subprocess.Popen[str]:
    """dashboard_train.py streaming to ``srv`` as run ``name`` (recorded under ``tmp`` too)."""
    return forkrun.spawn([str(DASHBOARD_TRAIN), "--server", srv.url, "--record", str(tmp / f"{name}.tscope"),
                          "--name", name, *args])


def finish(p: forkrun.Forked | subprocess.Popen[str]) -> str:
    """A run of ``train`` to its end: its output, checked to have exited 0."""
    out, _ = p.communicate(timeout=240)
    assert p.returncode == 0, out[-3000:]
    return out


def recorded(srv: Any, path: Path, script: Path, *args: str) -> str:
    """The session id of a real run of ``script`` recorded to ``path`` and then imported into
    ``srv``, as a colleague's ``torchscope open`` would (``args``: the script's own options)."""
    import httpx

    run = forkrun.run([str(script), "--record", str(path), *args], timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    with open(path, "rb") as f:
        res = httpx.post(srv.url + "/api/sessions/import", files={"file": (path.name, f)}, timeout=120)
    res.raise_for_status()
    return str(res.json()["id"])


def fmt_bytes(n: float) -> str:
    """frontend/dom.js fmtBytes."""
    units, i, x = ["B", "KiB", "MiB", "GiB", "TiB"], 0, abs(n)
    while x >= 1024 and i < len(units) - 1:
        x /= 1024
        i += 1
    return f"{'-' if n < 0 else ''}{x:.{(2 if x < 10 else 1) if i else 0}f} {units[i]}"


def contrast(a: str, b: str) -> float:
    """WCAG's contrast ratio of two CSS colours, each ``#rrggbb`` or ``rgb(r, g, b)`` (what
    ``getComputedStyle`` gives)."""
    def channels(css: str) -> list[float]:
        if css.startswith("#"):
            return [int(css[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        return [float(v) / 255 for v in re.findall(r"[\d.]+", css)[:3]]

    def lum(css: str) -> float:
        lin = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in channels(css)]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)
