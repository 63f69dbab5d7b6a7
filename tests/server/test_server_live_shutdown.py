"""A server stopping with dashboards open: their live streams (SSE, which never end by
themselves) end as the server starts to stop, so SIGTERM is a clean stop -- not uvicorn's
graceful timeout running out and "ERROR: Cancel N running task(s)" in its log (QA 37d)."""

from __future__ import annotations

import http.client
import signal
import time
from pathlib import Path

from conftest import ServerProc


def _open_stream(port: int) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.request("GET", "/api/live")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.readline() == b": connected\n"
    return resp


def test_sigterm_with_dashboards_open_ends_their_streams_and_stops_cleanly(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "data").start()
    try:
        assert srv.proc is not None
        streams = [_open_stream(srv.port) for _ in range(2)]
        srv.proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        for resp in streams:
            rest = resp.read()  # the stream's end (a cancelled one is cut off: IncompleteRead)
            assert b"data:" not in rest
        code = srv.proc.wait(20)
        took = time.monotonic() - began
    finally:
        srv.stop()
    log = srv.log.read_text()
    assert code == -signal.SIGTERM, log  # uvicorn stops, then re-raises the signal it caught
    # the sign of a stop that waited for the streams: uvicorn's graceful timeout (3 s) ran out
    # and it logged "ERROR: Cancel N running task(s)"
    assert "ERROR" not in log and "Cancel" not in log and "graceful shutdown exceeded" not in log, log
    # and no stop that hangs (the bound is loose: a loaded machine is slow to stop a process)
    assert took < 15.0, (took, log)
