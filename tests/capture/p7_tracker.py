"""A training loop in a module of its own, keeping each step's loss in a module-level object's
list: ``tracker.losses.append(loss)`` inside a function, where no frame has ``tracker`` as a
local (test_capture_p7_kept.py)."""

from __future__ import annotations

import torch
from torch import nn


class Tracker:
    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []


tracker = Tracker()


def loop(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        tracker.losses.append(loss)
