"""Two live runs open in two tabs: a page asking for its run's findings while the other
run's doctor is running gets the findings it has, and its run is diagnosed right after, the
"finding" live event telling the page.  It used to wait for a later poll that happened to
find no doctor running: QA 37d saw a NaN on one of two live runs reach its page ~12 s late."""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from conftest import ServerProc
from server_helpers import run_frames, step_event

from torchscope.sessionfile import encode_frame


def _post(srv: ServerProc, sid: str, frames: list[bytes]) -> None:
    req = urllib.request.Request(f"{srv.url}/api/ingest/{sid}/0", data=b"".join(frames), method="POST",
                                 headers={"Content-Type": "application/x-tscope-frames"})
    urllib.request.urlopen(req, timeout=60).read()


def _findings(srv: ServerProc, sid: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{srv.url}/api/sessions/{sid}/diagnostics", timeout=120) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def _descendants(pid: int) -> list[int]:
    """The pids of ``pid``'s children, theirs, and so on (Linux /proc)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        for children in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                kids = [int(c) for c in children.read_text().split()]
                found += kids
                todo += kids
    return found


def _doctor_running(server_pid: int) -> bool:
    """Whether a doctor child (``python -m torchscope.server.diagnostics DB``) of the server runs."""
    for pid in _descendants(server_pid):
        with contextlib.suppress(OSError):
            if b"torchscope.server.diagnostics" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
    return False


def _nan_step(step: int) -> dict[str, Any]:
    ev = step_event(step)
    ev["loss"] = math.nan
    ev["grads"] = {**ev["grads"], "norm": [math.nan, None], "nan": [4, 0]}
    return ev


def test_a_page_answered_while_another_runs_doctor_runs_gets_its_run_diagnosed_next(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv:
        live = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
        live.request("GET", "/api/live")
        stream = live.getresponse()
        assert stream.readline() == b": connected\n"
        heard: list[tuple[float, dict[str, Any]]] = []  # (when, message) of every live event

        def listen() -> None:
            for line in stream:
                if line.startswith(b"data: "):
                    heard.append((time.monotonic(), json.loads(line[6:])))

        threading.Thread(target=listen, daemon=True).start()

        a = run_frames("runA", 10, end=False)
        _post(srv, "runA", a)
        assert not [f for f in _findings(srv, "runA") if f["code"] == "P4"]  # diagnosed: healthy so far
        # a long live run, whose doctor takes seconds
        _post(srv, "runB", run_frames("runB", 20000, end=False, per_frame=200))
        # run A's loss turns NaN
        _post(srv, "runA", [encode_frame(len(a), [_nan_step(s) for s in range(10, 14)])])

        b_page = threading.Thread(target=_findings, args=(srv, "runB"))
        b_page.start()
        # B's doctor is running now: its child process exists only while B's request holds the
        # doctor lock (nothing else is diagnosed: neither run ended)
        assert srv.proc is not None
        deadline = time.monotonic() + 30
        while not _doctor_running(srv.proc.pid) and b_page.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _doctor_running(srv.proc.pid), "B's doctor never started (or was over before it was seen)"
        answered = _findings(srv, "runA")
        since = time.monotonic()
        b_still_running = b_page.is_alive()
        b_page.join()
        assert b_still_running  # (the test's premise: A's page asked while B's doctor ran)
        assert not [f for f in answered if f["code"] == "P4"]  # what A had: the doctor was busy

        # no further request of A's page: its run is diagnosed next, and the page told.  Run A
        # goes on (a step every 2 s): the server's sweep diagnoses a run only once it has been
        # silent for 30 s ("ended unexpectedly"), which is not what this is about
        done = threading.Event()

        def train_on() -> None:
            seq = len(a) + 1
            while not done.wait(2.0):
                _post(srv, "runA", [encode_frame(seq, [_nan_step(10 + seq - len(a))])])
                seq += 1

        trainer = threading.Thread(target=train_on, daemon=True)
        trainer.start()
        def told() -> bool:
            return any(t > since and m["kind"] == "finding" and m["session"] == "runA" for t, m in heard)

        deadline = time.monotonic() + 60
        while not told() and time.monotonic() < deadline:
            time.sleep(0.1)
        done.set()
        trainer.join()
        assert told()
        assert [f for f in _findings(srv, "runA") if f["code"] == "P4"]  # the NaN, found
