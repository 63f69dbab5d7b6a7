"""P4 on a run that stopped at its first NaN: the loop checked the loss and raised
(``if torch.isnan(loss): raise``) before that step's backward.  The doctor said "no problems
found" -- the step was never written (no backward, no step event).  Now the capture keeps what
that step tells: the loss the loop checked, the parameters and inputs its forward read
non-finite, and on a step whose ops it recorded (full mode) those ops, as a graph marked
``failed`` -- so the doctor names the op, or says what is known and how to learn the rest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import forkrun
import pytest
import torch
from conftest import NAN_CRASH
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

LOG_LINE = "h = torch.log(h - 1.0)  # the bug"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, bad: bool) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if bad:
            h = torch.log(h - 1.0)  # the bug
        return self.b(h)


def _run(tmp_path: Path, mode: str, *, bad_op: int = -1, bad_batch: int = -1, finite_error: int = -1,
         check: bool = True) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / f"{mode}.tscope"
    with pytest.raises(RuntimeError), torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(12):
            x, y = torch.randn(32, 8), torch.randn(32, 1)
            if step == bad_batch:
                x[3, 2] = float("nan")
            opt.zero_grad()
            loss = ((model(x, step == bad_op) - y) ** 2).mean()
            if step == finite_error:
                raise RuntimeError("a bug of the loop that has nothing to do with NaN")
            if check and torch.isnan(loss):
                raise RuntimeError(f"loss is NaN at step {step}")
            if not check and step == max(bad_op, bad_batch):
                raise RuntimeError("the loop raised after a forward it did not check")
            loss.backward()
            opt.step()
    return list(iter_events(path))


def _p4(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(f) for f in diagnose(events) if f["code"] == "P4"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_run_stopped_on_a_nan_loss_is_p4_at_that_step(tmp_path: Path, mode: str) -> None:
    events = _run(tmp_path, mode, bad_op=7)
    end = events[-1]
    assert end["kind"] == "end" and end["status"] == "error" and end["steps"] == 7
    (fwd,) = end["forwards"]
    assert fwd["loss"] != fwd["loss"]  # the NaN the loop checked
    assert {"what": "params_nonfinite", "params": []} in end["events"]
    assert {"what": "inputs_nonfinite", "inputs": [], "read": 1} in end["events"]
    (f,) = _p4(events)
    assert f["severity"] == "error" and f["steps"] == [7], f
    assert "where the run stopped before its backward (RuntimeError: loss is NaN at step 7)" in f["message"], f
    failed = [e for e in events if e["kind"] == "graph" and e.get("failed")]
    if mode == "full":
        # its ops, the forward's and the loss's, ending with the loop's check -- none of ours after it
        (g,) = failed
        assert g["step"] == 7 and g["nodes"] == [] and g["ops"][-1]["src"].endswith(f":{_line('if check and torch.isnan')}")
        assert f["message"].startswith("NaN/Inf first produced by aten::log at step 7"), f
        assert f["src"].endswith(f":{_line(LOG_LINE)}") and f["view"] == "graph"
        assert [t.get("op") for t in f["targets"]] == [next(o["id"] for o in g["ops"] if o["name"] == "aten::log")]
    else:
        assert not failed
        assert f["message"].startswith("The loss was NaN/Inf at step 7"), f
        assert "its parameters and its input batch were finite" in f["message"] and "mode='full'" in f["message"], f


@pytest.mark.parametrize("mode", ["light", "full"])
def test_a_nan_batch_the_loop_stopped_on_is_the_datas(tmp_path: Path, mode: str) -> None:
    (f,) = _p4(_run(tmp_path, mode, bad_batch=4))
    assert f["steps"] == [4] and "input batch at step 4 already held NaN/Inf" in f["message"], f
    assert f["fix"].startswith("The batch held NaN/Inf before the model saw it"), f


def test_an_unchecked_nan_is_still_named_from_full_modes_ops(tmp_path: Path) -> None:
    """The loop raised for its own reason after a NaN forward it never checked: no loss known,
    but full mode's ops show the NaN and where it began."""
    events = _run(tmp_path, "full", bad_op=5, check=False)
    assert "loss" not in events[-1]["forwards"][0]
    (f,) = _p4(events)
    assert f["message"].startswith("NaN/Inf first produced by aten::log at step 5"), f


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_run_stopped_by_an_error_with_a_finite_loss_is_no_p4(tmp_path: Path, mode: str) -> None:
    events = _run(tmp_path, mode, finite_error=6)
    assert events[-1]["status"] == "error" and not _p4(events)
    assert not [f for f in diagnose(events) if f["severity"] != "info"]


def _line(text: str) -> int:
    """The line of this file's code that begins with ``text``."""
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if line.strip().startswith(text))




def test_the_doctor_cli_names_the_op_of_a_script_that_died_on_its_nan(tmp_path: Path) -> None:
    script, path = tmp_path / "crash.py", tmp_path / "crash.tscope"
    script.write_text(NAN_CRASH)
    res = forkrun.run([str(script), str(path)], timeout=120)
    assert res.returncode != 0 and "FloatingPointError: non-finite loss at step 3" in res.stderr
    doc = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "doctor", str(path)], capture_output=True,
                         text=True, timeout=120)
    assert doc.returncode == 1, doc.stderr  # an error-level finding
    assert "ERROR P4" in doc.stdout and "NaN/Inf first produced by aten::div at step 3, where the run stopped" in doc.stdout
    assert "source: crash.py:11" in doc.stdout, doc.stdout
