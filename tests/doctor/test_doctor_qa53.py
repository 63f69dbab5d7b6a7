"""QA 53, on real scripts run in a subprocess: a run NaN from its first step because its inputs
(~1e20) overflowed read as a dead branch beside its P4 error; the overflow message blamed the first
module when the batch itself was huge; a loop that hides NaN with ``torch.nan_to_num`` read as "a
mean over no elements (0/0)" or as a backward that made the NaN; light mode asserted that a prune
mask zeroes a whole weight where a dead input leaves the same gradients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from doctor_runs import script_findings

SCRIPT = '''
import sys

import torch
import torch.nn.functional as F
import torch.nn.utils.prune as prune
from torch import nn

import torchscope

variant, mode, record = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
x_all = torch.randn(256, 16)
labels = (x_all[:, :4] * 2).argmax(1)


def overflow() -> None:
    if variant.startswith("bn"):
        model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    else:
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    if variant == "big_weights":  # a bad initialisation, the batch normal
        with torch.no_grad():
            model[0].weight.mul_(1e20)
    opt = torch.optim.SGD(model.parameters(), lr=1e20 if variant == "bn_lr" else 1e-3)
    scale = 1.0 if variant == "big_weights" else 1e20
    with torchscope.watch(model, opt, server=None, record=record, mode=mode):
        for _ in range(10):
            i = torch.randint(0, 256, (32,))
            opt.zero_grad()
            out = model(x_all[i] * scale)
            if variant == "bn_target":  # the targets in the same units as the inputs: Inf from step 0
                loss = F.mse_loss(out, F.one_hot(labels[i], 4).float() * 1e20)
            elif variant == "bn_lr":  # finite at step 0, then NaN
                loss = F.mse_loss(out, F.one_hot(labels[i], 4).float())
            else:
                loss = F.mse_loss(out, x_all[i, :1] * 2)
            loss.backward()
            opt.step()


def guarded() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with torchscope.watch(model, opt, server=None, record=record, mode=mode):
        for step in range(12):
            i = torch.randint(0, 256, (32,))
            x = x_all[i]
            if step in (3, 7):  # a bad sample now and then
                x = x.clone()
                x[0, 0] = float("nan")
            opt.zero_grad()
            loss = F.cross_entropy(model(x), labels[i])
            if variant == "guard_loss":
                loss = torch.nan_to_num(loss)
            loss.backward()
            if variant == "guard_grads":
                for p in model.parameters():
                    p.grad = torch.nan_to_num(p.grad)
            opt.step()


def pruned() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    if variant == "prune_all":  # the middle layer's mask zeroes all of its weight
        prune.l1_unstructured(model[2], "weight", amount=1.0)
    else:  # the middle layer keeps 70% of its weight, but its input is dead
        prune.l1_unstructured(model[2], "weight", amount=0.3)
        with torch.no_grad():
            model[0].bias.fill_(-100.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with torchscope.watch(model, opt, server=None, record=record, mode=mode):
        for _ in range(12):
            i = torch.randint(0, 256, (32,))
            opt.zero_grad()
            F.cross_entropy(model(x_all[i]), labels[i]).backward()
            opt.step()


if variant.startswith("guard"):
    guarded()
elif variant.startswith("prune"):
    pruned()
else:
    overflow()
'''


def _findings(tmp_path: Path, variant: str, mode: str) -> list[dict[str, Any]]:
    return script_findings(tmp_path, SCRIPT, variant, mode)[1]


def _line(text: str) -> int:
    """The line of the recorded script that holds ``text``."""
    return next(n for n, line in enumerate(SCRIPT.split("\n"), 1) if text in line)


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_run_nan_from_its_first_step_is_no_dead_branch(tmp_path: Path, mode: str) -> None:
    """Inputs of ~1e20: BatchNorm's variance overflows to Inf (its output is its bias alone, its
    gradients and those before it exact zeros) and the loss is Inf from step 0.  P4 alone (QA 53:
    a "Dead branch" warning beside it, in every mode)."""
    found = _findings(tmp_path, "bn_target", mode)
    assert [f["code"] for f in found] == ["P4"], [(f["code"], f["message"]) for f in found]
    if mode != "light":  # the model's output was small: the target overflowed the loss
        (p4,) = found
        assert "The model's output was finite and not large" in p4["message"], p4["message"]
        assert "the target" in p4["message"] and "Check the targets" in p4["fix"], p4


def test_zero_gradients_of_nan_steps_are_no_dead_branch(tmp_path: Path) -> None:
    """Finite at step 0, NaN from step 1 (a learning rate of 1e20): the zeros the NaN steps leave
    judge nothing (QA 53: "Dead branch ... since step 0, every step")."""
    found = _findings(tmp_path, "bn_lr", "light")
    assert [f["code"] for f in found] == ["P4"], [(f["code"], f["message"]) for f in found]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_an_overflow_from_a_huge_batch_names_the_batch(tmp_path: Path, mode: str) -> None:
    """``model(x * 1e20)``: the loss overflows on outputs the first Linear already made huge.  The
    batch was (its weight gradient is ~1e20x its bias gradient), so the fix is the data's (QA 53:
    "blew up upstream, from '0' on", and a fix for the model); weights made huge at the start with
    a normal batch keep "from '0' on"."""
    (p4,) = [f for f in _findings(tmp_path, "huge_input", mode) if f["code"] == "P4"]
    assert "the batch fed to the model already held huge values" in p4["message"], p4["message"]
    assert "from '0' on" not in p4["message"], p4["message"]
    assert "from a batch that was huge before the model saw it: scale the inputs, not the model" in p4["fix"], p4["fix"]

    (p4,) = [f for f in _findings(tmp_path, "big_weights", mode) if f["code"] == "P4"]
    assert "blew up upstream, from '0' on" in p4["message"] and "the batch it read was of ordinary size" in p4["message"], p4["message"]
    assert "batch fed to the model already held" not in p4["message"], p4["message"]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_nan_to_num_is_told_not_an_empty_mean(tmp_path: Path, mode: str) -> None:
    """``p.grad = torch.nan_to_num(p.grad)`` after a batch with a NaN sample: a NaN loss with every
    gradient zero, and the batch held NaN.  Not "a mean over no elements (0/0)" (QA 53): the line
    that zeroes them and the batch."""
    (p4,) = [f for f in _findings(tmp_path, "guard_grads", mode) if f["code"] == "P4"]
    line = _line("p.grad = torch.nan_to_num(p.grad)")
    assert "0/0" not in p4["message"] and "ignore_index" not in p4["message"], p4["message"]
    assert f"torch.nan_to_num at train.py:{line}" in p4["message"], p4["message"]
    assert "input batch at step 3 already held NaN/Inf" in p4["message"], p4["message"]
    assert p4["severity"] == "warning" and "torch.nan_to_num hides a NaN" in p4["fix"], p4


def test_a_loss_made_finite_by_nan_to_num_is_no_backward_nan(tmp_path: Path) -> None:
    """``loss = torch.nan_to_num(loss)``: the recorded loss is 0 and the gradients NaN.  Not "its
    backward made the NaN/Inf" with a fix about sqrt of zero (QA 53): nan_to_num hid the forward's."""
    (p4,) = [f for f in _findings(tmp_path, "guard_loss", "light") if f["code"] == "P4"]
    line = _line("loss = torch.nan_to_num(loss)")
    assert "so its backward made the NaN/Inf" not in p4["message"], p4["message"]
    assert f"torch.nan_to_num (train.py:{line})" in p4["message"], p4["message"]
    assert "the backward need not be the cause" in p4["message"], p4["message"]
    assert p4["fix"].startswith("torch.nan_to_num hides a NaN"), p4["fix"]
    assert "If the value before nan_to_num was finite, the backward made the NaN" in p4["fix"], p4["fix"]


