"""P5 when ``zero_grad()`` runs on some steps only -- indented into the loop's logging block
(QA 44b): the gradients pile up between the steps it clears them.  The finding said "zero_grad()
is missing"; it names the steps that were cleared and asks whether the call sits in a
condition.  The same loop with the call outside the block is no finding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _train(path: Path, mode: str, slipped: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(12):
            if not slipped:
                opt.zero_grad()
            F.mse_loss(model(torch.randn(8, 8)), torch.randn(8, 2)).backward()
            opt.step()
            if step % 4 == 0:
                print(f"step {step}")  # the loop's logging ...
                if slipped:
                    opt.zero_grad()  # ... and the call that slipped into it


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_zero_grad_inside_the_logging_block_is_told_as_such(tmp_path: Path, mode: str) -> None:
    path = tmp_path / f"slipped-{mode}.tscope"
    _train(path, mode, slipped=True)
    (p5,) = [dict(f) for f in diagnose(list(iter_events(path))) if f["code"] == "P5"]
    assert p5["severity"] == "error" and p5["steps"] == [s for s in range(2, 12) if s % 4 != 1], p5
    assert p5["message"].startswith("The gradients were cleared before some steps' backward only (steps 1, 5, 9) and were already non-zero before it on the other 8 (2, 3, 4, 6, 7, 8, ...): "), p5
    assert "inside a condition" in p5["message"] and "missing" not in p5["message"], p5


def test_the_call_outside_it_is_no_finding(tmp_path: Path) -> None:
    path = tmp_path / "right.tscope"
    _train(path, "default", slipped=False)
    assert not [f for f in diagnose(list(iter_events(path))) if f["severity"] in ("warning", "error")]
