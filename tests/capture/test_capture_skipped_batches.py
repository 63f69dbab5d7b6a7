"""A loop that checks its loss and skips the batch (``if not torch.isfinite(loss): continue``):
the loss it checked is recorded with the forward no backward used, so the doctor says the
skipped batches' losses were NaN (P4, a warning: the loop guards) and, where ops were checked
(full mode), which op made it."""

from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

BAD = (8, 14, 15)  # the batches of huge inputs: log(sigmoid) of them is -inf


def _train(path: Path | None, mode: str) -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    checked = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode) if path else nullcontext():
        for i in range(20):
            x = torch.randn(32, 4, generator=g) * (1e4 if i in BAD else 1.0)
            y = (x[:, :1] > 0).float()
            p = torch.sigmoid(model(x))
            loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
            checked.append(loss.item())
            if not torch.isfinite(loss):
                continue
            opt.zero_grad()
            loss.backward()
            opt.step()
    return checked, [float(p.detach().sum()) for p in model.parameters()]


def _skipped(events: list[dict[str, Any]]) -> list[float]:
    return [f["loss"] for e in events if e["kind"] == "step" for f in e["forwards"] if "loss" in f]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_the_loss_of_a_skipped_batch_is_recorded(mode: str, tmp_path: Path) -> None:
    plain_losses, plain = _train(None, mode)
    losses, watched = _train(tmp_path / "s.tscope", mode)
    assert watched == plain and [str(v) for v in losses] == [str(v) for v in plain_losses]
    events = list(iter_events(tmp_path / "s.tscope"))
    skipped = _skipped(events)
    assert len(skipped) == len(BAD) and all(math.isnan(v) or math.isinf(v) for v in skipped)
    assert sum(not math.isfinite(v) for v in losses) == len(BAD)  # only those: the trained ones are not recorded twice
    (p4,) = [f for f in diagnose(events) if f["code"] == "P4"]
    assert p4["severity"] == "warning"  # the loop guards against them
    if mode == "full":  # every captured forward checks its log/div/exp...: the op is named
        assert f"first produced by aten::log at step {BAD[0]}" in p4["message"], p4["message"]
    else:
        assert f"The loss was NaN/Inf on {len(BAD)} batches the loop skipped" in p4["message"]
    (p6,) = [f for f in diagnose(events) if f["code"] == "P6"]
    assert f"{len(BAD)} of them with a NaN/Inf loss (P4)" in p6["message"]
