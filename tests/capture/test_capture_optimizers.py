"""Which optimizer's steps are the steps: the one passed to ``watch``, else the one that steps
the model's parameters (``watch(model)`` alone), and a new one that replaces it mid-run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)) for _ in range(n)]


def _loop(model: nn.Module, opts: list[Any], batches: list[Any], switch_at: int | None = None) -> list[float]:
    """zero_grad, forward, backward, step of every optimizer in ``opts`` (from ``switch_at`` on:
    a new Adam instead of them)."""
    losses = []
    for i, (x, y) in enumerate(batches):
        if i == switch_at:
            opts = [torch.optim.Adam(model.parameters(), lr=1e-3)]
        for o in opts:
            o.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        for o in opts:
            o.step()
        losses.append(loss.item())
    return losses


def _steps(path: Path) -> list[dict[str, Any]]:
    return [e for e in iter_events(path) if e["kind"] == "step"]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_watch_without_optimizer_follows_the_one_that_steps(
    mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batches = _batches(6)
    plain = _model()
    expected = _loop(plain, [torch.optim.SGD(plain.parameters(), lr=0.1)], batches)
    model = _model()
    with torchscope.watch(model, server=None, record=tmp_path / "run.tscope", mode=mode):
        losses = _loop(model, [torch.optim.SGD(model.parameters(), lr=0.1)], batches)
    assert losses == expected
    assert capsys.readouterr().err.count("following SGD") == 1
    steps = _steps(tmp_path / "run.tscope")
    assert [s["micro_batches"] for s in steps] == [1] * 6  # one step per optimizer step, not one in all
    assert [s["loss"] for s in steps] == pytest.approx(expected)
    assert all(s["lr"] == [0.1] and s["grads"]["norm"][0] is not None for s in steps)


def test_a_new_optimizer_mid_run_is_followed(tmp_path: Path) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchscope.watch(model, opt, server=None, record=tmp_path / "run.tscope"):
        _loop(model, [opt], _batches(10), switch_at=5)
    steps = _steps(tmp_path / "run.tscope")
    assert [s["micro_batches"] for s in steps] == [1] * 10
    assert [s["lr"] for s in steps] == [[0.1]] * 5 + [[0.001]] * 5


def test_two_optimizers_of_one_model_in_one_loop(tmp_path: Path) -> None:
    """Two optimizers each stepping part of the model every iteration: the watched one ends the
    steps, the other is not taken for its replacement."""
    model = _model()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.SGD(model[2].parameters(), lr=0.2)
    with torchscope.watch(model, first, server=None, record=tmp_path / "run.tscope"):
        _loop(model, [second, first], _batches(6))  # the other one steps first
    steps = _steps(tmp_path / "run.tscope")
    assert [s["micro_batches"] for s in steps] == [1] * 6
    assert all(s["lr"] == [0.1] for s in steps)


def test_manual_steps_are_not_doubled(tmp_path: Path) -> None:
    """``watch(model)`` with ``watch.step()`` in the loop (before or after ``optimizer.step()``):
    the loop's own boundaries are the steps, one per iteration."""
    for order in ("before", "after"):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        path = tmp_path / f"{order}.tscope"
        with torchscope.watch(model, server=None, record=path) as w:
            for x, y in _batches(5):
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                if order == "before":
                    w.step()
                opt.step()
                if order == "after":
                    w.step()
        assert [s["micro_batches"] for s in _steps(path)] == [1] * 5, order
