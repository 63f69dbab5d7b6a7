"""Memory at step boundaries after the optimizer's state is replaced by as many new tensors
(``state.clear()``, ``load_state_dict`` of a checkpoint, ``share_memory_()`` of the buffers):
the capture keeps the state's storages from step to step, and the old tensors' memory goes to
the next gradients -- which were then subtracted from ``live`` as if they shared the state's
storage (up to 24% under).  ``live`` is the storages' union, counted here by hand."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


def _union(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    tensors = [*model.parameters(), *(p.grad for p in model.parameters())]
    tensors += [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor) and v.numel() > 1]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None}
    return sum(storages.values())


def _run(tmp_path: Path, how: str, width: int, at: int, mode: str) -> list[tuple[int, int]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 4))
    opt: Any = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if how == "share"
                else torch.optim.Adam(model.parameters(), lr=1e-2))
    path = tmp_path / f"{how}-{width}-{at}.tscope"
    mine, ckpt = [], {}
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for i in range(8):
            if i == at:
                if how == "clear":
                    opt.state.clear()
                elif how == "load":
                    opt.load_state_dict(ckpt["opt"])
                else:
                    for st in opt.state.values():
                        st["momentum_buffer"].share_memory_()
            opt.zero_grad()
            F.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward()
            opt.step()
            mine.append(_union(model, opt))
            if i == 1:
                ckpt["opt"] = copy.deepcopy(opt.state_dict())
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    return [(st["memory"]["live"], mine[st["step"]]) for st in steps]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_live_after_the_state_is_replaced_is_the_union(tmp_path: Path, mode: str) -> None:
    wrong = []
    for how in ("clear", "load", "share"):
        for width in (24, 32, 48):  # which steps reuse a freed address depends on the sizes
            for at in (3, 4):
                for step, (got, want) in enumerate(_run(tmp_path, how, width, at, mode)):
                    if got != want:
                        wrong.append((how, width, at, step, got, want))
    assert wrong == []
