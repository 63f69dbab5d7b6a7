"""A forward given copies of the parameters that are new leaves --
``functional_call(model, {k: v.detach().requires_grad_() ...})``, as a MAML loop's adapted
parameters built wrongly -- trains the copies' ``.grad`` and never the model.  Each ``.grad`` is
None at ``optimizer.step()`` though ``backward()`` ran, which P5 read as "zero_grad() is called
between backward() and step()" (and, with several passes, "zero_grad() inside the accumulation
loop"), sending the user to move a ``zero_grad()`` that was right (QA 50a).  It is P1 now: the
backward's graph reaches none of the parameters, and a captured graph shows the copies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _train(path: Path, mode: str, passes: int, copies: bool) -> tuple[list[dict[str, Any]], nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(8):
            opt.zero_grad()
            for _ in range(passes):
                x = torch.randn(16, 4, generator=g)
                params = ({k: v.detach().requires_grad_() for k, v in model.named_parameters()} if copies
                          else dict(model.named_parameters()))
                loss = F.mse_loss(functional_call(model, params, (x,)), x[:, :1]) / passes
                loss.backward()
            opt.step()
    return [dict(f) for f in diagnose(iter_events(path))], model


@pytest.mark.parametrize("passes", [1, 3])
@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_leaf_copies_of_the_parameters_are_p1_not_a_misplaced_zero_grad(tmp_path: Path, mode: str, passes: int) -> None:
    found, model = _train(tmp_path / "copies.tscope", mode, passes, copies=True)
    assert all(p.grad is None for p in model.parameters())  # plain PyTorch: the model never got a gradient
    assert [f for f in found if f["code"] == "P5"] == []
    (p1,) = [f for f in found if f["code"] == "P1" and f["severity"] == "error"]
    assert p1["message"].startswith("0.weight, 0.bias, 2.weight, 2.bias never received a gradient (since step 0, every step)")
    if mode == "light":  # no graph: its walk knows the graph does not reach them
        assert "the backward's graph does not reach them" in p1["message"], p1["message"]
    else:  # the captured graph shows the copies, at the forward's line
        assert "computed with copies of them in their place" in p1["message"], p1["message"]
        assert "test_doctor_p1_param_copies.py:37" in p1["message"], p1["message"]
        assert "dict(model.named_parameters())" in p1["fix"]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_the_parameters_themselves_are_no_finding(tmp_path: Path, mode: str) -> None:
    found, model = _train(tmp_path / "params.tscope", mode, 3, copies=False)
    assert all(p.grad is not None for p in model.parameters())
    assert [f for f in found if f["code"] in ("P1", "P5")] == []
