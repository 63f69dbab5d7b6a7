"""A part of the capture that fails (a torchscope bug) turns itself off and the training goes
on unchanged -- and the user is told: one line at the terminal, a ``torchscope info`` line and
a doctor finding, never a file that reads "0 steps, finished" / "no step recorded, nothing to
diagnose" with nothing said anywhere (QA 38a saw exactly that, after a NameError)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_script

from torchscope.session import load

SCRIPT = Path(__file__).with_name("train_capture_off.py")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchscope.server.cli", *args], capture_output=True, text=True,
                          timeout=120)


def _losses(out: str) -> list[str]:
    return next(line for line in out.splitlines() if line.startswith("LOSSES")).split()[1:]


@pytest.mark.parametrize("fail_at", [0, 3])
def test_step_recording_turned_off_is_said_everywhere(tmp_path: Path, fail_at: int) -> None:
    record = tmp_path / "run.tscope"
    plain = run_script(SCRIPT, str(tmp_path / "plain.tscope"), "default", "-1")
    res = run_script(SCRIPT, str(record), "default", str(fail_at))
    assert _losses(res.stdout) == _losses(plain.stdout)  # the training did not change
    told = [line for line in res.stderr.splitlines() if "turned off" in line]
    assert len(told) == 1, res.stderr
    assert told[0].startswith(f"torchscope: capture of step turned off at step {fail_at} after an internal error: "
                              "NameError(")
    assert "your training goes on unchanged" in told[0]
    assert len(load(record).steps) == fail_at
    (off,) = [e for e in load(record).logs if e["level"] == "error"]
    assert off["capture_off"]["part"] == "step" and off["capture_off"]["error"].startswith("NameError(")

    info = _cli("info", str(record))
    assert info.returncode == 0, info.stderr
    line = next(x for x in info.stdout.splitlines() if x.startswith("capture:"))
    assert f"capture of step turned off at step {fail_at}" in line and "NameError" in line

    doctor = _cli("doctor", str(record))
    assert "no step recorded" not in doctor.stdout and "no problems found" not in doctor.stdout
    assert "The capture stopped recording step" in doctor.stdout, doctor.stdout
    assert f"turned itself off at step {fail_at}" in doctor.stdout
    assert "a torchscope bug" in doctor.stdout


def test_a_failing_part_beside_the_step_leaves_the_steps_recorded(tmp_path: Path) -> None:
    """The module outputs' rows failing turn off the module outputs alone: every step is still
    recorded, and the doctor says which part is missing."""
    record = tmp_path / "run.tscope"
    res = run_script(SCRIPT, str(record), "full", "2", "activations")
    steps = load(record).steps
    assert len(steps) == 12
    assert [e["step"] for e in steps if "activations" in e] == [0, 1]
    assert "capture of activations turned off at step 2" in res.stderr
    doctor = _cli("doctor", str(record))
    assert "The capture stopped recording activations" in doctor.stdout


def test_a_failure_inside_the_optimizer_step_hook_never_reaches_the_loop(tmp_path: Path) -> None:
    """The global hook every optimizer's step() runs (adopting the loop's optimizer for
    ``watch(model)``) failing: the step recording turns off, optimizer.step() raises nothing
    (QA 48a's loop met such a bug of ours as a TypeError out of its own step())."""
    record = tmp_path / "run.tscope"
    plain = run_script(SCRIPT, str(tmp_path / "plain.tscope"), "default", "-1")
    res = run_script(SCRIPT, str(record), "default", "0", "adopt")
    assert res.returncode == 0, res.stderr
    assert _losses(res.stdout) == _losses(plain.stdout)
    assert "capture of step turned off at step 0 after an internal error: NameError(" in res.stderr
