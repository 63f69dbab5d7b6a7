"""``optimizer.step(); loss.backward()``: every step finds the gradients ``zero_grad()`` cleared,
and the model never trains.  P5 said "zero_grad() is called between backward() and step()" at
the correctly placed ``zero_grad()``, with a fix that moved it (QA 48a).  Each backward runs
through the previous step's forward (``late_backward``): the finding names the order of step and
backward now.  A zero_grad() really between them keeps its own finding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _p5(path: Path, mode: str, order: str) -> list[dict]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(12):
            x, y = torch.randn(16, 12), torch.randint(0, 4, (16,))
            if order == "step_first":
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                opt.step()
                loss.backward()  # the bug: after the step
            else:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.zero_grad()  # the bug: between backward and step
                opt.step()
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P5"]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_step_before_backward_is_named_so(tmp_path: Path, mode: str) -> None:
    (f,) = _p5(tmp_path / "run.tscope", mode, "step_first")
    assert f["title"] == "optimizer.step() before backward()" and f["severity"] == "error", f
    assert "loss.backward() before optimizer.step()" in f["fix"] and "between" not in f["message"]
    assert f["src"].endswith(":31"), f["src"]  # the opt.step() line


@pytest.mark.parametrize("mode", ["light", "default"])
def test_zero_grad_between_backward_and_step_keeps_its_finding(tmp_path: Path, mode: str) -> None:
    (f,) = _p5(tmp_path / "run.tscope", mode, "zero_grad_between")
    assert "zero_grad() is called between backward() and step()" in f["message"], f["message"]

