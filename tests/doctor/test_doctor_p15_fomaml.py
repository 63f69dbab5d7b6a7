"""First-order MAML: per task, an inner ``torch.autograd.grad`` (no ``create_graph``) adapts the
weights, then the task's query loss, divided by the number of tasks, is backpropagated into
``.grad``.  P15 warned "summed without dividing the loss by 3" at the inner step's line (QA 50a):
the ``autograd.grad`` passes, which add nothing to ``.grad``, were judged with the micro-batches.
A query loss that is not divided is still told, at its own backward() line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

TASKS = 3


def _fomaml(path: Path, mode: str, divided: bool) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(10):
            opt.zero_grad()
            for _ in range(TASKS):
                x = torch.randn(16, 4, generator=g)
                y = x[:, :1]
                inner = F.mse_loss(F.linear(x, model.weight, model.bias), y)
                gw, gb = torch.autograd.grad(inner, [model.weight, model.bias])
                w, b = model.weight - 0.01 * gw, model.bias - 0.01 * gb
                query = F.mse_loss(F.linear(x, w, b), y)
                (query / TASKS if divided else query).backward()
            opt.step()
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P15"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_the_inner_autograd_grad_is_no_micro_batch(tmp_path: Path, mode: str) -> None:
    assert _fomaml(tmp_path / "ok.tscope", mode, divided=True) == []


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_query_loss_not_divided_is_told_at_its_backward(tmp_path: Path, mode: str) -> None:
    (p15,) = _fomaml(tmp_path / "bug.tscope", mode, divided=False)
    assert p15["severity"] == "warning"
    assert p15["message"].startswith(f"Gradients of {TASKS} micro-batches were summed without dividing the loss by {TASKS}")
    assert p15["src"].endswith("test_doctor_p15_fomaml.py:39"), p15["src"]
