"""Which file a run records to: never one another running watch or process is writing (two runs
started in one second once shared a default name and both were lost; an explicit ``record=``
path was truncated under a live run), yet a finished run's file is written over when the user
names it again.  And a malformed ``$TORCHSCOPE_SERVER`` never stops the training."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events

HOLDER = textwrap.dedent("""
    import sys, time, torch, torchscope
    from torch import nn
    model = nn.Linear(4, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    def train(n):
        for _ in range(n):
            opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
    w = torchscope.watch(model, opt, server=None, record=sys.argv[1])
    train(5)
    w.flush()
    print("ready", flush=True)
    sys.stdin.readline()  # until the test has started its own run on the same path
    train(5)
    w.close()
""")


def _train(w_model: nn.Module, steps: int) -> None:
    opt = torch.optim.SGD(w_model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        w_model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()


def _steps(path: str | Path) -> int:
    return sum(1 for e in iter_events(path) if e["kind"] == "step")


def test_a_path_another_process_is_writing_is_left_to_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.tscope"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        model = nn.Linear(4, 2)
        w = torchscope.watch(model, server=None, record=path)
        assert w.path == str(tmp_path / "run-2.tscope")
        assert "being written by another run" in capsys.readouterr().err
        _train(model, 3)
        w.close()
    finally:
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.close()
        assert holder.wait(timeout=120) == 0
    assert _steps(path) == 10  # the other process's run, whole
    assert _steps(tmp_path / "run-2.tscope") == 3


def test_two_watches_of_one_process_and_a_finished_file(tmp_path: Path) -> None:
    path = tmp_path / "gan.tscope"
    gen, disc = nn.Linear(4, 2), nn.Linear(4, 2)
    w1 = torchscope.watch(gen, server=None, record=path)
    w2 = torchscope.watch(disc, server=None, record=path)  # the same path, by mistake
    assert (w1.path, w2.path) == (str(path), str(tmp_path / "gan-2.tscope"))
    _train(gen, 2)
    _train(disc, 4)
    w2.close()
    w1.close()
    assert (_steps(path), _steps(tmp_path / "gan-2.tscope")) == (2, 4)
    # a re-run of the script names the finished file again: it is written over, as it always was
    again = torchscope.watch(nn.Linear(4, 2), server=None, record=path)
    assert again.path == str(path)
    again.close()
    assert _steps(path) == 0


RESTARTS = textwrap.dedent("""
    import os, sys, torch, torchscope
    from torch import nn
    model = nn.Linear(4, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = torchscope.watch(model, opt, server=None, record=sys.argv[1])
    for _ in range(3):
        opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
    if len(sys.argv) == 2:  # the first incarnation restarts itself (a resumable job's self-restart)
        w.flush()  # what the writer thread has written by then, all of it: the count below exact
        os.execv(sys.executable, [sys.executable, __file__, sys.argv[1], "again"])
""")


def test_a_self_restart_by_exec_keeps_its_first_half(tmp_path: Path) -> None:
    """A process that exec's itself has the same pid: its first program's file was taken for a
    finished earlier run's and written over.  Now the second program records beside it."""
    script = tmp_path / "restarts.py"
    script.write_text(RESTARTS)
    path = tmp_path / "run.tscope"
    res = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert (f"torchscope: {path} holds this process's run from before it exec'd itself (kept); "
            f"recording to {tmp_path / 'run-2.tscope'}") in res.stderr
    first, second = list(iter_events(path)), list(iter_events(tmp_path / "run-2.tscope"))
    assert first[0]["pid"] == second[0]["pid"]  # one process, two programs
    assert first[0]["started_at"] < second[0]["started_at"]
    assert sum(e["kind"] == "step" for e in first) == 3 and sum(e["kind"] == "step" for e in second) == 3


def test_default_names_started_in_one_second_differ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    models = [nn.Linear(4, 2) for _ in range(3)]
    watches = [torchscope.watch(m, server=None, name="sweep") for m in models]
    paths = [w.path for w in watches]
    for w in watches:
        w.close()
    assert len(set(paths)) == 3 and all(p is not None and os.path.exists(p) for p in paths)


def test_a_malformed_server_url_in_the_environment_never_stops_training(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TORCHSCOPE_SERVER", "http://[::1")
    model = nn.Linear(4, 2)
    w = torchscope.watch(model, record=tmp_path / "env.tscope")  # server="auto" reads it
    _train(model, 2)
    w.close()
    assert "is not an http(s) URL; recording to the file only" in capsys.readouterr().err
    assert _steps(tmp_path / "env.tscope") == 2


def test_a_file_that_is_no_session_is_never_written_over(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``record=`` naming the user's checkpoint (a typo, a path reused) left it a session file."""
    ckpt = tmp_path / "checkpoint.pt"
    ckpt.write_bytes(b"PK\x03\x04 the user's weights")
    model = nn.Linear(4, 2)
    with torchscope.watch(model, server=None, record=ckpt) as w:
        _train(model, 3)
    assert ckpt.read_bytes() == b"PK\x03\x04 the user's weights"
    assert w.path == str(tmp_path / "checkpoint.pt-2.tscope") and _steps(w.path) == 3
    assert "is not a torchscope session file (left as it is)" in capsys.readouterr().err


def test_a_directory_given_as_record_holds_the_run(tmp_path: Path) -> None:
    model = nn.Linear(4, 2)
    with torchscope.watch(model, server=None, record=tmp_path, name="probe") as w:
        _train(model, 2)
    assert w.path is not None and Path(w.path).parent == tmp_path and Path(w.path).name.startswith("probe-")
    assert _steps(w.path) == 2


def test_a_pipe_or_device_is_never_written_into_nor_removed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``record="/dev/null"`` as root removed the device node; a FIFO stands in for it here."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    w = torchscope.watch(model, server=None, record=fifo)
    _train(model, 2)  # trains as it would: nothing watched
    w.close()
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]
    assert "is not a regular file: not watching this run" in capsys.readouterr().err


def test_a_folder_that_cannot_be_written_sends_the_run_to_the_temporary_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only record folder (a container's working directory, without ``record=``) made
    ``watch()`` raise and the training never start.  A file where a folder should be fails the
    same way for root too."""
    import tempfile

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    model = nn.Linear(4, 2)
    with torchscope.watch(model, server=None, record=blocker / "run.tscope") as w:
        _train(model, 2)
    assert w.path == str(tmp_path / "tmp" / "torchscope-runs" / "run.tscope") and _steps(w.path) == 2
    # the reason is the folder that is a file (makedirs says "File exists": QA 49c)
    assert f"cannot record to {blocker / 'run.tscope'} ({blocker} is not a directory)" in capsys.readouterr().err
    # the same run again: its finished file in the temporary folder is written over, as it would
    # have been where it was asked for ("being written by another run", said of it: QA 49c)
    with torchscope.watch(model, server=None, record=blocker / "run.tscope") as w:
        _train(model, 3)
    assert w.path == str(tmp_path / "tmp" / "torchscope-runs" / "run.tscope") and _steps(w.path) == 3
    assert "another run" not in capsys.readouterr().err
    monkeypatch.setattr(tempfile, "tempdir", str(blocker / "tmp"))  # and no temporary folder either
    w = torchscope.watch(model, server=None, record=blocker / "run.tscope")
    _train(model, 2)
    w.close()
    assert w.path is None and "not watching this run" in capsys.readouterr().err


def test_a_full_disk_at_watch_leaves_no_empty_file_behind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No space for the file's header: the run records to the temporary directory's spare file
    instead, said, and leaves no empty file under the name -- left there, a later run naming it
    found "no session file" and went to ``-2``.  (Until the thirty-sixth session the empty
    file was claimed first, its header failing later: the run was not watched at all.)"""
    from conftest import fill, tiny_disk

    with tiny_disk(tmp_path / "disk", "1m") as disk:
        filler = fill(disk)
        model = nn.Linear(4, 2)
        w = torchscope.watch(model, server=None, record=disk / "run.tscope")
        _train(model, 2)  # trains as it would
        w.close()
        err = capsys.readouterr().err
        assert f"cannot record to {disk / 'run.tscope'} (No space left on device); recording to " in err, err
        assert w.path is not None and not w.path.startswith(str(disk)) and _steps(w.path) == 2
        os.unlink(w.path)
        assert not (disk / "run.tscope").exists()
        filler.unlink()
        with torchscope.watch(model, server=None, record=disk / "run.tscope") as w:
            _train(model, 2)
        assert w.path == str(disk / "run.tscope") and _steps(w.path) == 2
