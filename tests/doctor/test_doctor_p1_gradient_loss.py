"""P1 for a loss made of input gradients (QA 45a): a Hamiltonian network trained on dH/dx, and
StyleGAN2's lazy R1 step (the penalty alone every other step), leave the last layer's bias
without a gradient -- a constant offset of the output drops out of its gradient.  It read as
an error, "ends at aten::mse_loss, whose result the loss never uses"; it is said as by design.
A head whose output the loss really leaves out stays the error."""

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


class _HNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (dh,) = torch.autograd.grad(self.net(x).sum(), x, create_graph=True)
        return torch.cat([dh[:, 1:], -dh[:, :1]], 1)


def _p1(path: Path) -> list[dict[str, Any]]:
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P1"]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_hamiltonian_networks_output_bias_is_by_design(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = _HNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / "hnn.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(4):
            x = torch.randn(16, 2).requires_grad_(True)
            loss = F.mse_loss(model(x), torch.stack([x[:, 1], -x[:, 0]], 1).detach())
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert model.net[2].bias.grad is None  # plain PyTorch: no gradient, by design
    (p1,) = _p1(path)
    assert p1["severity"] == "info" and p1["params"] == ["net.2.bias"], p1
    assert "made of gradients" in p1["message"] and "drops out of a gradient" in p1["message"], p1


def test_a_lazy_r1_step_is_by_design_and_a_forgotten_head_is_not(tmp_path: Path) -> None:
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
    path = tmp_path / "r1.tscope"
    with torchscope.watch(critic, opt, server=None, record=path):
        for i in range(6):
            x = torch.randn(8, 2)
            if i % 2 == 0:
                loss = F.softplus(-critic(x)).mean()
            else:  # the lazy R1 penalty, alone on its step
                x.requires_grad_(True)
                (grad,) = torch.autograd.grad(critic(x).sum(), x, create_graph=True)
                loss = grad.pow(2).sum(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    (p1,) = _p1(path)
    assert p1["severity"] == "info" and p1["params"] == ["2.bias"] and p1["steps"] == [1, 3, 5], p1
    # an auxiliary head left out of the loss, with no gradient penalty: the error it was
    torch.manual_seed(0)
    model = nn.ModuleDict({"body": nn.Linear(4, 8), "head": nn.Linear(8, 1), "aux": nn.Linear(8, 1)})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "aux.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(3):
            h = model["body"](torch.randn(8, 4))
            out, aux = model["head"](h), model["aux"](h)
            loss = out.pow(2).mean() + 0 * aux.detach().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    (p1,) = _p1(path)
    assert p1["severity"] == "error" and set(p1["params"]) == {"aux.weight", "aux.bias"}, p1


def test_a_lazy_r1_step_in_full_mode_is_no_dead_activation(tmp_path: Path) -> None:
    """StyleGAN2's form, ``+ 0 * out.sum()`` keeping every parameter in the graph: on the
    penalty's steps the double backward leaves exact zeros at the LeakyReLU's input, read as a
    dead activation in full mode (QA 45a); the biases that cancel there learn on the other steps,
    so the note does not advise bias=False."""
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
    path = tmp_path / "r1-full.tscope"
    with torchscope.watch(critic, opt, server=None, record=path, mode="full"):
        for i in range(12):
            x = torch.randn(32, 2)
            if i % 2 == 0:
                loss = F.softplus(-critic(x)).mean()
            else:
                x.requires_grad_(True)
                out = critic(x)
                (grad,) = torch.autograd.grad(out.sum(), x, create_graph=True)
                loss = grad.pow(2).sum(1).mean() + 0 * out.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    found = [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P2"]
    assert [f for f in found if f["severity"] != "info"] == [], found
    assert all("bias=False" not in f["fix"] for f in found), found
