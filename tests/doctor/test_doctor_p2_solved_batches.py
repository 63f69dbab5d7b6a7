"""A margin loss met on every sample of a batch (MultiMarginLoss on separable data, a triplet loss
whose triplets are all easy) is exactly zero, and so is every gradient of that step: a solved
batch, not a dead branch.  P2 read the zeros at the modules' outputs as "Dead branch: gradient is
all zeros" on most steps (QA 48a).  A ReLU that really died still is one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _run(path: Path, mode: str, dead: bool) -> tuple[list[dict], int]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 3))
    if dead:  # the second ReLU never fires: its branch's gradient is all zeros on every step
        nn.init.constant_(model[2].bias, -100.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    centres = torch.randn(3, 10) * 3
    solved = 0
    with torchscope.watch(model, opt, server=None, record=path, mode=mode, sample_every=5):
        for _ in range(60):
            y = torch.randint(0, 3, (32,))
            x = centres[y] + 0.5 * torch.randn(32, 10)
            opt.zero_grad()
            loss = nn.functional.multi_margin_loss(model(x), y)
            loss.backward()
            solved += int(loss.item() == 0.0)
            opt.step()
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P2"], solved


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_solved_batchs_zero_gradients_are_no_dead_branch(tmp_path: Path, mode: str) -> None:
    p2, solved = _run(tmp_path / "hinge.tscope", mode, dead=False)
    assert solved >= 20  # the premise: most batches are solved
    assert [f for f in p2 if f["severity"] != "info"] == [], [f["message"] for f in p2]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_dead_relu_under_a_margin_loss_is_still_a_dead_branch(tmp_path: Path, mode: str) -> None:
    p2, _ = _run(tmp_path / "dead.tscope", mode, dead=True)
    assert [f for f in p2 if f["severity"] == "warning"], [f["message"] for f in p2]
