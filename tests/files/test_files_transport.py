"""The transport thread against real servers: an unreachable or silent server never holds up
``close``, an idle run sends heartbeats, back-pressure sheds graphs but never steps, a forked
child stays silent, a server killed and restarted twice mid-run ends with every frame, and one
that first answers after many frames gets them all from the file."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProc, free_port, http_json

from torchscope.session import load
from torchscope.sessionfile import FRAME_HEADER_SIZE, SessionFileError, SessionFileWriter, index
from torchscope.transport import Transport

SCRIPT = Path(__file__).with_name("train_files_kill.py")


def _session(sid: str) -> dict[str, Any]:
    return {"kind": "session", "session_id": sid, "name": sid, "rank": 0, "world_size": 1,
            "params": [{"name": "w", "module": ""}]}


def _steps(tr: Transport, lo: int, hi: int) -> None:
    for s in range(lo, hi):
        tr.emit({"kind": "step", "step": s, "t": time.time(), "loss": 1.0, "grads": {"norm": [1.0]}})


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Any:
    s = ServerProc(tmp_path_factory.mktemp("transport-server")).start()
    yield s
    s.stop()


def test_files_close_with_unreachable_server_is_quick_and_complete(tmp_path: Path) -> None:
    tr = Transport(str(tmp_path / "down.tscope"), "down-sid", server=f"http://127.0.0.1:{free_port()}")
    tr.emit(_session("down-sid"))
    _steps(tr, 0, 500)
    time.sleep(0.6)  # let it fail and back off once
    t0 = time.monotonic()
    # a refused connection fails at once: close returns long before its (generous) timeout,
    # where one held up by the server would wait all of it
    tr.close({"kind": "end", "t": time.time(), "status": "finished", "steps": 500}, timeout=30.0)
    took = time.monotonic() - t0
    assert took < 10.0, took
    assert tr.server_ok is False
    s = load(tmp_path / "down.tscope")
    assert s.status == "finished" and len(s.steps) == 500


def test_files_close_with_silent_server_returns_within_timeout(tmp_path: Path) -> None:
    """A server that accepts connections and never answers (a hung process)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        port = silent.getsockname()[1]
        tr = Transport(str(tmp_path / "hung.tscope"), "hung-sid", server=f"http://127.0.0.1:{port}")
        tr.emit(_session("hung-sid"))
        _steps(tr, 0, 100)
        time.sleep(0.3)  # the thread is now stuck in a request
        t0 = time.monotonic()
        tr.close({"kind": "end", "t": time.time(), "status": "finished", "steps": 100}, timeout=5.0)
        took = time.monotonic() - t0
    finally:
        silent.close()
    # within its timeout, with room for a loaded machine; a close held up by the server that
    # never answers would not return at all
    assert took < 10.0, took
    s = load(tmp_path / "hung.tscope")  # complete although the send never finished
    assert s.status == "finished" and len(s.steps) == 100


def test_files_idle_run_sends_heartbeats(tmp_path: Path, srv: ServerProc) -> None:
    tr = Transport(str(tmp_path / "idle.tscope"), "idle-sid", server=srv.url)
    try:
        tr.emit(_session("idle-sid"))
        _steps(tr, 0, 3)
        assert tr.flush()
        deadline = time.monotonic() + 10
        while tr.sent_seq < tr.writer.seq and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tr.sent_seq == tr.writer.seq, (tr.sent_seq, tr.writer.seq)  # the server has every frame
        seen_after_data = _last_seen(srv, "idle-sid")
        # nothing to send: the thread must still say it is alive (a heartbeat after _HEARTBEAT_S
        # of silence), however slowly this machine gets there
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (tr.heartbeats >= 1 and _last_seen(srv, "idle-sid") > seen_after_data):
            time.sleep(0.2)
        assert tr.heartbeats >= 1
        last_seen = _last_seen(srv, "idle-sid")
        assert last_seen > seen_after_data
        assert last_seen - seen_after_data >= 4.0, (seen_after_data, last_seen)  # a heartbeat, not data
        assert srv.get("/api/sessions/idle-sid")["status"] == "running"  # type: ignore[index]
    finally:
        tr.close({"kind": "end", "t": time.time(), "status": "finished", "steps": 3})


