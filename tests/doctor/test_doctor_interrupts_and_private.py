"""P5 and P15 where the loop's gradients are not what they look like: a step cut short once by
Ctrl-C (a notebook's Stop) between backward() and optimizer.step(), and a model whose update is
made from per-sample gradients (Opacus marks its parameters' ``grad_sample``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _stopped_once(tmp_path: Path, accumulate_bug: bool) -> list[str]:
    """20 steps; on steps 6 and 13 a Ctrl-C lands in optimizer.step()'s pre-hook (the step never
    runs) and the loop goes on with its next batch: zero_grad(), forward, backward, step()."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    calls = [0]

    def pre(o: torch.optim.Optimizer, a: object, k: object) -> None:
        calls[0] += 1
        if calls[0] in (6, 14):
            raise KeyboardInterrupt

    opt.register_step_pre_hook(pre)
    path = tmp_path / f"stopped_{accumulate_bug}.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        done = 0
        while done < 20:
            try:
                for _ in range(2 if accumulate_bug else 1):
                    opt.zero_grad()  # inside the micro-batch loop: the bug, when there are two
                    x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
                    nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                done += 1
            except KeyboardInterrupt:
                pass  # the next cell
    return [f["code"] for f in diagnose(iter_events(path)) if f["severity"] != "info"]


def test_steps_cut_short_are_no_zero_grad_inside_accumulation(tmp_path: Path) -> None:
    assert _stopped_once(tmp_path, accumulate_bug=False) == []
    # the loop that has the bug on every step is still told, Stop or not
    assert "P5" in _stopped_once(tmp_path, accumulate_bug=True)


def _accumulated(tmp_path: Path, per_sample: bool) -> list[str]:
    """4 micro-batches per step, each loss a mean, not divided by 4: P15, unless the update is
    made from per-sample gradients the optimizer sums and scales itself (Opacus)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    if per_sample:
        for p in model.parameters():
            p.grad_sample = None  # type: ignore[attr-defined]  # what Opacus's GradSampleModule sets
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / f"accum_{per_sample}.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(6):
            opt.zero_grad()
            for _ in range(4):
                x, y = torch.randn(8, 8), torch.randint(0, 2, (8,))
                nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return [f["code"] for f in diagnose(iter_events(path))]


def test_accumulation_of_a_per_sample_model_is_the_optimizers_business(tmp_path: Path) -> None:
    assert "P15" in _accumulated(tmp_path, per_sample=False)
    assert "P15" not in _accumulated(tmp_path, per_sample=True)
