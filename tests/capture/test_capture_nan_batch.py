"""A NaN/Inf that came in with the data: at the first NaN/Inf loss, the capture reads which of
the forward's floating-point inputs the loop still holds hold NaN/Inf (``inputs_nonfinite``),
and the doctor says the batch brought it, at the forward's line, with a fix for the data --
or, the inputs finite, that an op of the forward or the loss's target made it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

BAD = 5  # the step whose batch (or target) holds a NaN


def _train(path: Path, mode: str, poison: str, skip: bool = False) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(10):
            x, y = torch.randn(32, 8), torch.randn(32, 1)
            if step == BAD:
                (x if poison == "input" else y)[3, 0] = float("nan")
            loss = nn.functional.mse_loss(model(x), y)  # the forward's line
            if skip and not torch.isfinite(loss):
                continue
            opt.zero_grad()
            loss.backward()
            opt.step()
    return list(iter_events(path))


def _p4(events: list[dict[str, Any]]) -> dict[str, Any]:
    (p4,) = [f for f in diagnose(events) if f["code"] == "P4"]
    return p4


def _forward_line() -> str:
    import inspect

    lines, first = inspect.getsourcelines(_train)
    return f"{Path(__file__).name}:{first + next(i for i, line in enumerate(lines) if '# the forward' in line)}"


@pytest.mark.parametrize("mode", ["default", "full"])
@pytest.mark.parametrize("skip", [False, True])
def test_a_batch_holding_nan_is_named_as_the_cause(mode: str, skip: bool, tmp_path: Path) -> None:
    events = _train(tmp_path / "x.tscope", mode, "input", skip)
    read = [(e["step"], x) for e in events if e["kind"] == "step" for x in e.get("events", [])
            if x.get("what") == "inputs_nonfinite"]
    assert read == [(BAD, {"what": "inputs_nonfinite", "inputs": [0], "read": 1})]
    p4 = _p4(events)
    assert f"input batch at step {BAD} already held NaN/Inf" in p4["message"], p4["message"]
    assert "mode='full'" not in p4["message"]
    assert p4["src"] == _forward_line() and "torch.isfinite(x)" in p4["fix"]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_nan_target_is_not_blamed_on_the_batch(mode: str, tmp_path: Path) -> None:
    """The inputs were finite: the loss's target or an op made it; mode='full' is suggested
    only to a run that was not recorded in it."""
    events = _train(tmp_path / "y.tscope", mode, "target")
    p4 = _p4(events)
    assert "its parameters and its input batch were finite" in p4["message"], p4["message"]
    assert "target" in p4["message"] and "already held" not in p4["message"]
    assert ("record with mode='full'" in p4["message"]) == (mode == "default")