def _last_seen(srv: ServerProc, sid: str) -> float:
    info = srv.get(f"/api/sessions/{sid}")
    assert isinstance(info, dict)
    return float(info["rank_info"][0]["last_seen"])


def test_files_backpressure_sheds_graphs_never_steps(tmp_path: Path) -> None:
    tr = Transport(str(tmp_path / "bp.tscope"), "bp-sid", flush_interval=0.25)
    tr.emit(_session("bp-sid"))
    emitted_ops = 0
    for s in range(400):  # far more graphs than the writer may hold between two flushes
        tr.emit({"kind": "step", "step": s, "graph_captured": True})
        ops = [{"id": i, "name": "aten::mm"} for i in range(50)]
        emitted_ops += len(ops)
        tr.emit({"kind": "graph", "step": s, "ops": ops})
    tr.close({"kind": "end", "t": time.time(), "status": "finished", "steps": 400})
    sess = load(tmp_path / "bp.tscope")
    assert [e["step"] for e in sess.steps] == list(range(400))  # every step kept
    kept = len(sess.graph_steps)
    assert tr.shed > 0 and kept < 400
    assert sess.end is not None and sess.end["shed_ops"] == tr.shed == emitted_ops - 50 * kept


def _sockets_to(port: int) -> int:
    """Sockets of this process connected to ``port`` (from /proc: fds and the TCP table)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for ln in lines if int(ln.split()[2].rsplit(":", 1)[1], 16) == port and ln.split()[9] in inodes)


def test_files_forked_child_never_writes_or_connects(tmp_path: Path, srv: ServerProc) -> None:
    path = tmp_path / "fork.tscope"
    tr = Transport(str(path), "fork-sid", server=srv.url)
    tr.emit(_session("fork-sid"))
    assert tr.flush()
    deadline = time.monotonic() + 10
    while tr.sent_seq < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _sockets_to(srv.port) == 1  # the parent keeps its connection alive
    size_before = path.stat().st_size
    pid = os.fork()
    if pid == 0:  # the child: what a DataLoader worker inherits
        code = 0
        try:
            code = 10 + _sockets_to(srv.port)  # the inherited socket is already closed here
            tr.emit({"kind": "step", "step": 99})
            tr.flush(timeout=0.2)
            tr.close({"kind": "end", "status": "error"})
            time.sleep(0.5)
            code += _sockets_to(srv.port)
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 10  # no socket, before or after trying
    assert path.stat().st_size == size_before
    _steps(tr, 0, 2)
    tr.close({"kind": "end", "t": time.time(), "status": "finished", "steps": 2})
    s = load(path)
    assert [e["step"] for e in s.steps] == [0, 1] and s.status == "finished"
    assert _server_next(srv, "fork-sid") == len(index(path)[1])  # the parent's connection still worked


def _server_next(srv: ServerProc, sid: str) -> int:
    try:
        return int(http_json(f"{srv.url}/api/ingest/{sid}/0/next", timeout=2)["next_seq"])  # type: ignore[index]
    except OSError:
        return -1


def _has_frames(record: Path) -> bool:
    """Whether the run's file holds a frame yet: it is claimed (created empty) before its header
    is written, so a look in between finds an empty file."""
    try:
        return bool(index(record)[1])
    except (OSError, SessionFileError):
        return False


@pytest.mark.parametrize("named", ["url", "auto"])
def test_files_server_killed_and_restarted_twice_ends_with_every_frame(tmp_path: Path, named: str) -> None:
    """``auto``: ``watch(server="auto")`` with ``$TORCHSCOPE_SERVER``, which may start a server
    when none answers at first -- never once the user's had answered: one started then would
    take the restarting server's port with another data directory (HOME is the test's own, so
    a wrongly started one writes nothing outside it)."""
    server = ServerProc(tmp_path / "data").start()
    record = tmp_path / "run.tscope"
    stop = tmp_path / "stop"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TSCOPE_TEST_STOPFILE": str(stop), "HOME": str(tmp_path)}
    if named == "auto":
        env.update(TSCOPE_TEST_SERVER="auto", TORCHSCOPE_SERVER=server.url)
    else:
        env["TSCOPE_TEST_SERVER"] = server.url
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(record), "watch"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _has_frames(record) and time.monotonic() < deadline:
            time.sleep(0.1)
        sid = load(record).session_id
        for sig in (signal.SIGKILL, signal.SIGTERM):
            before = -1
            while before <= 0 and time.monotonic() < deadline:  # the server is receiving
                time.sleep(0.2)
                before = _server_next(server, sid)
            server.stop(sig)
            time.sleep(1.5)  # the run goes on without a server
            server.start()
            # live again: the gap is filled from the file and new frames arrive
            until = time.monotonic() + 30
            while _server_next(server, sid) <= before + 2 and time.monotonic() < until:
                time.sleep(0.2)
            assert _server_next(server, sid) > before + 2, "the run did not resume streaming"
        stop.touch()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
        assert "started one in the background" not in err
        frames = len(index(record)[1])
        sess = load(record)
        assert sess.status == "finished"
        assert _server_next(server, sid) == frames  # every frame of the file, no more, no less
        info = server.get(f"/api/sessions/{sid}")
        assert isinstance(info, dict)
        assert info["steps"] == len(sess.steps) and info["status"] == "finished"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        server.stop()


def test_files_writer_keeps_few_offsets_and_finds_every_frame(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """However long the run, the writer holds the offsets of its latest frames and of every
    MARK_EVERY-th only; any frame is still found, from the headers in the file."""
    monkeypatch.setattr(SessionFileWriter, "RECENT_FRAMES", 8)
    monkeypatch.setattr(SessionFileWriter, "MARK_EVERY", 5)
    w = SessionFileWriter(tmp_path / "many.tscope")
    for k in range(103):  # frames of different sizes
        w.append([{"kind": "step", "step": j, "pad": "x" * (k % 7) * 40} for j in range(1 + k % 4)])
        assert len(w._recent) < 16 and len(w._marks) == k // 5 + 1  # what it keeps in memory
    w.close()
    frames = index(tmp_path / "many.tscope")[1]
    every = [(f.offset, FRAME_HEADER_SIZE + f.length) for f in frames]
    assert len(every) == w.seq == 103
    for start in range(w.seq):
        assert list(w.spans(start)) == every[start:], start
    assert list(w.spans(w.seq)) == [] and list(w.spans(-1)) == []


def test_files_a_late_server_gets_every_frame_from_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that first answers after dozens of frames (or restarted without its data) is
    sent the frames the writer no longer holds offsets for, found again in the file."""
    monkeypatch.setattr(SessionFileWriter, "RECENT_FRAMES", 4)
    monkeypatch.setattr(SessionFileWriter, "MARK_EVERY", 3)
    record = tmp_path / "late.tscope"
    port = free_port()
    tr = Transport(str(record), "late-sid", server=f"http://127.0.0.1:{port}")
    server = ServerProc(tmp_path / "data", port=port)
    try:
        tr.emit(_session("late-sid"))
        for k in range(40):
            _steps(tr, 3 * k, 3 * k + 3)
            assert tr.flush()
        assert tr.writer.seq >= 40 and tr.writer._recent_base > 0  # the first frames' offsets are gone
        server.start()
        tr.close({"kind": "end", "t": time.time(), "status": "finished", "steps": 120}, timeout=30.0)
        frames = len(index(record)[1])
        assert _server_next(server, "late-sid") == frames
        info = server.get("/api/sessions/late-sid")
        assert isinstance(info, dict)
        assert info["steps"] == 120 and info["status"] == "finished"
    finally:
        server.stop()


def test_an_event_json_cannot_hold_is_dropped_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A value the capture did not foresee (here an object JSON cannot encode) costs that event
    only: the other events written in the same frame survive, and the user is told once."""
    path = tmp_path / "odd.tscope"
    tr = Transport(str(path), "odd", rank=0, server=None, flush_interval=60)
    tr.emit(_session("odd"))
    _steps(tr, 0, 3)
    tr.emit({"kind": "step", "step": 3, "t": time.time(), "loss": object()})
    _steps(tr, 4, 6)
    tr.close({"kind": "end", "status": "finished", "steps": 6})
    s = load(path)
    assert [e["step"] for e in s.steps] == [0, 1, 2, 4, 5] and s.status == "finished"
    err = capsys.readouterr().err
    assert err.count("dropped step events that JSON cannot hold") == 1
