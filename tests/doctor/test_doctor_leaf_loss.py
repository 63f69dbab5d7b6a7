"""A loss made anew from a number (``torch.tensor(loss.item(), requires_grad=True)``): backward()
runs -- on a leaf -- and no parameter gets a gradient.  That is the graph cut at ``.item()``
(P1, at its line), not a zero_grad() between backward and step (P5), nor an evaluation that
wants torch.no_grad() (P6)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_loss_remade_from_its_item_is_a_cut_at_the_item(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "leaf.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(4):
            opt.zero_grad()
            value = F.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,)))
            loss = torch.tensor(value.item(), requires_grad=True)  # the cut
            loss.backward()
            opt.step()
    assert all(p.grad is None for p in model.parameters())
    found = [dict(f) for f in diagnose(iter_events(path))]
    assert [f["code"] for f in found] == ["P1"]
    (p1,) = found
    assert p1["severity"] == "error" and len(p1["params"]) == 4
    if mode == "default":  # a captured step names the op and its line
        line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if "# the cut" in t and "next(" not in t)
        assert "to the loss break" in p1["message"] and "at Tensor.item()" in p1["message"] and p1["src"].endswith(f":{line}")
    else:  # a light run is told how to get a graph that names it, and the usual ways to lose one
        assert "mode='default' captures the first step" in p1["message"]
        # (QA 51b: it named a number remade into a loss alone, where no_grad or argmax did it)
        assert "computed under torch.no_grad(), through a non-differentiable op" in p1["message"], p1["message"]


def test_a_default_run_whose_graphs_do_not_show_the_cut_is_not_told_to_use_default(tmp_path: Path) -> None:
    """A compiled forward (its ops are not recorded) and a loss remade from its ``.item()``:
    the captured graphs cannot name the op, and the finding said "mode='default' captures the
    first step" to a run recorded in default mode."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    model.compile(backend="aot_eager")  # compiled in place: watch(model) sees the compiled call
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "leaf.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="default"):
        for _ in range(4):
            opt.zero_grad()
            value = F.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,)))
            torch.tensor(value.item(), requires_grad=True).backward()
            opt.step()
    (p1,) = [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P1"]
    assert "mode='default'" not in p1["message"] and "none of this run's captured graphs shows it" in p1["message"], p1
