"""A batch made NaN in the loop before the model (``(x - x.mean(0)) / x.std(0)`` over a constant
column: 0/0): light said it came in with the data; default and full named the model's first
Linear, ``aten::addmm``, the first recorded op that read it, as its producer (QA 51b)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_batch_normalised_to_nan_in_the_loop_is_the_datas(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    x_all = torch.randn(400, 6)
    x_all[:, 3] = 1.0  # a dead sensor: its std is zero
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    path = tmp_path / f"{mode}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(6):
            xb = x_all[torch.randint(0, 400, (64,))]
            yb = xb[:, :2].sum(1, keepdim=True)
            xb = (xb - xb.mean(0)) / xb.std(0)
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    (p4,) = [f for f in diagnose(iter_events(path)) if f["code"] == "P4"]
    assert "already held NaN/Inf" in p4["message"] and "came in with the data" in p4["message"], p4["message"]
    assert "first produced by" not in p4["message"]
    assert "a transform dividing by a zero std" in p4["fix"]
