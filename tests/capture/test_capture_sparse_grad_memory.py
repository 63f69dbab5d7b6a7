"""A sparse gradient's bytes (``nn.Embedding(sparse=True)``): its indices are a view of the
batch's, and a batch sliced out of a dataset tensor (``IDX[i:i + 4]``) shares the dataset's
storage.  ``memory.grads`` counts the part the indices span, not the dataset (QA 44a: 2400 B
of a 2560 B index tensor read as gradients every step, and full mode's peak fell below live)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.lin = nn.Embedding(50, 8, sparse=True), nn.Linear(8, 4)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.lin(self.emb(idx).mean(1))


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_sparse_gradients_bytes_are_its_own(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = Bag()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    idx, y = torch.randint(0, 50, (64, 5)), torch.randn(64, 4)  # the dataset, kept whole
    path = tmp_path / f"{mode}.tscope"
    want = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for i in range(4):
            opt.zero_grad()
            F.mse_loss(model(idx[i * 4:i * 4 + 4]), y[i * 4:i * 4 + 4]).backward()
            g = model.emb.weight.grad
            want.append(g._indices().numel() * 8 + g._values().numel() * 4 + sum(
                p.grad.numel() * 4 for p in model.lin.parameters()))
            opt.step()
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert [e["memory"]["grads"] for e in steps] == want  # 160 B of indices, not the dataset's 2560
    for e in steps:
        mem = e["memory"]
        assert mem["peak"] >= mem["grads"] + mem["params"], mem
