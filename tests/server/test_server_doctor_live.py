"""The Doctor tab of a live run answers at once, and an ended run's answer is final.

QA 49b: while a full-mode run trained, each request for its findings ran the doctor over every
frame again, beside the training on the same two cores: the tab read "Loading…" for 18, then
37, then 51 s.  A running rank now gets the findings of the frames diagnosed so far at once, and
its doctor runs behind the answer, the "finding" live event telling the page.  A rank that has
ended (an imported file) is the other way round: right after `torchscope open` of a whole file
over a partial one, the partial file's findings were served for a second as the run's."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from conftest import ServerProc
from server_helpers import run_frames, write_file
from test_server_doctor_turns import _findings, _nan_step, _post

from torchscope.sessionfile import encode_frame


def _listen(srv: ServerProc) -> list[dict[str, Any]]:
    """Every live event the server sends from now on, in order (a thread fills the list)."""
    live = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    live.request("GET", "/api/live")
    stream = live.getresponse()
    assert stream.readline() == b": connected\n"
    heard: list[dict[str, Any]] = []

    def listen() -> None:
        for line in stream:
            if line.startswith(b"data: "):
                heard.append(json.loads(line[6:]))

    threading.Thread(target=listen, daemon=True).start()
    return heard


def _heard_finding(heard: list[dict[str, Any]], start: int) -> int:
    """Waits for a "finding" event of the session "live" at ``heard[start:]``; the index past it."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        for i in range(start, len(heard)):
            if heard[i]["kind"] == "finding" and heard[i]["session"] == "live":
                return i + 1
        time.sleep(0.05)
    raise AssertionError(f"no finding event of 'live' after event {start}: {heard}")


def _codes(findings: list[dict[str, Any]]) -> set[str]:
    return {f["code"] for f in findings}


def test_a_live_runs_findings_come_at_once_and_the_update_follows(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv:
        heard = _listen(srv)
        a = run_frames("live", 10, end=False)
        _post(srv, "live", a)
        before = _findings(srv, "live")
        assert "P4" not in _codes(before)  # diagnosed: healthy so far
        # that first diagnosis is published too: the NaN is sent once it is heard, so the event
        # awaited below is the NaN's (CI, loaded: the listener read it after the next post)
        since = _heard_finding(heard, 0)
        _post(srv, "live", [encode_frame(len(a), [_nan_step(s) for s in range(10, 14)])])
        # the run goes on (frames stored, no end): its page gets what the doctor found so far
        answered = _findings(srv, "live")
        assert answered == before
        with urllib.request.urlopen(f"{srv.url}/api/sessions/live", timeout=30) as r:
            assert json.loads(r.read())["status"] == "running"
        # and the doctor runs behind the answer: the page is told, and the NaN is found
        _heard_finding(heard, since)
        assert "P4" in _codes(_findings(srv, "live"))


def test_an_ended_runs_findings_are_of_all_its_frames_once_opened(tmp_path: Path) -> None:
    healthy = run_frames("imp", 20, end=False)
    tail = [_nan_step(s) for s in range(20, 24)] + [{"kind": "end", "t": time.time(), "status": "finished", "steps": 24}]
    whole = write_file(tmp_path / "whole.tscope", [*healthy, encode_frame(len(healthy), tail)])
    part = write_file(tmp_path / "part.tscope", healthy[:4])
    with ServerProc(tmp_path / "data") as srv:
        def open_file(path: Path) -> None:
            res = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "open", str(path), "--port", str(srv.port),
                                  "--no-browser"], capture_output=True, text=True, timeout=120)
            assert res.returncode == 0, res.stderr

        open_file(part)
        assert "P4" not in _codes(_findings(srv, "imp"))  # the partial file's findings, cached
        open_file(whole)
        # right away: the whole run's, not the partial file's still cached
        findings = _findings(srv, "imp")
        assert "P4" in _codes(findings), findings
        with urllib.request.urlopen(f"{srv.url}/api/sessions/imp", timeout=30) as r:
            assert json.loads(r.read())["status"] == "finished"
