"""A layer's gradient cleared between backward() and step() on the first steps only, on
purpose: DINO's ``cancel_gradients_last_layer`` sets ``p.grad = None`` for the head's last
layer during its first epoch (QA 44d).  It is P1's info, not the warning "cleared before
optimizer.step()" every such step of a mistake gets -- which the same clearing on every step
still is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _p1(tmp_path: Path, mode: str, frozen_for: int) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    path = tmp_path / f"{mode}-{frozen_for}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(12):
            opt.zero_grad()
            model(torch.randn(8, 8)).log_softmax(-1).mean().neg().backward()
            if step < frozen_for:  # cancel_gradients_last_layer
                for p in model[2].parameters():
                    p.grad = None  # (the clearing)
            opt.step()
    return [dict(f) for f in diagnose(list(iter_events(path))) if f["code"] == "P1"]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_warm_up_freeze_of_the_last_layer_is_p1s_info(tmp_path: Path, mode: str) -> None:
    (p1,) = _p1(tmp_path, mode, frozen_for=4)
    assert p1["severity"] == "info" and p1["steps"] == [0, 1, 2, 3], p1
    assert "on the first 4 steps" in p1["message"] and "trained on every step since" in p1["message"], p1
    assert sorted(p1["params"]) == ["2.bias", "2.weight"], p1


def test_the_same_clearing_on_every_step_is_the_warning(tmp_path: Path) -> None:
    (p1,) = _p1(tmp_path, "default", frozen_for=12)
    assert p1["severity"] == "warning" and p1["title"] == "Gradient cleared before optimizer.step()", p1
    # at the line that clears them, which the capture saw (QA 46d: the forward's line)
    line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if t.rstrip().endswith("# (the clearing)"))
    assert p1["src"] == f"{Path(__file__).name}:{line}", p1
