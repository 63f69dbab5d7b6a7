"""PyTorch's "optimizer in backward" recipe: an Adam per parameter, stepped and cleared in a
post-accumulate-grad hook, so no optimizer.step() follows the backward.  Each backward is a
step; every parameter's gradient statistics are those plain PyTorch's hook saw before its step
(not one of the optimizers followed, the others read after their gradients were cleared)."""

from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

_STEPS = 5


def _train(path: Path | None, mode: str) -> tuple[list[float], list[list[float]], int]:
    """Losses, and per step the norm of each parameter's gradient as its hook saw it; and the
    bytes of the optimizers' state at the end."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    names = {p: i for i, p in enumerate(model.parameters())}
    opts = {p: torch.optim.Adam([p], lr=1e-2, foreach=False) for p in model.parameters()}
    seen: list[list[float]] = []

    def hook(p: torch.Tensor) -> None:
        assert p.grad is not None
        seen[-1][names[p]] = p.grad.norm().item()
        opts[p].step()
        opts[p].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    g = torch.Generator().manual_seed(1)
    losses = []
    with torchscope.watch(model, server=None, record=path, mode=mode) if path else nullcontext():
        for _ in range(_STEPS):
            seen.append([math.nan] * len(names))
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            losses.append(loss.item())
    state = sum(t.numel() * t.element_size() for o in opts.values() for st in o.state.values()
                for t in st.values() if isinstance(t, torch.Tensor) and t.numel() > 1)
    return losses, seen, state


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_each_backward_is_a_step_with_every_gradient_read_before_its_step(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "oib.tscope"
    losses, seen, state = _train(path, mode)
    plain_losses, plain_seen, _ = _train(None, mode)
    assert losses == plain_losses and seen == plain_seen  # training untouched, to the bit
    events = list(iter_events(path))
    steps = [ev for ev in events if ev["kind"] == "step"]
    assert [ev["step"] for ev in steps] == list(range(_STEPS))
    for ev, norms, loss in zip(steps, plain_seen, plain_losses, strict=True):
        assert ev["losses"] == pytest.approx([loss])
        assert ev["grads"]["none"] == []
        assert ev["grads"]["norm"] == pytest.approx(norms, rel=1e-5)
        assert ev["memory"]["optimizer"] == state  # Adam's exp_avg and exp_avg_sq of all four
        assert ev["memory"]["grads"] == 0  # each cleared as soon as it was used
    told = [ev["message"] for ev in events if ev["kind"] == "log"]
    assert len(told) == 1 and "Adam steps inside the backward" in told[0], told
    findings: list[dict[str, Any]] = [dict(f) for f in diagnose(events)]
    assert [f for f in findings if f.get("severity") in ("error", "warning")] == []