@pytest.mark.parametrize("variant", ["prune_all", "prune_dead_input"])
def test_light_tells_both_causes_of_a_pruned_weight_without_gradient(tmp_path: Path, variant: str) -> None:
    """A mask of zeros on '2', or a mask keeping 70% behind a dead ReLU: light records no module
    outputs, and the two leave the same gradients.  Both are told, with the mask buffer to check
    (QA 53: "The prune mask of '2' zeroes the whole weight (or the layer's input is all zeros ...):
    ... so the layer passes its bias alone", the mask's case asserted, for the dead input too)."""
    (p2,) = [f for f in _findings(tmp_path, variant, "light") if f["code"] == "P2"]
    assert ("The prune mask of '2' zeroes the whole weight (2.weight_mask all zeros), or the mask keeps weights and "
            "the layer's input is all zeros, from a dead layer before it (0.weight and 0.bias get no gradient "
            "either)") in p2["message"], p2["message"]
    assert "records no module outputs (mode='light') to tell which: 2.weight_mask.mean() says" in p2["message"], p2
    assert "The prune mask of '2' zeroes the whole weight:" not in p2["message"], p2["message"]
    assert p2["fix"].startswith("Check the prune mask: module.weight_mask.mean() of '2' (2.weight_mask), 0.0 means the "
                                "mask zeroes the whole weight"), p2["fix"]
    assert "find what zeroes the branch" in p2["fix"], p2["fix"]


def test_default_tells_a_pruned_weight_from_a_dead_input(tmp_path: Path) -> None:
    """With module outputs, default mode tells them apart: the mask (naming 2.weight_mask), or the
    ReLU that never fires (and no word of the mask)."""
    (p2,) = [f for f in _findings(tmp_path, "prune_all", "default") if f["code"] == "P2"]
    assert "The prune mask of '2' zeroes the whole weight:" in p2["message"], p2["message"]
    assert "2.weight_mask" in p2["message"] and "module.weight_mask.mean() of '2' (2.weight_mask)" in p2["fix"], p2
    (p2,) = [f for f in _findings(tmp_path, "prune_dead_input", "default") if f["code"] == "P2"]
    assert "a ReLU whose input is never positive" in p2["message"] and "prune" not in p2["message"], p2["message"]
