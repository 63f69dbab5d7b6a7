"""A step's peak is never below what it ends with: gradients set by hand as views of one flat
buffer (an Apex/ZeRO-style contiguous gradient buffer, filled from ``torch.autograd.grad``) are
made outside the ops the ledger saw, and full mode's first step read a peak under its live
bytes (QA 44a: 8432 < 8628)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_flat_gradient_buffer_keeps_the_peak_above_live(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params))
    views, at = [], 0
    for p in params:
        views.append(flat[at:at + p.numel()].view_as(p))
        at += p.numel()
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    path = tmp_path / f"{mode}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            for p in params:
                p.grad = None
            loss = F.mse_loss(model(torch.randn(4, 16)), torch.randn(4, 4))
            with torch.no_grad():
                for p, v, g in zip(params, views, torch.autograd.grad(loss, params), strict=True):
                    v.copy_(g)
                    p.grad = v
            opt.step()
    steps = [e["memory"] for e in iter_events(path) if e["kind"] == "step"]
    assert len(steps) == 3
    for mem in steps:
        assert mem["grads"] == flat.untyped_storage().nbytes(), mem  # the buffer, once
        assert mem["peak"] >= mem["live"], mem
