"""An op the doctor names is labelled with its module's path and type: in an ``nn.Sequential``
the path alone is a bare index (``aten::log in '1'``, QA 42), which says nothing of the layer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class ShiftedLog(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shift = 0.0

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.log(h + 1.0 - self.shift)


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_nan_op_in_a_sequential_names_its_layers_type(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), ShiftedLog(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(6):
            model[2].shift = 1e6 if step >= 2 else 0.0  # log of a negative number from step 2 on
            opt.zero_grad()
            loss = ((model(torch.randn(16, 8)) - torch.randn(16, 1)) ** 2).mean()
            loss.backward()
            opt.step()
    (p4,) = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P4"]
    # full mode checks log/div/exp... every step and names the op; default mode, which checks ops
    # from the step after a non-finite one, names the first op that read a NaN parameter
    named = "aten::log in '2' (ShiftedLog)" if mode == "full" else "aten::t in '0' (Linear)"
    assert named in p4["message"], p4["message"]
