"""``clip_grad_norm_``: the norm it returns (the gradients' before clipping) is the step's
``clip``, so a run that clips still shows -- and the doctor still judges -- the gradients the
loss made, not the ones clipping left (an explosion behind clipping read as a flat norm of 1)."""

from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _train(path: Path | None, mode: str, spike_at: int | None) -> tuple[list[float], list[float], list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1))
    other = nn.Linear(3, 1)  # clipped too, but not watched: its norm is no step's
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    norms, after = [], []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode) if path else nullcontext():
        for i in range(16):
            x = torch.randn(32, 10, generator=g)
            y = x[:, :1]
            if spike_at is not None and i >= spike_at:
                x, y = x * 1e4, y * 1e4  # unnormalised data from here on
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)))
            # after it, neither the clipped norm logged nor another model's clipping is the step's
            after.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))
            other(torch.randn(2, 3)).sum().backward()
            torch.nn.utils.clip_grad_norm_(other.parameters(), 0.5)
            opt.step()
    return norms, after, [float(p.detach().sum()) for p in model.parameters()]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_the_norm_before_clipping_is_recorded(mode: str, tmp_path: Path) -> None:
    plain_norms, _, plain = _train(None, mode, None)
    norms, after, watched = _train(tmp_path / "c.tscope", mode, None)
    assert watched == plain and norms == plain_norms
    assert all(n > 1.0 for n in norms) and after == pytest.approx([1.0] * 16, rel=1e-4)  # every step clipped
    steps = [e for e in iter_events(tmp_path / "c.tscope") if e["kind"] == "step"]
    assert len(steps) == 16
    for ev, want in zip(steps, norms, strict=True):
        assert ev["grads"]["clip"] == {"norm": pytest.approx(want, rel=1e-6), "max_norm": 1.0, "norm_type": 2.0}
        total = math.sqrt(sum(v * v for v in ev["grads"]["norm"]))
        assert total == pytest.approx(1.0, rel=1e-4)  # the statistics are of the clipped gradients
    assert not [f for f in diagnose(list(iter_events(tmp_path / "c.tscope"))) if f["code"] == "P3"]


def test_an_explosion_behind_clipping_is_p3(tmp_path: Path) -> None:
    norms, _, _ = _train(tmp_path / "c.tscope", "light", spike_at=10)
    assert norms[10] > 1e4 * norms[9]
    (p3,) = [f for f in diagnose(list(iter_events(tmp_path / "c.tscope"))) if f["code"] == "P3"]
    assert "exploded" in p3["message"] and "since step 10" in p3["message"]
    assert f"before clip_grad_norm_ (step 10: {norms[10]:.3g})" in p3["message"] and "max_norm=1" in p3["message"]
    assert "Clipping bounds the update" in p3["fix"]


def test_the_clip_reaches_the_gradient_series(tmp_path: Path) -> None:
    """``torchscope.load(...).grads()`` (the file's series frames) carries each step's clip."""
    norms, _, _ = _train(tmp_path / "c.tscope", "light", None)
    g = torchscope.load(tmp_path / "c.tscope").grads()
    assert [c["norm"] for c in g["clip"]] == pytest.approx(norms, rel=1e-6)
    assert {c["max_norm"] for c in g["clip"]} == {1.0}
    assert g["total_norm"] == pytest.approx([1.0] * 16, rel=1e-4)


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_total_taken_apart_then_clipped_is_the_clip(tmp_path: Path, mode: str) -> None:
    """accelerate's ``clip_grad_norm_`` (and so the HF Trainer's max_grad_norm) takes the total
    with ``get_total_norm`` and clips with ``clip_grads_with_norm_``: never a frame named
    clip_grad_norm_, and no clip was recorded.  The total clipped is the step's clip, with its
    max_norm and the caller's norm_type; another model's clipping and a total taken alone
    (logging) are not."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    other = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "apart.tscope"
    totals = []

    def clip(params: list[torch.Tensor], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        total = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total

    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for i in range(4):
            opt.zero_grad()
            model(torch.randn(5, 6)).pow(2).mean().mul(10).backward()
            if i == 3:  # a step that only logs its total: no clipping
                torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            else:
                totals.append(float(clip(list(model.parameters()), 0.05, norm_type=3.0)))
            other(torch.randn(2, 3)).sum().backward()
            clip(list(other.parameters()), 0.5)
            opt.step()
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    clips = [s["grads"].get("clip") for s in steps]
    assert clips[3] is None
    assert [c["norm"] for c in clips[:3]] == pytest.approx(totals, rel=1e-6)
    assert all(c["max_norm"] == 0.05 and c["norm_type"] == 3.0 for c in clips[:3])
