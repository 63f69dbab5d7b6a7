"""An early-exit network whose every exit ends in ``nn.Softmax`` handed to ``cross_entropy``: one
line, three modules.  P16 named the first exit alone and counted the three loss calls of the one
captured step as "captured graphs on 3 steps (0, 0, 0)" (QA 50a)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class EarlyExits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(3))
        self.exits = nn.ModuleList(nn.Sequential(nn.Linear(16, 4), nn.Softmax(-1)) for _ in range(3))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for block, head in zip(self.blocks, self.exits, strict=True):
            x = block(x)
            outs.append(head(x))
        return outs


def test_every_exit_is_named_and_the_step_counted_once(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = EarlyExits()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / "exits.tscope"
    with torchscope.watch(model, opt, server=None, record=path, sample_every=100):
        for _ in range(4):
            x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
            opt.zero_grad()
            sum(F.cross_entropy(o, y) for o in model(x)).backward()
            opt.step()
    (p16,) = [f for f in diagnose(iter_events(path)) if f["code"] == "P16"]
    assert "softmax output of modules 'exits.0.1', 'exits.1.1', 'exits.2.1' (Softmax)" in p16["message"], p16["message"]
    assert p16["message"].endswith("(captured graph at step 0)."), p16["message"]
    assert p16["modules"] == ["exits.0.1", "exits.1.1", "exits.2.1"]
