"""Ops a module's own forward pre-hooks run belong to that module: ``torch.nn.utils.prune``
computes ``weight = weight_orig * weight_mask`` in one, before the layer's forward, and its
``aten::mul`` (and the ``MulBackward0`` it makes) sat in the parent module's group, so the graph
showed the masks outside the pruned layers (QA 52b).  The capture's module hooks now come first
among a module's pre-hooks; checked against the ops plain PyTorch runs (one mask product per
pruned layer, each before its layer's ``addmm``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import torchscope


@pytest.mark.parametrize("mode", ["default", "full"])
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_pre_hooks_ops_are_its_modules(tmp_path: Path, mode: str, when: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def prune_all() -> None:
        for i in (0, 2, 4):
            prune.l1_unstructured(model[i], "weight", amount=0.5)

    if when == "before":
        prune_all()
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        if when == "after":
            prune_all()
        for _ in range(2):
            opt.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(4, 6)), torch.randint(0, 2, (4,))).backward()
            opt.step()
    graph = torchscope.load(path).graph(0)
    muls = [op["module"] for op in graph["ops"] if op["name"] == "aten::mul" and op.get("phase", "forward") == "forward"]
    assert muls[:3] == ["0", "2", "4"], [(op["name"], op["module"]) for op in graph["ops"]][:12]
    nodes = sorted(n["module"] for n in graph["nodes"] if n["name"] == "MulBackward0")
    assert nodes == ["0", "2", "4"], nodes
