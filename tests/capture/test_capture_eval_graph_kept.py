"""An evaluation forward without ``no_grad`` whose loss the loop keeps until the next evaluation
(``val_loss = loss_fn(model(x_val), y_val)`` every other step, P6): at the step boundary where
it is still alive, ``graphs_alive`` counts the evaluation's own graph and ``memory.kept`` the
activations it holds.  Before (QA 43), the training step's ``backward()`` re-sized every output
graph of the step with its own graph's size -- the evaluation's too, which it never went
through: the training graph's node count and 0 bytes kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


def _interior(fn: Any) -> int:
    """The autograd nodes reachable from ``fn``, AccumulateGrad left out (what a kept graph holds)."""
    seen, todo = set(), [fn]
    while todo:
        n = todo.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        todo += [m for m, _ in n.next_functions]
    return sum(1 for n in seen if type(n).__name__ != "AccumulateGrad")


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_kept_evaluation_is_counted_at_its_own_size(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "run.tscope"
    w = torchscope.watch(model, opt, server=None, record=path, mode=mode)
    x_val, y_val = torch.randn(128, 16), torch.randn(128, 1)
    sizes = []
    for step in range(5):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step % 2 == 0:
            model.eval()
            out = model(x_val)
            sizes.append(_interior(out.grad_fn))
            val_loss = nn.functional.mse_loss(out, y_val)  # kept until the next evaluation
            del out
            model.train()
    del val_loss
    w.close()
    steps = {e["step"]: e for e in iter_events(path) if e["kind"] == "step"}
    assert sizes == [5, 5, 5]  # addmm, t, relu, addmm, t
    # made after step 0's and step 2's optimizer.step(), alive at the boundaries of steps 2 and 4
    held = 128 * 16 * 4 + 128 * 64 * 4  # the first addmm's input and the ReLU's output
    for s in (2, 4):
        assert steps[s]["graphs_alive"] == sizes[0], s
        assert steps[s]["graphs_kept"]["of"] == "output"
        assert steps[s]["memory"]["kept"] == held, s
    for s in (1, 3):  # replaced by then: nothing kept
        assert steps[s]["graphs_alive"] == 0 and not steps[s]["memory"].get("kept")
