"""P1 when a custom ``autograd.Function``'s backward returns None for a parameter (QA 42a): the
backward runs the parameter's AccumulateGrad -- reached through the Function's node alone -- and
``.grad`` stays None.  The finding said the path broke at the Function's forward "under
torch.no_grad(), or in torch.utils.checkpoint(use_reentrant=True)", neither of which the script
had; it names the Function and its backward now.  The same Function returning the gradient is
no finding, and training is bit-identical with the watch.  In light mode, which captures no
graph, the walk of the backward's graph tells the same: the parameter's AccumulateGrad has the
Function's node as its only parent (it read as a gradient cleared before step())."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, beta: torch.Tensor, forget: bool) -> torch.Tensor:
        s = torch.sigmoid(beta * x)
        ctx.save_for_backward(x, s, beta)
        ctx.forget = forget
        return x * s

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        x, s, beta = ctx.saved_tensors
        gx = g * (s + beta * x * s * (1 - s))
        gb = (g * x * x * s * (1 - s)).sum().reshape(beta.shape)
        return gx, None if ctx.forget else gb, None


class Net(nn.Module):
    def __init__(self, forget: bool) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(10, 24), nn.Linear(24, 1)
        self.beta = nn.Parameter(torch.ones(1))
        self.forget = forget

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(Swish.apply(self.l1(x), self.beta, self.forget))


def _train(path: Path | None, forget: bool, mode: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = Net(forget)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode) if path else None
    for _ in range(4):
        x = torch.randn(32, 10)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), x[:, :1]).backward()
        opt.step()
    if watch is not None:
        watch.close()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_function_returning_none_for_a_parameter_is_named(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "none.tscope"
    watched = _train(path, True, mode)
    assert all(torch.equal(a, b) for a, b in zip(watched, _train(None, True, mode), strict=True))
    found = [dict(f) for f in diagnose(list(iter_events(path)))]
    (p1,) = [f for f in found if f["code"] == "P1"]
    assert p1["severity"] == "error" and p1["params"] == ["beta"], p1
    message = str(p1["message"])
    assert "only through SwishBackward, a custom autograd.Function, and its backward() returned None for it" in message
    assert "no_grad" not in message and "checkpoint" not in message and "needs_input_grad" in str(p1["fix"])
    assert [f for f in found if f["severity"] in ("warning", "error")] == [p1], found


@pytest.mark.parametrize("mode", ["light", "default"])
def test_the_same_function_returning_its_gradient_is_no_finding(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "right.tscope"
    _train(path, False, mode)
    found = [dict(f) for f in diagnose(list(iter_events(path)))]
    assert not [f for f in found if f["severity"] in ("warning", "error")], found
