"""A run that ends while its server is down: the server keeps a run that "ended unexpectedly",
so the run says, as it ends, how to fill it in -- and doing what it says does.  And a run
shorter than the start of the server it starts itself, which waits for that server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from conftest import ServerProc, free_port, wait_for

from torchscope.sessionfile import iter_events

HERE = Path(__file__).resolve().parent


def test_a_run_ending_while_the_server_is_down_says_how_to_fill_it_in(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "data").start()
    record, stop = tmp_path / "run.tscope", tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, str(HERE / "server_stream_train.py"), str(record), srv.url, "down1",
                             "5", "0.05", str(stop)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: any(s["id"] == "down1" for s in srv.get("/api/sessions")), 90.0)  # type: ignore[union-attr]
        srv.stop()
        time.sleep(0.5)  # steps the server never gets
        stop.touch()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = [line for line in err.splitlines() if "did not get the end of this run" in line]
    assert len(said) == 1, err
    command = said[0].split("the file is complete: ", 1)[1].removesuffix(" shows the whole run there")
    assert command == f"torchscope open {record} --port {srv.port}"
    srv.start()
    try:
        assert srv.get("/api/sessions/down1")["status"] != "finished"  # type: ignore[index]
        # what it said, as the user would type it
        args = command.split()[1:]
        res = subprocess.run([sys.executable, "-m", "torchscope.server.cli", *args, "--no-browser"],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        detail = srv.get("/api/sessions/down1")
        assert isinstance(detail, dict) and detail["status"] == "finished"
        assert detail["steps"] == sum(1 for ev in iter_events(record) if ev["kind"] == "step")
    finally:
        srv.stop()


def _servers_on(port: int) -> list[int]:
    """Pids of `torchscope serve` processes started for ``port`` (by a run, in a session of their own)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"torchscope.server.cli" in cmd and b"serve" in cmd and str(port).encode() in cmd:
            out.append(int(proc.name))
    return out


def test_a_run_shorter_than_the_server_it_starts_waits_for_it(tmp_path: Path) -> None:
    """With no server up, watch() starts one in the background; a three-step script ends
    before that server's imports do.  The run waits for it as it ends, and the server then
    holds the whole run, finished -- not a run it never heard of and a line to import the file."""
    port = free_port()
    env = {**os.environ, "TORCHSCOPE_SERVER": f"http://127.0.0.1:{port}", "TORCHSCOPE_DATA": str(tmp_path / "data")}
    record = tmp_path / "run.tscope"
    try:
        res = subprocess.run([sys.executable, str(HERE / "server_watch_train.py"), "auto", str(record), "3"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert f"started a torchscope server at http://127.0.0.1:{port} in the background (pid " in res.stderr
        assert "never answered" not in res.stderr and "did not get" not in res.stderr, res.stderr
        assert _servers_on(port)  # it keeps running after the script, as it said
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/sessions", timeout=10) as r:
            sessions = json.loads(r.read())
        assert [(s["name"], s["status"], s["steps"]) for s in sessions] == [("watched", "finished", 3)]
    finally:
        for pid in _servers_on(port):
            os.kill(pid, signal.SIGTERM)
