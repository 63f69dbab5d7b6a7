"""Gradients clipped in a step pre-hook of the optimizer (``opt.register_step_pre_hook``): the
hook runs inside ``optimizer.step()``, after the capture's own global pre-hook read the
gradients.  The step's statistics are the clipped gradients the update used, and the step has
its ``clip`` (QA 43a F6: they were the unclipped ones, with no clip)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events

STEPS = 4


def _train(make_opt: Any, mode: str | None, path: Path) -> tuple[list[list[float]], list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = make_opt(model.parameters())
    w = torchscope.watch(model, opt, server=None, record=path, mode=mode) if mode else None
    totals: list[float] = []

    def clip(optimizer: Any, args: Any, kwargs: Any) -> None:
        totals.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)))

    opt.register_step_pre_hook(clip)
    norms = []
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        opt.zero_grad()
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)
        loss = ((model(x) * 10 - y) ** 2).mean()
        loss.backward()
        opt.step()
        norms.append([float(p.grad.double().norm()) for p in model.parameters()])
    if w is not None:
        w.close()
    return norms, totals, [p.detach().clone() for p in model.parameters()]


OPTIMIZERS = {
    "sgd-foreach": lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=True),
    "adam-fused": lambda ps: torch.optim.Adam(ps, lr=0.01, fused=True),
}


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_a_clip_in_a_step_pre_hook_is_the_steps(tmp_path: Path, mode: str, opt: str) -> None:
    norms, totals, params = _train(OPTIMIZERS[opt], None, tmp_path / "plain.tscope")
    path = tmp_path / f"{mode}.tscope"
    w_norms, w_totals, w_params = _train(OPTIMIZERS[opt], mode, path)
    assert w_totals == totals and w_norms == norms
    assert all(torch.equal(a, b) for a, b in zip(params, w_params, strict=True))  # training unchanged
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert len(steps) == STEPS
    for ev, want, total in zip(steps, norms, totals, strict=True):
        assert ev["grads"]["norm"] == pytest.approx(want, rel=1e-5), (ev["step"], ev["grads"]["norm"], want)
        assert max(want) < 0.05 < total  # clipped: what the update used
        clip = ev["grads"]["clip"]
        assert clip["norm"] == pytest.approx(total, rel=1e-6) and clip["max_norm"] == 0.05, clip
