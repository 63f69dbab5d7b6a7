"""Iterative magnitude pruning started after ``watch()``: ``torch.nn.utils.prune`` masks the
weight (renamed ``weight_orig``, multiplied by the mask in a forward pre-hook), so its gradient
is zero wherever the mask is -- by design, no dead branch (P2).  Pruned before ``watch()`` the
name says so; pruned after, the session keeps the old name and the capture says it is pruned."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_layer_pruned_mid_run_is_no_dead_branch(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    path = tmp_path / "prune.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode, sample_every=5):
        for i in range(30):
            if i in (5, 10, 15):  # 90%, then 99%, then 99.9% of the middle layer's weights
                prune.l1_unstructured(model[2], "weight", amount=0.9)
            x = torch.randn(32, 8)
            opt.zero_grad()
            ((model(x) - torch.sin(x.sum(1, keepdim=True))) ** 2).mean().backward()
            opt.step()
    assert model[2].weight.eq(0).float().mean().item() > 0.99  # pruned as asked
    events = list(iter_events(path))
    names = [p["name"] for p in next(e for e in events if e["kind"] == "session")["params"]]
    pruned = [(e["step"], [names[i] for i in n["params"]]) for e in events if e["kind"] == "step"
              for n in e.get("events", []) if n["what"] == "pruned"]
    assert pruned == [(10, ["2.weight"])]  # seen when the hooks are looked at again, said once
    found = diagnose(events)
    assert [f for f in found if f["code"] == "P2"] == [], [f["message"] for f in found if f["code"] == "P2"]
