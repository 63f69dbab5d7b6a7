"""A module output's gradient is the loss's: a ``torch.autograd.grad`` for inputs is not one.

A WGAN-GP critic step runs the critic on an interpolate, takes ``autograd.grad(d_interp,
interp, grad_outputs=ones, create_graph=True)`` for the penalty, then one ``backward()`` of the
critic's loss.  The first pass sends the ones vector into the critic's last layer; the loss's
backward never reaches that output (the penalty depends on its gradient, not its value).  The
statistics recorded are those the loss's ``backward()`` sends (QA 45b: the last layer read
norm 8.0, the ones vector of a batch of 64), checked against tensor hooks the test registers on
every call's output and reads during ``backward()`` only; an adversarial attack's input
gradient (PGD) adds no row either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events

B = 16


def _critic() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def _hooked(model: nn.Sequential, by_hand: list[dict[str, list[torch.Tensor]]], on: list[bool]) -> None:
    """Tensor hooks on every call's output that keep the gradient a ``backward()`` sends."""

    def keep(path: str) -> Any:
        def fwd_hook(m: nn.Module, args: Any, out: torch.Tensor) -> None:
            def grab(g: torch.Tensor) -> None:
                if on[0]:
                    by_hand[-1].setdefault(path, []).append(g.detach().clone())

            out.register_hook(grab)

        return fwd_hook

    for path in ("", "0", "1", "2"):  # the critic itself, "", too
        model.get_submodule(path).register_forward_hook(keep(path))


def _check(path: Path, by_hand: list[dict[str, list[torch.Tensor]]]) -> list[dict[str, Any]]:
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    checked = [st for st in steps if st.get("activation_grads")]
    assert checked, "no captured step"
    for st in checked:
        got = {a["module"]: a for a in st["activation_grads"]}
        hand = by_hand[st["step"]]
        assert set(got) == set(hand), (got, hand.keys())
        for mod, grads in hand.items():
            flat = torch.cat([g.flatten() for g in grads]).double()
            assert got[mod]["norm"] == pytest.approx(flat.norm().item(), rel=1e-5), (st["step"], mod)
            assert got[mod]["max_abs"] == pytest.approx(flat.abs().max().item(), rel=1e-5)
            assert got[mod].get("calls", 1) == len(grads)
    return checked


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_gradient_penalty_pass_is_not_the_loss_gradient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool, mode: str
) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    torch.manual_seed(0)
    critic = _critic()
    opt = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.0, 0.9))
    by_hand: list[dict[str, list[torch.Tensor]]] = []
    on = [False]
    _hooked(critic, by_hand, on)
    path = tmp_path / "gp.tscope"
    with torchscope.watch(critic, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            by_hand.append({})
            real, fake = torch.randn(B, 4) + 1, torch.randn(B, 4)
            alpha = torch.rand(B, 1)
            interp = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
            d_interp = critic(interp)
            (g,) = torch.autograd.grad(d_interp, interp, grad_outputs=torch.ones_like(d_interp), create_graph=True)
            gp = ((g.norm(2, dim=1) - 1) ** 2).mean()
            loss = critic(fake).mean() - critic(real).mean() + 10 * gp
            opt.zero_grad()
            on[0] = True
            loss.backward()
            on[0] = False
            opt.step()
    checked = _check(path, by_hand)
    # the last layer: the real and the fake calls' gradients (1/B each), not the interpolate's ones
    last = next(a for a in checked[0]["activation_grads"] if a["module"] == "2")
    assert last["calls"] == 2 and last["max_abs"] == pytest.approx(1 / B)


@pytest.mark.parametrize("mode", ["default", "full"])
def test_an_attack_input_gradient_adds_no_row(tmp_path: Path, mode: str) -> None:
    """PGD's attack forwards take ``autograd.grad(loss, x)``: their outputs' gradients are the
    attack's, which no ``backward()`` of the step sends -- told as no call, not as the attack's."""
    torch.manual_seed(0)
    model = _critic()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    by_hand: list[dict[str, list[torch.Tensor]]] = []
    on = [False]
    _hooked(model, by_hand, on)
    path = tmp_path / "pgd.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            by_hand.append({})
            x, y = torch.randn(B, 4), torch.randn(B, 1)
            x_adv = x.clone()
            for _ in range(2):
                x_adv.requires_grad_(True)
                (gx,) = torch.autograd.grad(nn.functional.mse_loss(model(x_adv), y), x_adv)
                x_adv = (x_adv + 0.01 * gx.sign()).detach()
            loss = nn.functional.mse_loss(model(x_adv), y)
            opt.zero_grad()
            on[0] = True
            loss.backward()
            on[0] = False
            opt.step()
    checked = _check(path, by_hand)
    assert all(a.get("calls", 1) == 1 for a in checked[0]["activation_grads"])
