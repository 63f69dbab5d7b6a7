"""P2 on a branch a gradient hook of the user's zeroes: the dead branch is reported, and the
message names the hooks that can change what reaches it -- a tensor hook on its parameters
(``p.register_hook``), a module's backward hook -- which its fix text (ReLUs, gates, masks)
does not cover."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _p2(tmp_path: Path, how: str) -> list[str]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    if how == "tensor hook":
        model[2].weight.register_hook(lambda g: torch.zeros_like(g))
        model[2].bias.register_hook(lambda g: g * 0)
    elif how == "module hook":  # the gradient into everything below the last layer zeroed
        model[4].register_full_backward_hook(lambda mod, gi, go: (torch.zeros_like(gi[0]),))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    path = tmp_path / "hooks.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(12):
            x = torch.randn(32, 8)
            opt.zero_grad()
            ((model(x) - torch.sin(x.sum(1, keepdim=True))) ** 2).mean().backward()
            opt.step()
    return [f["message"] for f in diagnose(iter_events(path)) if f["code"] == "P2"]


@pytest.mark.parametrize(("how", "named"), [
    ("tensor hook", "a tensor hook (register_hook) on 2.weight, 2.bias"),
    ("module hook", "a backward hook on '4'"),
])
def test_a_dead_branch_names_the_gradient_hooks_that_can_zero_it(tmp_path: Path, how: str, named: str) -> None:
    (message,) = _p2(tmp_path, how)
    assert f"Gradient hooks of yours that can change it: {named}" in message, message


def test_no_hooks_no_dead_branch(tmp_path: Path) -> None:
    assert _p2(tmp_path, "none") == []
