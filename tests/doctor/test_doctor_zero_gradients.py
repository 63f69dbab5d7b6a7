"""Gradients that are exactly zero at optimizer.step(): the loss went through a step function
(round, sign...: P9), or zero_grad(set_to_none=False) cleared them after backward (P5) --
told apart by whether the loop's gradients were None before its backward (real captures)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _run(tmp_path: Path, loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], misplaced: bool = False,
         set_to_none: bool = True) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="default"):
        for _ in range(6):
            x, y = torch.randn(16, 6), torch.randint(0, 4, (16, 1)).float()
            if not misplaced:
                opt.zero_grad(set_to_none=set_to_none)
            loss_of(model(x), y).backward()
            if misplaced:
                opt.zero_grad(set_to_none=set_to_none)  # "clean up before stepping"
            opt.step()
    return [dict(f) for f in diagnose(iter_events(path))]


def test_a_rounded_prediction_is_p9_not_a_misplaced_zero_grad(tmp_path: Path) -> None:
    findings = _run(tmp_path, lambda out, y: nn.functional.l1_loss(out.round(), y))
    assert [f["code"] for f in findings if f["severity"] == "error"] == ["P9"], findings
    p9 = next(f for f in findings if f["code"] == "P9")
    assert "aten::round" in p9["message"] and "zero everywhere" in p9["message"]
    assert p9["src"] == f"{Path(__file__).name}:{test_a_rounded_prediction_is_p9_not_a_misplaced_zero_grad.__code__.co_firstlineno + 1}"


def test_gradients_zeroed_between_backward_and_step_are_p5(tmp_path: Path) -> None:
    for set_to_none in (True, False):  # cleared to None, or to zeros
        findings = _run(tmp_path, lambda out, y: nn.functional.mse_loss(out, y), misplaced=True, set_to_none=set_to_none)
        p5 = [f for f in findings if f["code"] == "P5"]
        assert len(p5) == 1 and "between backward() and step()" in p5[0]["message"], (set_to_none, findings)


def test_a_correct_loop_with_zeroed_gradients_is_silent(tmp_path: Path) -> None:
    findings = _run(tmp_path, lambda out, y: nn.functional.mse_loss(out, y), set_to_none=False)
    assert not [f for f in findings if f["severity"] in ("error", "warning")], findings
