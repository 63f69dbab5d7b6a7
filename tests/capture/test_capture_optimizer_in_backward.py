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


def _train(path: Path | None, mode: str, variant: str = "") -> tuple[list[float], list[list[float]], int]:
    """Losses, and per step the norm of each parameter's gradient as its hook saw it; and the
    bytes of the optimizers' state at the end.  ``variant``: "eval" (a no_grad evaluation
    forward after each backward), "compiled" (the loop calls a torch.compile'd model, whose
    module hooks do not run)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    run = torch.compile(model) if variant == "compiled" else model
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
            loss = nn.functional.mse_loss(run(x), y)
            loss.backward()
            losses.append(loss.item())
            if variant == "eval":
                model.eval()
                with torch.no_grad():
                    model(x)
                model.train()
    state = sum(t.numel() * t.element_size() for o in opts.values() for st in o.state.values()
                for t in st.values() if isinstance(t, torch.Tensor))
    return losses, seen, state


@pytest.mark.parametrize(("mode", "variant"), [("light", ""), ("default", ""), ("full", ""), ("default", "eval"),
                                               ("light", "compiled")])
def test_each_backward_is_a_step_with_every_gradient_read_before_its_step(
    tmp_path: Path, mode: str, variant: str
) -> None:
    """An evaluation forward after the backward is no step of its own (it was a last step
    where no parameter 'got a gradient'); a compiled model's backwards are steps each, ended
    by the next backward (they were one step of five micro-batches)."""
    path = tmp_path / "oib.tscope"
    losses, seen, state = _train(path, mode, variant)
    plain_losses, plain_seen, _ = _train(None, mode, variant)
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
        assert ev["lr"] == [1e-2]  # theirs, all alike: one (there was none, QA 44a)
    told = [ev["message"] for ev in events if ev["kind"] == "log"]
    assert len(told) == 1 and "Adam steps inside the backward" in told[0], told
    findings: list[dict[str, Any]] = [dict(f) for f in diagnose(events)]
    assert [f for f in findings if f.get("severity") in ("error", "warning")] == []


def test_a_loop_optimizer_beside_them_counts_their_state_too(tmp_path: Path) -> None:
    """Per-parameter optimizers in the backward for part of the model, an SGD with momentum
    stepped by the loop for the rest: the SGD's steps are the steps, and the optimizer state
    is both's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    inner = {p: torch.optim.Adam([p]) for p in model[2].parameters()}

    def hook(p: torch.Tensor) -> None:
        inner[p].step()
        inner[p].zero_grad()

    for p in model[2].parameters():
        p.register_post_accumulate_grad_hook(hook)
    outer = torch.optim.SGD(model[0].parameters(), lr=0.1, momentum=0.9)
    path = tmp_path / "mixed.tscope"
    with torchscope.watch(model, server=None, record=path, mode="light"):
        for _ in range(3):
            outer.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            outer.step()
    steps = [ev for ev in iter_events(path) if ev["kind"] == "step"]
    state = sum(t.numel() * t.element_size() for o in [outer, *inner.values()] for st in o.state.values()
                for t in st.values() if isinstance(t, torch.Tensor))
    assert len(steps) == 3 and all(ev["grads"]["none"] == [] for ev in steps)
    assert all(ev["lr"] == [0.1] for ev in steps)  # the loop's optimizer's, whose steps are the steps
    assert steps[-1]["memory"]["optimizer"] == state


@pytest.mark.parametrize("bad", [0, -5, 2.5, None, True, "100"])
def test_max_ops_that_is_no_count_of_ops_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_ops must be a whole number of ops"):
        torchscope.watch(nn.Linear(2, 2), server=None, record=None, max_ops=bad)
