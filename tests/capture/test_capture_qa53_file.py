"""QA 53b, the session file's writer: text that is not valid Unicode, a disk full for a moment,
and a file deleted or truncated by another program during the run.

* A byte that is not UTF-8 in ``sys.argv`` or the script's path reaches Python as a lone
  surrogate (surrogateescape): it was written as such, and every reader (and the server)
  refused the whole file.  The encoder now writes ``\\udcXX`` as the text ``\\xXX``.
* A disk full for a second: the buffered file kept the failed frame's bytes, wrote them with
  the next frame, and that frame took the same seq: every reader stopped there.  Frames are now
  written whole or cut off, held with their seq until the disk takes them, and the events of
  the run wait in memory meanwhile.
* ``: > file`` or ``rm file`` during the run lost the whole run silently; the writer now sees it
  (one ``fstat`` every half second) and writes the file again, and says so.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProc, fill, http_json, tiny_disk

import torchscope
from torchscope import sessionfile
from torchscope.sessionfile import (
    RawJSON,
    SessionFileWriter,
    decode_frame,
    encode_frame,
    iter_events,
    salvage,
    unicode_text,
)
from torchscope.transport import Transport


def _events(path: Path) -> list[dict[str, Any]]:
    readable = salvage(path)
    assert readable.damage is None and readable.dropped == 0, readable.note(str(path))
    return list(iter_events(path))


def _steps(path: Path) -> list[int]:
    return [e["step"] for e in _events(path) if e["kind"] == "step"]


def _series_steps(path: Path) -> list[int]:
    """The steps of the whole-run series (series frames + the step frames after the last)."""
    return list(torchscope.load(str(path)).summary()["step"])


# ---------------------------------------------------------------------- text that is not Unicode
def test_lone_surrogates_are_written_as_valid_unicode_the_bytes_kept_readable() -> None:
    argv = os.fsdecode(b"data/caf\xe9.csv")  # what Linux gives Python for a Latin-1 argument
    assert argv == "data/caf\udce9.csv"
    assert unicode_text(argv) == "data/caf\\xe9.csv"
    assert unicode_text("pair \ud83d\ude00, lone \ud800") == "pair \U0001f600, lone \ufffd"
    frame = encode_frame(0, [
        {"kind": "session", "argv": ["train.py", argv, "\U0001f600"], argv: 1},
        {"kind": "log", "message": "ok", "ops": RawJSON('[{"name":"caf\udce9"}]', 1)},
    ])
    _, events = decode_frame(frame)  # raised "frame holds text that is not valid Unicode"
    assert events[0]["argv"] == ["train.py", "data/caf\\xe9.csv", "\U0001f600"]
    assert events[0]["data/caf\\xe9.csv"] == 1
    assert events[1]["ops"] == [{"name": "caf\\xe9"}]
    frame.decode("latin-1").encode("latin-1")  # (bytes) and its payload is UTF-8 every reader takes


_ARGV_SCRIPT = """
import sys, torch, torchscope
from torch import nn
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w = torchscope.watch(model, opt, server=None, record=sys.argv[1], mode="light")
for _ in range(5):
    opt.zero_grad(); model(torch.randn(3, 4)).sum().backward(); opt.step()
