"""A server stopped with SIGTERM (`kill`, the printed stop command of a server `open` started,
docker, systemd) left its SQLite WAL at its high-water size: uvicorn re-raises the signal after
its shutdown with the default action, which ends the process with the API's read connections
open, so SQLite never folded the WAL back (QA 51a: 389 MB beside a 431 MB store; SIGINT cleaned
it).  The store's writer now checkpoints and truncates it as it closes."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ServerProc
from server_helpers import run_frames, write_file


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_server_leaves_no_wal_behind(tmp_path: Path, sig: int) -> None:
    run = write_file(tmp_path / "long.tscope", run_frames("wal-run", steps=3000, graph_steps=tuple(range(0, 3000, 10))))
    srv = ServerProc(tmp_path / "data").start()
    try:
        res = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "open", str(run), "--port", str(srv.port),
                              "--no-browser"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert srv.get("/api/sessions/wal-run")["steps"] == 3000  # type: ignore[index]  # (a reader's connection too)
        wal = tmp_path / "data" / "torchscope.db-wal"
        assert wal.exists() and wal.stat().st_size > 1_000_000, wal.stat().st_size  # the import went through it
    finally:
        srv.stop(sig)
    assert not wal.exists() or wal.stat().st_size == 0, wal.stat().st_size
    # and nothing was lost: a new server reads the run whole
    with ServerProc(tmp_path / "data") as again:
        assert again.get("/api/sessions/wal-run")["steps"] == 3000  # type: ignore[index]
