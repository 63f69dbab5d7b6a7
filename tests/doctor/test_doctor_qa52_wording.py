"""Five findings QA 51b read as pointing at the wrong place, on real scripts run in a subprocess:
P7's holder line was the forward's (or the backward's), not the ``.append`` that keeps the
tensors; P10's fix put a carried hidden state's ``.detach()`` behind five other ways; an
evaluation's graph kept by ``val_loss += criterion(...)`` blamed "a module-level `loss`"; a
clip after ``optimizer.step()`` was titled "clipped before backward()"; and an RNN whose
activations grew to 1e19 before the loss overflowed got P4 at ``aten::mse_loss`` with the fix for
log/sqrt/div."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from doctor_runs import script_findings

from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

SCRIPT = '''
import sys

import torch
import torch.nn.functional as F
from torch import nn

import torchscope

variant, mode, record = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)


class Seq(nn.Module):
    def __init__(self, relu: bool) -> None:
        super().__init__()
        self.rnn = nn.RNN(4, 16, batch_first=True, nonlinearity="relu" if relu else "tanh")
        self.head = nn.Linear(16, 1)

    def forward(self, x, h=None):
        y, h = self.rnn(x, h)
        return self.head(y[:, -1]), h


def clip(model) -> None:
    nn.utils.clip_grad_norm_(model.parameters(), 0.01)  # CLIP HELPER


def mlp() -> None:
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    outs, history = [], []
    val = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(4)]
    with torchscope.watch(model, opt, server=None, record=record, mode=mode):
        for epoch in range(3):
            model.train()
            for _ in range(8):
                x, y = torch.randn(16, 8), torch.randn(16, 1)
                opt.zero_grad()
                out = model(x)  # FORWARD
                if variant == "outs":
                    outs.append(out)  # KEEPS OUTPUTS
                loss = F.mse_loss(out, y)
                loss.backward()  # BACKWARD
                if variant == "history":
                    history.append(loss)  # KEEPS LOSSES
                if variant == "clip_oneline":
                    opt.step(); nn.utils.clip_grad_norm_(model.parameters(), 0.01)  # CLIP ONE LINE
                else:
                    opt.step()
                if variant == "clip_after":
                    nn.utils.clip_grad_norm_(model.parameters(), 0.01)  # CLIP AFTER STEP
                if variant == "clip_helper":
                    clip(model)
            if variant == "val":
                model.eval()
                val_loss = 0.0
                for x, y in val:
                    val_loss += F.mse_loss(model(x), y)  # VALIDATION SUM
                print(f"epoch {epoch}: {float(val_loss) / len(val):.3f}")


def rnn() -> None:
    model = Seq(relu=variant == "overflow")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(8, 60, 4)
    h = None
    with torchscope.watch(model, opt, server=None, record=record, mode=mode):
        for i in range(6):
            x = data[:, i * 10:(i + 1) * 10]
            if variant == "overflow":
                x = x * 1e21  # raw readings, never normalised
            opt.zero_grad()
            out, h = model(x, h)  # truncated BPTT: h carried, never detached
            if variant == "overflow":
                h = None
            loss = F.mse_loss(out, x.sum((1, 2)).unsqueeze(1) * 1e-21)
            loss.backward()
            opt.step()


if variant in ("bptt", "overflow"):
    try:
        rnn()
    except RuntimeError as exc:  # the user's loop stops here
        assert "a second time" in str(exc), exc
else:
    mlp()
'''


def _line(marker: str) -> str:
    return "train.py:" + str(next(i for i, text in enumerate(SCRIPT.splitlines(), 1) if f"# {marker}" in text))


# the script's text not recorded in the file (format 1.14, save_code): the doctor reads the
# script from the disk, as it did before and does for such files (with the text recorded it
# reads that, wherever the script went: tests/doctor/test_doctor_source_recorded.py)
DISK_ONLY = {"TORCHSCOPE_SAVE_CODE": "0"}


def _findings(tmp_path: Path, variant: str, mode: str,
              env: dict[str, str] | None = None) -> tuple[Path, list[dict[str, Any]]]:
    return script_findings(tmp_path, SCRIPT, variant, mode, env)


def _edited(script: Path, tmp_path: Path, variant: str, mode: str) -> list[dict[str, Any]]:
    """The findings once the script was edited after the run: its lines are not the recorded ones."""
    later = script.stat().st_mtime + 3600
    os.utime(script, (later, later))
    return [dict(f) for f in diagnose(iter_events(tmp_path / f"{variant}_{mode}.tscope"))]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("variant", ["outs", "history"])
def test_p7_points_at_the_append_that_keeps_the_tensors(tmp_path: Path, variant: str, mode: str) -> None:
    """``outs.append(out)`` / ``history.append(loss)`` is no torch call, never recorded: the
    doctor reads the line in the script (still there, unchanged since the run) -- before, the
    source was the forward's (the backward's) line, which keeps nothing."""
    script, found = _findings(tmp_path, variant, mode, DISK_ONLY)
    (p7,) = [f for f in found if f["code"] == "P7"]
    keeps = _line("KEEPS OUTPUTS" if variant == "outs" else "KEEPS LOSSES")
    name = "'outs' (a list)" if variant == "outs" else "'history' (a list)"
    assert p7["src"] == keeps, p7
    assert f"held by {name}, filled at {keeps}:" in p7["message"], p7["message"]
    # the script edited since: its lines are not the run's, so the source is the recorded line,
    # said to be what it is
    (p7,) = [f for f in _edited(script, tmp_path, variant, mode) if f["code"] == "P7"]
    made = _line("FORWARD" if variant == "outs" else "BACKWARD")
    assert p7["src"] == made and "filled at" not in p7["message"], p7
    assert f"The line that puts them there is not recorded (no torch call), so the source shown, {made}, is" in p7["message"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_p10_of_a_carried_hidden_state_puts_its_detach_first(tmp_path: Path, mode: str) -> None:
    """Truncated BPTT with ``h`` carried into the next batch undetached: the second backward goes
    into the first batch's freed graph.  The fix began "sum the losses first" and listed the
    detach second of six."""
    _, found = _findings(tmp_path, "bptt", mode)
    (p10,) = [f for f in found if f["code"] == "P10"]
    assert p10["fix"].startswith("Detach the state carried from one batch to the next before the next forward -- "
                                 "hidden = hidden.detach()"), p10["fix"]
    # the other ways stay, after it
    fix = p10["fix"]
    assert fix.index("hidden.detach()") < fix.index("sum the losses") < fix.index("netD(fake.detach())"), fix
    assert "del saved_log_probs[:]" in fix and "retain_graph=True only if you really must" in fix
    assert f"the previous batch's output from the forward at {_line('truncated BPTT')} was carried into this batch's " \
           "forward without .detach()" in p10["message"], p10["message"]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_an_evaluation_summed_without_item_names_its_sum(tmp_path: Path, mode: str) -> None:
    """``val_loss += F.mse_loss(model(x), y)`` after each epoch, no ``.item()``, no ``no_grad``:
    the graph it keeps was blamed on "a module-level `loss` of a first training loop"."""
    script, found = _findings(tmp_path, "val", mode, DISK_ONLY)
    (p7,) = [f for f in found if f["code"] == "P7"]
    line = _line("VALIDATION SUM")
    assert p7["title"] == "Graph of an earlier step held" and p7["src"] == line, p7
    assert "module-level `loss`" not in p7["message"], p7["message"]
    assert f"the evaluation forward at {line} (after step 15) ran with autograd on" in p7["message"], p7["message"]
    assert "`val_loss`, summed at" in p7["message"] and "`val_loss += criterion(...).item()`" in p7["fix"], p7
    # the script edited since: no name read from it, and none made up
    (p7,) = [f for f in _edited(script, tmp_path, "val", mode) if f["code"] == "P7"]
    assert "module-level `loss`" not in p7["message"] and "val_loss" not in p7["message"], p7["message"]
    assert f"the evaluation forward at {line} (after step 15)" in p7["message"] and "torch.no_grad()" in p7["fix"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_clip_after_step_is_said_after_step(tmp_path: Path, mode: str) -> None:
    _, found = _findings(tmp_path, "clip_after", mode)
    (p3,) = [f for f in found if f["code"] == "P3"]
    assert p3["title"] == "Gradients clipped after optimizer.step()", p3
    assert p3["src"] == _line("CLIP AFTER STEP")
    assert f"clip_grad_norm_() at {_line('CLIP AFTER STEP')} ran after optimizer.step()" in p3["message"], p3["message"]
    assert "before loss.backward()" not in p3["message"]
    assert p3["fix"].startswith("Clip between backward() and step()"), p3["fix"]
    # the clip after step N's update is seen at step N+1's boundary: told as step N's
    assert p3["steps"][0] == 0, p3["steps"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize(("variant", "marker"), [("clip_helper", "CLIP HELPER"), ("clip_oneline", "CLIP ONE LINE")])
def test_a_clip_after_step_elsewhere_is_said_after_step(tmp_path: Path, mode: str, variant: str, marker: str) -> None:
    """The clip in a helper defined above the loop, or on ``optimizer.step()``'s own line: the
    lines' order cannot tell, and it read "clipped before backward()" (QA 52c).  The capture
    says it came before any forward of the step, on the last step's (non-zero) gradients."""
    _, found = _findings(tmp_path, variant, mode)
    (p3,) = [f for f in found if f["code"] == "P3"]
    assert p3["title"] == "Gradients clipped after optimizer.step()", p3
    assert p3["src"] == _line(marker)
    assert f"clip_grad_norm_() at {_line(marker)} ran after optimizer.step()" in p3["message"], p3["message"]
    assert p3["fix"].startswith("Clip between backward() and step()"), p3["fix"]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_loss_overflowing_on_huge_activations_names_them(tmp_path: Path, mode: str) -> None:
    """A ReLU RNN fed raw readings of ~1e20: every module output is finite, the loss squares
    ~1e19 into Inf.  P4 named ``aten::mse_loss`` with the fix for log/sqrt/div of zero."""
    _, found = _findings(tmp_path, "overflow", mode)
    (p4,) = [f for f in found if f["code"] == "P4"]
    assert "first produced by aten::mse_loss at step 0" in p4["message"], p4["message"]
    assert "Its inputs were finite but huge -- the outputs of 'rnn' (RNN) up to " in p4["message"], p4["message"]
    # (QA 53: fed raw readings, the batch itself was huge -- said so since the fifty-third session)
    assert "They were huge from the model's input on: 'rnn' (RNN), the first module" in p4["message"], p4["message"]
    assert "the batch fed to the model already held huge values" in p4["message"]
    assert "rnn" in p4["modules"] and {"step": 0, "rank": 0, "module": "rnn"} in p4["targets"], p4
    assert p4["fix"].startswith("The values grew past what float32 holds") and "scale the inputs" in p4["fix"], p4["fix"]
    assert "log/sqrt/div" not in p4["fix"]
