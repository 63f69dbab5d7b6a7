"""A session deleted while its run streams stays deleted (QA 51c, F1).

Before, ``DELETE /api/sessions/{id}`` of a live run removed it, the run's next frames found no
rank and were refused 409 ("rewind to 0"), the transport resent its whole file, and the session
was back within seconds with every step (its rename and tags lost), while the console said
nothing.  Now the server remembers the deleted id (in SQLite: across a restart too) and answers
the run 410 ``{"deleted": true}``; the transport stops sending, says so once, and keeps
writing its file, which `torchscope open` imports again (an explicit act lifts the deletion).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import forkrun
from conftest import ServerProc
from server_helpers import run_frames, write_file

from torchscope.session import load

# A real training loop streaming to the server through watch(), until STOP exists.
TRAIN = """
import os, sys, time, torch, torchscope
torch.set_num_threads(1)
record, server, name, stop = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
nan_at = int(sys.argv[5]) if len(sys.argv) > 5 else -1
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
torchscope.watch(model, opt, name=name, server=server, record=record)
step = 0
while not os.path.exists(stop) and step < 5000:
    opt.zero_grad()
    loss = (model(torch.randn(16, 8)) ** 2).mean()
    if step == nan_at:
        loss = loss * float("nan")
    loss.backward()
    opt.step()
    step += 1
    time.sleep(0.05)
print(f"steps={step}", flush=True)
"""


def start_run(tmp_path: Path, srv: ServerProc, name: str, nan_at: int = -1) -> tuple[Any, Path, Path]:
    """The training script running (its process, its file, the file that stops it)."""
    script = tmp_path / "train_live.py"
    script.write_text(TRAIN)
    record, stop = tmp_path / f"{name}.tscope", tmp_path / f"{name}.stop"
    proc = forkrun.spawn([str(script), str(record), srv.url, name, str(stop), str(nan_at)], merge_stderr=False)
    return proc, record, stop


def listed(srv: ServerProc, name: str) -> dict[str, Any] | None:
    sessions: list[dict[str, Any]] = srv.get("/api/sessions")  # type: ignore[assignment]
    return next((s for s in sessions if s["name"] == name), None)


def wait_for(what: Any, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (got := what()) is not None and got is not False:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s")


def call(url: str, method: str = "GET", data: bytes | None = None) -> tuple[int, dict[str, Any]]:
    kind = "application/json" if method == "PATCH" else "application/x-tscope-frames"
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": kind} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_live_run_deleted_stays_deleted_and_its_file_brings_it_back(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv:
        proc, record, stop = start_run(tmp_path, srv, "live-del")
        try:
            row = wait_for(lambda: (s := listed(srv, "live-del")) and s["steps"] >= 20 and s)
            sid = row["id"]
            assert call(f"{srv.url}/api/sessions/{sid}", "PATCH", b'{"name": "KEEP: best lr", "tags": ["best"]}')[0] == 200
            assert call(f"{srv.url}/api/sessions/{sid}", "DELETE") == (200, {"deleted": sid})
            # the run streams on (a frame every 0.25 s, a heartbeat every 5 s): the session stays gone
            for _ in range(6):
                time.sleep(1.0)
                assert call(f"{srv.url}/api/sessions/{sid}")[0] == 404
                assert listed(srv, "live-del") is None and listed(srv, "KEEP: best lr") is None
            # what the run gets: 410, marked, one line
            status, answer = call(f"{srv.url}/api/ingest/{sid}/0/next")
            assert status == 410 and answer["deleted"] is True
            assert answer["detail"] == (f"session {sid} was deleted on this server: its run's frames are not stored "
                                        "again (importing its file brings it back)")
        finally:
            stop.touch()
            out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (out, err)
        steps = int(out.split("steps=")[1])
        assert err is not None
        said = [line for line in err.splitlines() if "was deleted" in line]
        assert said == [f"torchscope: session {sid} was deleted on the server {srv.url}: this run is no longer sent "
                        f"there; training continues, recording to {record}"], err
        assert "did not get the end" not in err  # (the server was told nothing more on purpose)
        # the file was written as before: every step and the end
        session = load(record)
        assert len(session.steps) == steps
        assert session.status == "finished"
        assert call(f"{srv.url}/api/sessions/{sid}")[0] == 404

        # the deletion is in the store: a server restarted on it still refuses the run
        srv.restart()
        frames = run_frames(sid, 6, end=False)
        status, answer = call(f"{srv.url}/api/ingest/{sid}/0", "POST", b"".join(frames))
        assert status == 410 and answer["deleted"] is True
        assert call(f"{srv.url}/api/sessions/{sid}")[0] == 404

        # an explicit import of the run's file brings it back, whole (and live frames go in again)
        res = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "open", str(record), "--port",
                              str(srv.port), "--no-browser"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        back: dict[str, Any] = srv.get(f"/api/sessions/{sid}")  # type: ignore[assignment]
        assert back["status"] == "finished" and back["steps"] == steps
        assert call(f"{srv.url}/api/ingest/{sid}/0/next") == (200, {"next_seq": back["rank_info"][0]["frames"]})


def test_a_deleted_ended_run_is_deleted_as_before_and_imports_again(tmp_path: Path) -> None:
    frames = run_frames("ended-del", 12)
    with ServerProc(tmp_path / "data") as srv:
        assert call(f"{srv.url}/api/ingest/ended-del/0", "POST", b"".join(frames)) == (200, {"next_seq": len(frames)})
        assert call(f"{srv.url}/api/sessions/ended-del", "DELETE") == (200, {"deleted": "ended-del"})
        assert call(f"{srv.url}/api/sessions/ended-del")[0] == 404
        assert call(f"{srv.url}/api/sessions/ended-del", "DELETE")[0] == 404  # (nothing to delete twice)
        # a resend of its frames (a writer's last try) does not bring it back
        assert call(f"{srv.url}/api/ingest/ended-del/0", "POST", b"".join(frames))[0] == 410
        # an unknown id is no deleted one: a new run starts as ever
        assert call(f"{srv.url}/api/ingest/other/0/next") == (200, {"next_seq": 0})
        path = write_file(tmp_path / "ended-del.tscope", frames)
        res = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "open", str(path), "--port",
                              str(srv.port), "--no-browser"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert srv.get("/api/sessions/ended-del")["steps"] == 12  # type: ignore[index]
