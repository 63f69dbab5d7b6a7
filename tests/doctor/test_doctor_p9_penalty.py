"""P9: a gradient penalty taken with ``torch.autograd.grad`` without ``create_graph=True`` is a
constant (QA 45a: not detected).  WGAN-GP's critic step is the reproducer; with
``create_graph=True`` it is clean, and an adversarial attack's input gradient (PGD, its step
``x + eps * g.sign()`` on a batch, not a one-value term) or a penalty only logged is no
finding.  Capture stays bit-identical while it follows the gradient."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

STEPS = 6


def _critic() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def _wgan_gp(path: Path | None, mode: str, create: bool) -> list[torch.Tensor]:
    critic = _critic()
    opt = torch.optim.Adam(critic.parameters(), lr=1e-3, betas=(0.0, 0.9))
    g = torch.Generator().manual_seed(1)
    with torchscope.watch(critic, opt, server=None, record=path, mode=mode) if path else _nothing():
        for _ in range(STEPS):
            real, fake = torch.randn(16, 4, generator=g) + 1, torch.randn(16, 4, generator=g)
            alpha = torch.rand(16, 1, generator=g)
            interp = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
            d_interp = critic(interp)
            grad = torch.autograd.grad(d_interp, interp, torch.ones_like(d_interp), create_graph=create)[0]  # (the gradient)
            gp = ((grad.norm(2, dim=1) - 1) ** 2).mean()
            loss = critic(fake).mean() - critic(real).mean() + 10 * gp  # (the loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [p.detach().clone() for p in critic.parameters()]


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _line(marker: str) -> str:
    text = Path(__file__).read_text().splitlines()
    return f"{Path(__file__).name}:{next(i for i, t in enumerate(text, 1) if t.rstrip().endswith(marker))}"


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_penalty_without_create_graph_is_p9(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "gp.tscope"
    params = _wgan_gp(path, mode, create=False)
    assert all(torch.equal(p, q) for p, q in zip(params, _wgan_gp(None, mode, create=False), strict=True))
    p9 = [dict(f) for f in diagnose(list(iter_events(path))) if f["code"] == "P9"]
    assert len(p9) == 1, p9
    (f,) = p9
    assert f["severity"] == "error" and f["title"] == "Gradient penalty without create_graph"
    assert f["src"] == _line("# (the gradient)") and f["steps"] == list(range(STEPS))
    # the line where the penalty joins the loss is the loss's
    assert f"joins the loss at {_line('# (the loss)')} as a constant" in f["message"], f["message"]
    assert "create_graph=True" in f["fix"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_with_create_graph_it_is_clean(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "gp.tscope"
    _wgan_gp(path, mode, create=True)
    events = list(iter_events(path))
    assert not [e for ev in events if ev["kind"] == "step" for e in ev.get("events", []) if e["what"] == "grad_constant"]
    assert not [f for f in diagnose(events) if f["code"] == "P9"]


@pytest.mark.parametrize("use", ["attack", "logged", "weight", "printed", "target"])
def test_an_attack_or_a_logged_norm_is_no_penalty(tmp_path: Path, use: str) -> None:
    """PGD's input gradient steps the batch (``x_adv + eps * g.sign()``, ``x_adv`` still
    requiring grad, then the model on it); a gradient norm kept for the logs (``.item()``)
    joins no loss; one that weighs the loss (a constant factor) adds no term to it; a sum with
    the loss only printed is no loss backward() runs on; a constant norm as the target of a
    differentiable one (``(g_s.norm() - g_t.norm()) ** 2``, ``g_s`` taken with create_graph) is
    a target, not a term (QA 46d)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "adv.tscope"
    norms = []
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(STEPS):
            x, y = torch.randn(16, 4), torch.randn(16, 1)
            x_adv = x.clone().requires_grad_(True)
            (gx,) = torch.autograd.grad(nn.functional.mse_loss(model(x_adv), y), x_adv)
            if use == "attack":
                x_adv = x_adv + 0.01 * gx.sign()
            else:
                norms.append(gx.norm().item())
                x_adv = x
            loss = nn.functional.mse_loss(model(x_adv), y)
            if use == "weight":
                loss = loss / (1 + gx.norm())
            elif use == "printed":
                norms.append((loss + 0.01 * gx.norm()).item())
            elif use == "target":
                x_s = x.clone().requires_grad_(True)
                (g_s,) = torch.autograd.grad(nn.functional.mse_loss(model(x_s), y), x_s, create_graph=True)
                loss = loss + 10 * (g_s.norm() - gx.norm()) ** 2
            opt.zero_grad()
            loss.backward()
            opt.step()
    events = list(iter_events(path))
    found = [e for ev in events if ev["kind"] == "step" for e in ev.get("events", []) if e["what"] == "grad_constant"]
    assert not found
    assert not [f for f in diagnose(events) if f["code"] == "P9"]
