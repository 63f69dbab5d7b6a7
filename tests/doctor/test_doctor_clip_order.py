"""clip_grad_norm_ before loss.backward() (QA 37a): the clipping the loop asks for never reaches
optimizer.step().  It was no finding, or -- with zero_grad(set_to_none=False), whose zeros the
early clip measured -- P3's "gradient norm vanished", a fix about architecture.  After a plain
zero_grad() (every .grad None: torch takes no norm, it returns a 0) it was no finding in any mode
until QA 51b."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _train(path: Path, order: str, mode: str, steps: int = 8) -> list[float]:
    """The gradient norm each optimizer.step() applied, as plain PyTorch computes it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    applied = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(steps):
            x, y = torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)
            if order == "before_zero_grad":
                nn.utils.clip_grad_norm_(model.parameters(), 0.01)  # marker: early clip
                opt.zero_grad()
            elif order == "before_backward_none":
                opt.zero_grad()  # every .grad None: clip_grad_norm_ takes no norm at all
            else:
                opt.zero_grad(set_to_none=False)
            if order in ("before_backward", "before_backward_none"):
                nn.utils.clip_grad_norm_(model.parameters(), 0.01)  # marker: early clip
            loss = F.mse_loss(model(x), y)
            loss.backward()
            if order == "after_backward":
                nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            applied.append(float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm()))
            opt.step()
    return applied


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("order", ["before_backward", "before_zero_grad", "before_backward_none"])
def test_a_clip_before_backward_is_found_with_its_line(tmp_path: Path, order: str, mode: str) -> None:
    path = tmp_path / "clip.tscope"
    applied = _train(path, order, mode)
    assert max(applied) > 0.01 * 5  # the update really was unclipped: plain PyTorch says so
    events = list(iter_events(path))
    found = [dict(f) for f in diagnose(events)]
    p3 = [f for f in found if f["code"] == "P3"]
    assert [f["title"] for f in p3] == ["Gradients clipped before backward()"], found  # not "vanished"
    (f,) = p3
    assert f["severity"] == "error" and "applied this step's gradients unclipped" in f["message"]
    # every step, the first too (no gradient yet: clip_grad_norm_ of nothing, seen since QA
    # 51b); light and default watch that part of a step on their first steps only, and say so
    if mode == "full":
        assert f["steps"] == list(range(8)), f["steps"]
    else:
        assert f["steps"][0] == 0 and "the capture looks there on some steps only" in f["message"], f
    lines = [n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "marker: early clip" in text]
    assert f["src"] in {f"{Path(__file__).name}:{n}" for n in lines}
    # the norm recorded is the one the step applied, not the early clip's
    steps = [e for e in events if e["kind"] == "step"]
    assert all("clip" not in s["grads"] for s in steps)
    recorded = [(sum(n * n for n in s["grads"]["norm"] if n is not None)) ** 0.5 for s in steps]
    assert recorded == pytest.approx(applied, rel=1e-4)


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_clip_after_backward_is_no_finding(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "clip.tscope"
    _train(path, "after_backward", mode)
    events = list(iter_events(path))
    assert [f for f in diagnose(events) if f["code"] == "P3"] == []
    assert all(s["grads"]["clip"]["max_norm"] == 0.01 for s in events if s["kind"] == "step")
