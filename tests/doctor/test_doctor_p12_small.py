"""P12 for a conversion of a few bytes a step (QA 45a): a float64 class-weight vector passed as
``weight=w.float()`` every step is a repeated copy of 16 B -- told, not warned about -- and the
line is the conversion's, not a no-op ``.to('cpu')`` of the batch a line above."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def test_a_few_bytes_converted_every_step_are_told_at_their_line(tmp_path: Path) -> None:
    torch.manual_seed(0)
    weights = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    model = nn.Linear(10, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "weights.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(12):
            x, y = torch.randn(32, 10).to("cpu"), torch.randint(0, 4, (32,))
            loss = F.cross_entropy(model(x), y, weight=weights.float())  # the conversion
            opt.zero_grad()
            loss.backward()
            opt.step()
    (p12,) = [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P12"]
    assert p12["severity"] == "info" and "16 B moved per step" in p12["message"], p12
    line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if t.endswith("# the conversion"))
    assert p12["src"] == f"{Path(__file__).name}:{line}", p12
