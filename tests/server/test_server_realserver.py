"""Real-server tier: `torchscope serve` in a subprocess, a real training script streaming to it."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import forkrun
from conftest import ServerProc, http_json, wait_for

from torchscope.sessionfile import index, iter_events, raw_frames

HERE = Path(__file__).resolve().parent



def test_server_killed_and_restarted_twice_ends_with_every_event(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "data").start()
    record = tmp_path / "run.tscope"
    stop = tmp_path / "stop"
    proc = forkrun.spawn([str(HERE / "server_stream_train.py"), str(record), srv.url, "kr1",
                          "20", "0.05", str(stop)])
    try:
        assert wait_for(lambda: any(s["id"] == "kr1" for s in srv.get("/api/sessions")))  # type: ignore[union-attr]
        for _ in range(2):
            time.sleep(1.0)
            srv.stop()  # SIGTERM mid-run: the store must stay consistent
            time.sleep(1.0)  # training goes on, writing the file
            srv.start()
        time.sleep(1.0)  # the run goes on live after the second restart, then ends normally
        stop.touch()
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    try:
        n_frames = len(list(raw_frames(record)))
        file_events = list(iter_events(record))
        assert wait_for(lambda: srv.get("/api/sessions/kr1")["rank_info"][0]["frames"] == n_frames)  # type: ignore[index]
        detail = srv.get("/api/sessions/kr1")
        assert isinstance(detail, dict)
        assert detail["status"] == "finished"
        steps = sum(1 for e in file_events if e["kind"] == "step")
        assert steps >= 20 and detail["steps"] == steps
        # every record of every frame, the series frames of format 1.1 too (iter_events skips them)
        assert detail["rank_info"][0]["events"] == sum(f.n_events for f in index(record)[1])
        graphs = srv.get("/api/sessions/kr1/graphs")
        assert [g["step"] for g in graphs] == list(range(0, steps, 10))  # type: ignore[union-attr]
        with urllib.request.urlopen(srv.url + "/api/sessions/kr1/export", timeout=10) as resp:
            assert resp.read() == record.read_bytes()  # the server holds the file, byte for byte
        # the gradient norms the server serves are the ones the script computed
        file_norms = [e["grads"]["norm"] for e in file_events if e["kind"] == "step"]
        assert srv.get(f"/api/sessions/kr1/grads?end={steps}")["norm"] == file_norms  # type: ignore[index]
    finally:
        srv.stop()


def test_live_channel_pushes_within_a_second(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "data").start()
    try:
        resp = urllib.request.urlopen(srv.url + "/api/live", timeout=10)
        assert resp.readline().startswith(b": connected")
        from server_helpers import run_frames

        frames = run_frames("live1", steps=3, graph_steps=(1,))
        t0 = time.monotonic()
        req = urllib.request.Request(srv.url + "/api/ingest/live1/0", data=b"".join(frames), method="POST")
        urllib.request.urlopen(req, timeout=10).read()
        kinds = []
        while "end" not in kinds:
            line = resp.readline().strip()
            if line.startswith(b"data: "):
                msg = json.loads(line[6:])
                assert msg["session"] == "live1" and msg["rank"] == 0
                kinds.append(msg["kind"])
        # the 1 s target is measured in benchmarks/bench_server.py; here only "pushed, not polled":
        # loose for a loaded machine, yet under the 15 s keepalive that would flush a held stream
        assert time.monotonic() - t0 < 10.0
        assert kinds[0] == "session" and "graph" in kinds and kinds[-1] == "end" and "step" in kinds
        resp.close()
        assert http_json(srv.url + "/api/health")["ok"] is True  # type: ignore[index]
    finally:
        srv.stop()


def test_status_of_a_silent_writer_is_not_running_forever(tmp_path: Path) -> None:
    """A writer that stopped without an end event: running while heard from, then not."""
    from server_helpers import run_frames

    srv = ServerProc(tmp_path / "data").start()
    try:
        req = urllib.request.Request(srv.url + "/api/ingest/quiet/0",
                                     data=b"".join(run_frames("quiet", steps=2, end=False)), method="POST")
        urllib.request.urlopen(req, timeout=10).read()
        assert srv.get("/api/sessions/quiet")["status"] == "running"  # type: ignore[index]
        # make the last contact old by rewriting it in the real SQLite file, then ask again
        import sqlite3

        with sqlite3.connect(tmp_path / "data" / "torchscope.db") as db:
            db.execute("UPDATE ranks SET last_seen = last_seen - 31")
        assert srv.get("/api/sessions/quiet")["status"] == "ended unexpectedly"  # type: ignore[index]
        # no end event will start its diagnosis: the server's sweep does, without anyone asking
        deadline = time.monotonic() + 60
        row = None
        while row is None and time.monotonic() < deadline:
            time.sleep(0.5)
            with sqlite3.connect(tmp_path / "data" / "torchscope.db") as db:
                row = db.execute("SELECT frames FROM diagnostics WHERE session_id='quiet' AND rank=0").fetchone()
        assert row is not None, "a silent run was never diagnosed"
        with sqlite3.connect(tmp_path / "data" / "torchscope.db") as db:
            assert row[0] == db.execute("SELECT next_seq FROM ranks WHERE session_id='quiet'").fetchone()[0]
    finally:
        srv.stop()


def test_watched_script_streams_everything_to_the_server(tmp_path: Path) -> None:
    """torchscope.watch() in a real script -> `torchscope serve`: the server ends with the file."""
    from conftest import run_script

    srv = ServerProc(tmp_path / "data").start()
    record = tmp_path / "watched.tscope"
    try:
        run_script(HERE / "server_watch_train.py", srv.url, str(record), "12")
        file_events = list(iter_events(record))
        session = next(e for e in file_events if e["kind"] == "session")
        sid = session["session_id"]
        n_frames = len(list(raw_frames(record)))
        assert wait_for(lambda: srv.get(f"/api/sessions/{sid}")["rank_info"][0]["frames"] == n_frames)  # type: ignore[index]
        detail = srv.get(f"/api/sessions/{sid}")
        assert isinstance(detail, dict)
        assert detail["status"] == "finished" and detail["name"] == "watched"
        assert detail["steps"] == 12 == sum(1 for e in file_events if e["kind"] == "step")
        assert detail["rank_info"][0]["events"] == sum(f.n_events for f in index(record)[1])
        captured = [e["step"] for e in file_events if e["kind"] == "graph"]
        assert captured and [g["step"] for g in srv.get(f"/api/sessions/{sid}/graphs")] == captured  # type: ignore[union-attr]
        graph = srv.get(f"/api/sessions/{sid}/graph?step={captured[0]}")
        assert isinstance(graph, dict) and graph["ops"] and graph["kind"] == "graph"
        with urllib.request.urlopen(srv.url + f"/api/sessions/{sid}/export", timeout=10) as resp:
            assert resp.read() == record.read_bytes()
    finally:
        srv.stop()


def test_a_refused_host_page_links_to_the_address_the_server_is_bound_to(tmp_path: Path) -> None:
    """A real server bound to IPv6's loopback only: a browser arriving under a name it does not
    serve gets a link to ``[::1]`` -- where it answers -- not to 127.0.0.1, where nothing does."""
    srv = ServerProc(tmp_path / "data", extra=["--host", "::1"])
    srv.url = f"http://[::1]:{srv.port}"
    with srv:
        req = urllib.request.Request(srv.url + "/", headers={"Host": f"0.0.0.0:{srv.port}", "Accept": "text/html"})
        try:
            urllib.request.urlopen(req, timeout=5)
            raise AssertionError("a refused Host was served")
        except urllib.error.HTTPError as err:
            assert err.code == 400
            page = err.read().decode()
        assert f'href="http://[::1]:{srv.port}/"' in page and "127.0.0.1:" not in page, page
        assert http_json(srv.url + "/api/health")  # the link's address answers
