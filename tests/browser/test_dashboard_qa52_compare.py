"""The Compare page refreshes only what changed (fifty-second session; README's "found and not
fixed" of the fifty-first: a Compare page of 8 live runs refetched every series of every run on
each refresh).  Three finished runs and one live run on the page; the live run streams two more
batches of steps, each a refresh: no request names a finished run, the live run's series are
asked from the last step the page has on (``start=``), and what the charts then hold is the
whole run, as the server has it."""

from __future__ import annotations

import json
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked_page
from conftest import ServerProc, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from server_helpers import run_frames  # noqa: E402 - the server tests' frame builders

playwright_sync = pytest.importorskip("playwright.sync_api")

STATE = "window.__torchscope.state()"
SERIES = ("loss", "grads", "memory", "steps", "metrics")


def _post(srv: ServerProc, sid: str, frames: list[bytes]) -> None:
    req = urllib.request.Request(f"{srv.url}/api/ingest/{sid}/0", data=b"".join(frames), method="POST",
                                 headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def _series_calls(urls: list[str], sid: str) -> dict[str, list[dict[str, list[str]]]]:
    """The series requests of session ``sid`` among ``urls``: endpoint -> each one's query."""
    out: dict[str, list[dict[str, list[str]]]] = {}
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        prefix = f"/api/sessions/{sid}/"
        if parts.path.startswith(prefix) and parts.path[len(prefix):] in SERIES:
            out.setdefault(parts.path[len(prefix):], []).append(urllib.parse.parse_qs(parts.query))
    return out


def test_a_refresh_fetches_only_the_live_runs_new_steps(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv, checked_page(1400, 1000) as page:
        done = [f"done-{k}" for k in range(3)]
        for sid in done:
            _post(srv, sid, run_frames(sid, steps=40, graph_steps=()))
        live = "live-run"
        frames = run_frames(live, steps=60, graph_steps=(), end=False)  # 1 session frame + 20 of 3 steps
        _post(srv, live, frames[:8])  # steps 0..20
        # the finished runs' doctor has answered (its "finding" events would refresh their cells)
        assert wait_for(lambda: all(s["diagnosed"] for s in srv.get("/api/sessions") if s["id"] in done), 60)  # type: ignore[union-attr]
        requests: list[str] = []
        sizes: list[Any] = []
        page.on("request", lambda r: requests.append(r.url))
        page.on("requestfinished", lambda r: sizes.append(r))
        page.goto(f"{srv.url}/compare?runs={','.join([*done, live])}")
        page.wait_for_function("window.__torchscope && window.__torchscope.ready")
        page.evaluate("window.__torchscope.ready")
        page.wait_for_function(f"{STATE}.charts.loss.series[3].y.filter((v) => v !== null).length === 21")
        page.wait_for_function("!document.querySelector('[data-fact=doctor]').textContent.includes('checking')")
        first = list(requests)
        for sid in done:  # the first load: every run's series, whole
            assert set(_series_calls(first, sid)) == set(SERIES), _series_calls(first, sid)
        requests.clear()
        sizes.clear()
        # two refreshes: the live run's next steps, each batch waited for on the page
        for upto, steps in ((14, 39), (21, 60)):
            _post(srv, live, frames[8 if upto == 14 else 14:upto])
            page.wait_for_function(f"{STATE}.charts.loss.series[3].y.filter((v) => v !== null).length === {steps}",
                                   timeout=30_000)
        got = page.evaluate(STATE)
        later = list(requests)
        # finished runs: not one request (their series, summary or doctor) after the first load
        for sid in done:
            assert [u for u in later if f"/api/sessions/{sid}" in u] == [], [u for u in later if sid in u]
        # the live run: only its new steps, each series asked from the last step the page had on
        calls = _series_calls(later, live)
        assert set(calls) == set(SERIES), calls
        for endpoint, queries in calls.items():
            assert queries and all("start" in q and int(q["start"][0]) >= 20 for q in queries), (endpoint, queries)
        steps_bytes = [len(r.response().body()) for r in sizes if r.response() is not None
                       and urllib.parse.urlsplit(r.url).path == f"/api/sessions/{live}/steps"]
        whole = len(urllib.request.urlopen(f"{srv.url}/api/sessions/{live}/steps?limit=10000", timeout=30).read())
        assert steps_bytes and max(steps_bytes) < whole / 2, (steps_bytes, whole)
        # and what the charts hold is the whole run, as the server answers it whole
        loss = json.loads(urllib.request.urlopen(f"{srv.url}/api/sessions/{live}/loss", timeout=30).read())
        memory = json.loads(urllib.request.urlopen(f"{srv.url}/api/sessions/{live}/memory", timeout=30).read())
    x = got["charts"]["loss"]["x"]
    assert x == list(range(60))
    assert got["charts"]["loss"]["series"][3]["y"] == loss["loss"]
    assert got["charts"]["peak"]["series"][3]["y"] == memory["peak"]
    assert got["charts"]["step_time"]["series"][3]["y"] == [1000 + s for s in range(60)]
    assert got["charts"]["grad_norm"]["series"][3]["y"] == [pytest.approx(0.5 + s) for s in range(60)]
    for k in range(3):  # the finished runs' lines, loaded once, stop at their 40 steps
        assert got["charts"]["loss"]["series"][k]["y"] == loss["loss"][:40] + [None] * 20
