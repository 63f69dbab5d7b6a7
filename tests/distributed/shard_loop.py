"""The training loop the sharded-model scripts (train_dtensor.py, train_fsdp1.py) share, run
plain and watched on each rank: SGD, fixed data, and each parameter's local gradient norm
after every backward (what the recording's statistics must equal)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import torchscope


def train_steps(
    m: nn.Module,
    record: Path | None,
    mode: str,
    steps: int,
    loss_of: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    norm_of: Callable[[torch.Tensor | None], float | None],
) -> list[list[float | None]]:
    """``steps`` steps of ``m`` (watched when ``record`` is given), the loss ``loss_of(m, x)``;
    per step, ``norm_of(p.grad)`` of each parameter."""
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    torch.manual_seed(1)
    data = [torch.randn(4, 8) for _ in range(steps)]
    w = torchscope.watch(m, opt, server=None, record=record, mode=mode) if record else None
    norms = []
    for x in data:
        opt.zero_grad()
        loss_of(m, x).backward()
        norms.append([norm_of(p.grad) for p in m.parameters()])
        opt.step()
    if w is not None:
        w.close()
    return norms
