"""A batch with nothing to average: cross_entropy over targets that are all ``ignore_index``, or
``loss[mask].mean()`` with an empty mask, is 0/0 = NaN, and its backward sends zeros -- the
model stays finite.  P4 said "a NaN/Inf in their data, or an op that overflows ... add an eps,
clamp" (an error; QA 46a).  It is a warning that names the empty mean and how to skip it; a NaN
batch that poisons the model stays an error."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _run(path: Path, mode: str, how: str) -> tuple[list[dict], list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for i in range(8):
            x, y = torch.randn(6, 8), torch.randint(0, 5, (6,))
            if how == "ignore_index":
                if i == 3:
                    y[:] = -100  # a batch of padding only
                loss = nn.functional.cross_entropy(model(x), y)
            elif how == "empty_mask":
                mask = y > (5 if i == 3 else 1)  # no sample selected at step 3
                loss = nn.functional.cross_entropy(model(x), y, reduction="none")[mask].mean()
            else:  # a NaN sample: its gradients are NaN, and SGD writes them into the weights
                if i == 3:
                    x[0, 0] = math.nan
                loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return [f for f in diagnose(list(iter_events(path))) if f["code"] == "P4"], losses


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("how", ["ignore_index", "empty_mask"])
def test_a_mean_over_no_elements_is_named_as_such(tmp_path: Path, mode: str, how: str) -> None:
    findings, losses = _run(tmp_path / "empty.tscope", mode, how)
    assert math.isnan(losses[3]) and all(math.isfinite(v) for i, v in enumerate(losses) if i != 3)
    (finding,) = findings
    assert finding["severity"] == "warning"
    assert finding["message"].startswith("The loss is NaN with every gradient exactly zero at step 3: a mean over no elements")
    assert "ignore_index" in finding["fix"] and "mask.any()" in finding["fix"]


def test_a_nan_sample_that_poisons_the_model_stays_an_error(tmp_path: Path) -> None:
    findings, losses = _run(tmp_path / "nan.tscope", "default", "nan_sample")
    assert all(math.isnan(v) for v in losses[3:])
    (finding,) = findings
    assert finding["severity"] == "error" and "mean over no elements" not in finding["message"]


def test_empty_means_on_several_steps_are_no_zero_gradient_finding(tmp_path: Path) -> None:
    """An empty mask on three steps of twenty: the loop's zero gradients there are the empty
    mean's, told by P4 -- not P2's "Every parameter's gradient is exactly zero although the loss
    is not", whose causes (round, a dead ReLU) the NaN loss contradicts (QA 47c)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    path = tmp_path / "masks.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for i in range(20):
            x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
            mask = torch.full((16,), i % 7 != 3)
            loss = nn.functional.cross_entropy(model(x), y, reduction="none")[mask].mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    findings = diagnose(list(iter_events(path)))
    assert [(f["code"], f["severity"]) for f in findings] == [("P4", "warning")], [f["message"] for f in findings]
    assert "mean over no elements" in findings[0]["message"] and "on 3 steps (3, 10, 17)" in findings[0]["message"]
