"""P4 on a loop that guards against non-finite gradients after the backward: it catches
``clip_grad_norm_(..., error_if_nonfinite=True)`` and goes on to the next batch, whose
``zero_grad()`` throws the NaN gradients away.  The model stays finite and trains on the other
batches: a warning that says the loop skipped those updates (QA 45b: an ERROR that read as if
the run were broken), as for a loop that skips a NaN loss before its backward.  A loop without
the guard, whose NaN reaches the parameters, stays an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

BAD = (7, 17)  # the batches with an Inf in their data


def _run(tmp_path: Path, mode: str, guard: bool) -> tuple[list[dict[str, Any]], int]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "run.tscope"
    skipped = 0
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for i in range(24):
            x, y = torch.randn(16, 8), torch.randn(16, 1)
            if i in BAD:
                x[0, 0] = float("inf")
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            try:
                nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=guard)
            except RuntimeError:
                skipped += 1
                continue
            opt.step()
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters()) == guard
    return [dict(f) for f in diagnose(list(iter_events(path)))], skipped


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_nan_gradients_the_loop_throws_away_are_a_warning(tmp_path: Path, mode: str) -> None:
    found, skipped = _run(tmp_path, mode, guard=True)
    assert skipped == len(BAD)
    (p4,) = [f for f in found if f["code"] == "P4"]
    assert p4["severity"] == "warning", p4
    assert p4["message"].startswith(f"The loss was NaN/Inf on {len(BAD)} batches whose gradients the loop threw away "
                                    "before optimizer.step()"), p4["message"]
    assert "error_if_nonfinite=True" in p4["message"]
    # the steps a skipped batch was merged into (no optimizer.step() of its own)
    assert p4["steps"] == [BAD[0], BAD[1] - 1], p4["steps"]
    assert not [f for f in found if f["severity"] == "error"], found


def test_without_the_guard_the_nan_reaching_the_parameters_is_an_error(tmp_path: Path) -> None:
    found, _ = _run(tmp_path, "default", guard=False)
    (p4,) = [f for f in found if f["code"] == "P4"]
    assert p4["severity"] == "error" and "threw away" not in p4["message"], p4


def test_a_nan_batch_the_grad_scaler_skipped_is_a_warning(tmp_path: Path) -> None:
    """float16 autocast with a GradScaler: one corrupt sample makes a NaN loss and NaN gradients,
    and ``scaler.step`` skips that update, as it is meant to -- an error read as if the run were
    broken (QA 46d)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    path = tmp_path / "amp.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for i in range(16):
            x, y = torch.randn(32, 10), torch.randint(0, 3, (32,))
            if i == 9:
                x[3, 2] = float("nan")
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    (p4,) = [dict(f) for f in diagnose(list(iter_events(path))) if f["code"] == "P4"]
    assert p4["severity"] == "warning" and p4["steps"] == [9], p4
    assert "The GradScaler skipped those steps' updates" in p4["message"], p4["message"]