w.close()
"""


def test_a_run_whose_argv_and_script_path_are_not_utf8_is_readable(tmp_path: Path) -> None:
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/dir\xe9"))
    folder.mkdir()
    script = folder / "train.py"
    script.write_text(_ARGV_SCRIPT)
    path = tmp_path / "run.tscope"
    res = subprocess.run([sys.executable, os.fsencode(script), os.fsencode(path), b"data/caf\xe9.csv"],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    events = _events(path)
    session = next(e for e in events if e["kind"] == "session")
    assert session["argv"][-1] == "data/caf\\xe9.csv" and "/dir\\xe9/train.py" in session["argv"][0], session
    assert [e["step"] for e in events if e["kind"] == "step"] == list(range(5))
    assert next(e for e in events if e["kind"] == "end")["status"] == "finished"


# ---------------------------------------------------------------------- a disk full for a moment
def test_a_failed_write_leaves_a_frame_boundary_and_is_retried_with_its_seq(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a full disk: os.pwrite writes half a frame, then fails, as on ENOSPC."""
    path = tmp_path / "run.tscope"
    w = SessionFileWriter(path)
    w.append([{"kind": "session", "session_id": "s"}])
    real = os.pwrite
    full = {"on": True}

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if full["on"]:
            if len(data) > 8:
                return real(fd, bytes(data)[: len(data) // 2], offset)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, offset)

    monkeypatch.setattr(sessionfile.os, "pwrite", pwrite)
    with pytest.raises(OSError):
        w.append([{"kind": "step", "step": 0}])
    assert w.seq == 1 and w.held is not None
    assert os.path.getsize(path) == w._end  # the half frame was cut off again
    with pytest.raises(OSError):
        w.write_held()
    assert os.path.getsize(path) == w._end
    full["on"] = False
    assert w.write_held() and w.held is None and w.seq == 2
    w.append([{"kind": "step", "step": 1}])
    w.close()
    assert [i.seq for i in salvage(path).frames] == [0, 1, 2]
    assert _steps(path) == [0, 1]


def _step(i: int) -> dict[str, Any]:
    # a step event of some size (the disk fills within a few of them)
    return {"kind": "step", "step": i, "loss": 1.0 / (i + 1), "pad": [float(i)] * 200}


def _wait(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_disk_full_for_a_moment_loses_no_step_and_leaves_one_frame_chain(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with tiny_disk(tmp_path / "tiny", "4m") as disk:
        path = disk / "run.tscope"
        tr = Transport(str(path), "qa53full", server=None, flush_interval=0.02)
        tr.emit({"kind": "session", "session_id": "qa53full", "rank": 0})
        for i in range(50):
            tr.emit(_step(i))
        assert tr.flush(10)
        filler = fill(disk)
        for i in range(50, 300):
            tr.emit(_step(i))
            time.sleep(0.001)
        _wait(lambda: "write" in tr._warned)  # said: "cannot write ..."
        time.sleep(0.5)  # a few retries, refused
        assert not tr.flush(0.1)  # not in the file yet
        filler.unlink()  # room again
        for i in range(300, 400):
            tr.emit(_step(i))
        tr.close({"kind": "end", "status": "finished", "steps": 400})
        err = capfd.readouterr().err
        # (the old writer: "frame N is out of sequence", the steps after the full disk unreadable)
        assert _steps(path) == list(range(400)) == _series_steps(path)
        assert [e for e in _events(path) if e["kind"] == "end"][0]["status"] == "finished"
        assert "No space left on device" in err and "events wait in memory" in err, err
        assert "the disk takes writes again" in err and "nothing lost" in err, err


def test_a_disk_full_for_a_moment_the_server_gets_every_step_too(tmp_path: Path) -> None:
    """(QA 53b: the server's session "finished" without the steps of the full-disk moment.)"""
    srv = ServerProc(tmp_path / "data").start()  # (its data not on the small disk)
    try:
        with tiny_disk(tmp_path / "tiny", "4m") as disk:
            tr = Transport(str(disk / "run.tscope"), "qa53srv", server=srv.url, flush_interval=0.02)
            tr.emit({"kind": "session", "session_id": "qa53srv", "name": "qa53srv", "rank": 0, "world_size": 1})
            for i in range(50):
                tr.emit(_step(i))
            assert tr.flush(10)
            filler = fill(disk)
            for i in range(50, 300):
                tr.emit(_step(i))
            _wait(lambda: "write" in tr._warned)
            time.sleep(0.5)
            filler.unlink()
            for i in range(300, 400):
                tr.emit(_step(i))
            tr.close({"kind": "end", "status": "finished", "steps": 400}, timeout=15.0)
            assert _steps(disk / "run.tscope") == list(range(400))
            assert tr.sent_seq == tr.writer.seq
        session = http_json(f"{srv.url}/api/sessions/qa53srv")
        assert isinstance(session, dict) and session["steps"] == 400 and session["status"] == "finished", session
    finally:
        srv.stop()


def test_events_beyond_what_memory_holds_while_the_disk_is_full_are_said_lost(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from torchscope import transport
    monkeypatch.setattr(transport, "_MAX_HELD_EVENTS", 40)
    with tiny_disk(tmp_path / "tiny", "4m") as disk:
        path = disk / "run.tscope"
        tr = Transport(str(path), "qa53lost", server=None, flush_interval=0.02)
        tr.emit({"kind": "session", "session_id": "qa53lost", "rank": 0})
        assert tr.flush(10)
        filler = fill(disk)
        for i in range(100):
            tr.emit(_step(i))
        _wait(lambda: tr._refused_since is not None)  # those are held in a frame; the next wait in memory
        for i in range(100, 200):
            tr.emit(_step(i))
        _wait(lambda: tr._lost_events > 0)
        time.sleep(0.2)
        filler.unlink()
        for i in range(200, 220):
            tr.emit(_step(i))
        tr.close({"kind": "end", "status": "finished", "steps": 220})
        err = capfd.readouterr().err
        events = _events(path)
        steps = [e["step"] for e in events if e["kind"] == "step"]
        assert steps[-20:] == list(range(200, 220)) and len(steps) < 220  # everything after is read
        (note,) = [e for e in events if e["kind"] == "log"]
        assert note["level"] == "warning" and "could not wait in memory and are lost" in note["message"]
        line = next(x for x in err.splitlines() if "takes writes again" in x)
        assert "could not wait in memory and are lost (said in the file)" in line, err


def test_a_disk_full_to_the_end_says_what_the_file_lacks(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with tiny_disk(tmp_path / "tiny", "4m") as disk:
        path = disk / "run.tscope"
        tr = Transport(str(path), "qa53end", server=None, flush_interval=0.02)
        tr.emit({"kind": "session", "session_id": "qa53end", "rank": 0})
        for i in range(20):
            tr.emit(_step(i))
        assert tr.flush(10)
        fill(disk)
        for i in range(20, 200):
            tr.emit(_step(i))
        tr.close({"kind": "end", "status": "finished", "steps": 200}, timeout=3.0)
        err = capfd.readouterr().err
        steps = _steps(path)  # readable, no torn tail
        assert steps == list(range(len(steps))) and 20 <= len(steps) < 200
        assert f"the disk refused the end of this run: {path} lacks its last" in err, err
        assert f"(from step {len(steps)} on)" in err, err


# ---------------------------------------------------------------------- the file under the writer
def _run_until(tr: Transport, lo: int, hi: int) -> None:
    for i in range(lo, hi):
        tr.emit(_step(i))
    assert tr.flush(10)


def test_a_file_deleted_during_the_run_is_written_again_whole(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.tscope"
    tr = Transport(str(path), "qa53del", server=None, flush_interval=0.02)
    tr.emit({"kind": "session", "session_id": "qa53del", "rank": 0})
    _run_until(tr, 0, 100)
    path.unlink()
    time.sleep(0.6)
    _run_until(tr, 100, 200)
    tr.close({"kind": "end", "status": "finished", "steps": 200})
    err = capfd.readouterr().err
    assert path.exists()  # (the old writer: no file, nothing said)
    assert _steps(path) == list(range(200)) == _series_steps(path)
    assert f"torchscope: {path} was deleted during the run; written again at its path" in err, err


def test_a_file_truncated_during_the_run_is_written_again_from_its_header(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.tscope"
    tr = Transport(str(path), "qa53trunc", server=None, flush_interval=0.02)
    tr.emit({"kind": "session", "session_id": "qa53trunc", "rank": 0})
    _run_until(tr, 0, 300)  # (past a series frame)
    with open(path, "wb"):  # `: > file`, while the run goes on (written past before it is seen)
        pass
    for i in range(300, 400):
        tr.emit(_step(i))
        time.sleep(0.005)
    assert tr.flush(10)
    tr.close({"kind": "end", "status": "finished", "steps": 400})
    err = capfd.readouterr().err
    events = _events(path)  # (the old writer: "not a torchscope session file")
    assert events[0]["kind"] == "session"
    steps = [e["step"] for e in events if e["kind"] == "step"]
    assert steps == list(range(steps[0], 400)) and steps[0] >= 250
    (note,) = [e for e in events if e["kind"] == "log"]
    assert "this file was cut short during the run" in note["message"]
    assert events[-1]["kind"] == "end"
    assert f"torchscope: {path} was cut short during the run (by another program); written again" in err, err
    assert _series_steps(path) == steps  # the series frames cover exactly the step frames there are


def test_a_rewrite_the_full_disk_refuses_is_tried_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """QA 53d: a file cut short while the disk was full was never written again once it had
    room: it stayed "not a torchscope session file" though the run said nothing was lost."""
    path = tmp_path / "run.tscope"
    w = SessionFileWriter(path)
    w.append([{"kind": "session", "session_id": "s", "rank": 0}])
    for i in range(5):
        w.append([_step(i)])
    with open(path, "wb"):  # `: > file`
        pass
    real = SessionFileWriter._write_at

    def full(self: SessionFileWriter, data: bytes, offset: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(SessionFileWriter, "_write_at", full)
    said = w.check()
    assert said is not None and "no room to write it again yet" in said, said
    assert w.check() is None  # said once, tried again
    monkeypatch.setattr(SessionFileWriter, "_write_at", real)
    said = w.check()
    assert said is not None and "written again from its header" in said, said
    w.append([_step(5)])
    w.close()
    events = _events(path)
    assert events[0]["kind"] == "session" and [e["step"] for e in events if e["kind"] == "step"] == [5]


def test_a_file_moved_during_the_run_is_still_streamed_to_the_server(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """QA 53d: the stream to the server read the frames back by the file's name; after a `mv`
    nothing was there, and the run said the (running) server was "not reachable
    (FileNotFoundError)", which then stayed at the steps before the move."""
    srv = ServerProc(tmp_path / "data").start()
    try:
        path, moved = tmp_path / "run.tscope", tmp_path / "elsewhere.tscope"
        tr = Transport(str(path), "qa53mv", server=srv.url, flush_interval=0.02)
        tr.emit({"kind": "session", "session_id": "qa53mv", "name": "qa53mv", "rank": 0, "world_size": 1})
        _run_until(tr, 0, 20)
        _wait(lambda: tr.sent_seq == tr.writer.seq)
        os.rename(path, moved)
        _run_until(tr, 20, 200)
        tr.close({"kind": "end", "status": "finished", "steps": 200}, timeout=15.0)
        err = capfd.readouterr().err
        assert "not reachable" not in err, err
        assert _steps(moved) == list(range(200))
        session = http_json(f"{srv.url}/api/sessions/qa53mv")
        assert isinstance(session, dict) and session["steps"] == 200 and session["status"] == "finished", session
    finally:
        srv.stop()


def test_doctor_and_info_count_the_steps_a_file_holds(tmp_path: Path) -> None:
    """QA 53d: of a file whose early frames were lost (cut short, written again), `doctor` said
    its last step + 1 (15), `info` the steps it holds (5)."""
    path = tmp_path / "run.tscope"
    w = SessionFileWriter(path)
    w.append([{"kind": "session", "session_id": "s", "rank": 0, "world_size": 1, "name": "s", "params": []}])
    for i in range(10):
        w.append([{"kind": "step", "step": i, "loss": 1.0}])
    with open(path, "wb"):
        pass
    assert "written again" in (w.check() or "")
    for i in range(10, 15):
        w.append([{"kind": "step", "step": i, "loss": 1.0}])
    w.append([{"kind": "end", "status": "finished", "steps": 15}])
    w.close()
    doctor = subprocess.run([sys.executable, "-m", "torchscope", "doctor", str(path)], capture_output=True, text=True, timeout=120)
    info = subprocess.run([sys.executable, "-m", "torchscope", "info", str(path)], capture_output=True, text=True, timeout=120)
    assert "(5 steps)" in doctor.stdout or ", 5 steps" in doctor.stdout, doctor.stdout + doctor.stderr
    assert any(line.split()[:2] == ["steps:", "5"] for line in info.stdout.splitlines()), info.stdout
