"""Tensors that are not plain strided tensors flow through real training loops: a jagged
nested tensor's ragged sequence lengths are symbolic (JSON cannot hold them), so a captured
graph records them as -1 -- before, the writer failed on them and lost every event of the run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.session import load


@pytest.mark.parametrize("mode", ["default", "full"])
def test_jagged_nested_tensor_inputs_are_recorded(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "njt.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for i in range(4):
            x = torch.nested.nested_tensor([torch.randn(n, 8) for n in (3, 5, 2 + i)], layout=torch.jagged)
            opt.zero_grad()
            model(x).values().pow(2).mean().backward()
            opt.step()
    s = load(path)
    assert [e["step"] for e in s.steps] == [0, 1, 2, 3] and all(e["loss"] is not None for e in s.steps)
    assert [log for log in s.logs if log.get("level") == "error"] == []
    g = s.graph(0)
    jagged = [t["shape"] for t in g["tensors"] if -1 in t["shape"]]
    assert [3, -1, 8] in jagged  # the input: 3 sequences of ragged length, 8 features
    assert all(shape.count(-1) == 1 for shape in jagged)
