"""A disk that stalls during the run (an NFS hiccup, a saturated volume) leaves the writer a
backlog: training never waits for it, and ``close()`` now waits while the disk takes events, so the
file gets every step and its end (QA 51a: a 30 s stall left 15,000 events queued; close() gave up
after 5 s, said nothing, and the run read as killed three quarters from its end).  A disk that
takes nothing for ``_STALL_S`` is given up on, and that is said.

The stall is made by delaying the session-file writer's ``append`` in the training process, as a
blocked ``write()`` would: the transport, the writer and the capture are the real ones."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchscope.sessionfile import iter_events

_SCRIPT = """
import sys, time, torch, torchscope
from torch import nn
from torchscope import sessionfile, transport
path, stall_at, stall_s, give_up_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
transport._STALL_S = give_up_s
state = {"step": 0, "stalled": False}
append = sessionfile.SessionFileWriter.append
def stalling(self, events):
    if not state["stalled"] and state["step"] >= stall_at:
        state["stalled"] = True
        time.sleep(stall_s)  # the disk answers nothing for a while
    return append(self, events)
sessionfile.SessionFileWriter.append = stalling
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w = torchscope.watch(model, opt, server=None, record=path, mode="light")
for i in range(300):
    state["step"] = i
    opt.zero_grad()
    nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 2, (4,))).backward()
    opt.step()
print("trained", flush=True)
if sys.argv[5:] != ["at-exit"]:
    w.close()
"""


def _run(tmp_path: Path, stall_s: float, give_up_s: float) -> tuple[subprocess.CompletedProcess[str], Path, float]:
    script = tmp_path / "stall.py"
    script.write_text(_SCRIPT)
    path = tmp_path / "run.tscope"
    t0 = time.monotonic()
    # the stall begins with the last step's events: at close(), however fast the loop ran
    res = subprocess.run([sys.executable, str(script), str(path), "299", str(stall_s), str(give_up_s)],
                         capture_output=True, text=True, timeout=240)
    return res, path, time.monotonic() - t0


def test_a_backlog_left_by_a_stalled_disk_is_written_before_the_process_exits(tmp_path: Path) -> None:
    res, path, _ = _run(tmp_path, stall_s=12.0, give_up_s=30.0)
    assert res.returncode == 0 and "trained" in res.stdout, res.stderr[-2000:]
    events = list(iter_events(path))
    steps = [e["step"] for e in events if e["kind"] == "step"]
    assert steps == list(range(300))
    (end,) = [e for e in events if e["kind"] == "end"]
    assert end["status"] == "finished"
    assert "events of this run to" in res.stderr and "(the disk is slow)" in res.stderr
    assert "gave up" not in res.stderr


def test_a_disk_that_takes_nothing_is_given_up_on_and_said(tmp_path: Path) -> None:
    res, path, took = _run(tmp_path, stall_s=60.0, give_up_s=3.0)
    assert res.returncode == 0 and "trained" in res.stdout, res.stderr[-2000:]
    assert took < 40  # not the whole stall: the process exits
    assert "gave up writing to" in res.stderr and "the disk took nothing for 3 s" in res.stderr, res.stderr[-2000:]
    steps = [e["step"] for e in iter_events(path) if e["kind"] == "step"]
    assert len(steps) < 300  # what the file lacks is what was said


@pytest.mark.parametrize("how", ["at-exit", "close"])
def test_a_ctrl_c_while_closing_is_one_line(tmp_path: Path, how: str) -> None:
    """A second Ctrl-C landing in the wait for the writer as the interpreter exits (a terminal's
    and ``timeout``'s forwarded SIGINT; a user who will not wait for a slow disk) printed
    "Exception ignored in atexit callback" and a traceback of torchscope's frames (QA 51c); in an
    explicit ``close()`` (a ``with`` block's end) a traceback through the transport's wait and no
    word of what the file lacks (QA 52a).  Now one line; the interrupt goes on to the loop from
    ``close()`` itself."""
    script = tmp_path / "stall.py"
    script.write_text(_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "run.tscope"), "299", "60", "30", how],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # closing, waiting for the stalled disk
            if "(the disk is slow)" in line:
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "interrupted while closing" in err, err
    assert "Exception ignored" not in err and "transport.py" not in err and "threading.py" not in err, err
    if how == "close":  # the user's Ctrl-C stops the script, at its close() line
        assert proc.returncode != 0 and err.rstrip().endswith("KeyboardInterrupt"), err
        assert "w.close()" in err and err.count('File "') == 2, err
    else:
        assert "Traceback" not in err, err
