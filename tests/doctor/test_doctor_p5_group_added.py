"""P5 "Parameters no optimizer updates" names each parameter's own steps: a layer whose group
the loop added at step 5 (``optimizer.add_param_group``) was left out on steps 0-4 only, not
"since step 0, every step" as the one never added."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def test_a_group_added_later_is_said_to_be_left_out_until_then(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model[4].parameters(), lr=0.05)  # the head first; layer 2 from step 5
    path = tmp_path / "added.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for i in range(12):
            if i == 5:
                opt.add_param_group({"params": list(model[2].parameters()), "lr": 0.01})
            loss = F.mse_loss(model(torch.randn(8, 8)), torch.randn(8, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    [p5] = [f for f in diagnose(iter_events(path)) if f["code"] == "P5"]
    assert set(p5["params"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert "0.weight and 0.bias (since step 0, every step)" in p5["message"], p5["message"]
    assert "2.weight and 2.bias (steps 0-4)" in p5["message"], p5["message"]
