"""A run that ends while its server is down: the server keeps a run that "ended unexpectedly",
so the run says, as it ends, how to fill it in -- and doing what it says does."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from conftest import ServerProc, wait_for

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
