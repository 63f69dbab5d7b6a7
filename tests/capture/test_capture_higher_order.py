"""Higher-order gradients (a gradient penalty) and the memory categories of captured steps.

``torch.autograd.grad(..., create_graph=True)`` builds new autograd nodes out of the backward
pass itself; the captured graph marks exactly those nodes ``higher_order``.  The test finds
them independently: nodes reachable from the returned gradient that were not in the graph
before the call.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch
from capture_models import grad_fn_nodes
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _penalty_step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[Any], list[Any]]:
    out = model(x).sum()
    before = grad_fn_nodes([out.grad_fn])  # held: ids stay valid
    (g,) = torch.autograd.grad(out, x, create_graph=True)
    new = [n for n in grad_fn_nodes([g.grad_fn]) if id(n) not in {id(b) for b in before}]
    loss = out + (g.norm() - 1) ** 2
    return loss, before, new


def test_create_graph_nodes_are_marked_higher_order(tmp_path: Path) -> None:
    x = torch.randn(16, 4, requires_grad=True)
    # expected, from plain PyTorch
    model = _model()
    _, _, new = _penalty_step(model, x)
    expected = Counter(type(n).__name__ for n in new)
    assert expected, "a create_graph pass builds nodes"

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "gp.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(2):
            loss, _, _ = _penalty_step(model, x)
            opt.zero_grad()
            loss.backward()
            opt.step()
    graphs = [e for e in iter_events(path) if e["kind"] == "graph"]
    assert len(graphs) == 2
    for g in graphs:
        marked = Counter(n["name"] for n in g["nodes"] if n.get("higher_order"))
        assert marked == expected
        # the forward's own nodes are not marked
        assert any(n["name"] == "AddmmBackward0" and not n.get("higher_order") for n in g["nodes"])


def test_backward_create_graph_marks_the_gradient_graph(tmp_path: Path) -> None:
    """``loss.backward(create_graph=True)``: the params' .grad carry the new graph; a later
    backward through them (a penalty on gradients) shows those nodes as higher-order."""
    model = _model()
    x = torch.randn(16, 4)
    path = tmp_path / "bcg.tscope"
    with torchscope.watch(model, None, server=None, record=path, mode="full") as w:
        loss = model(x).pow(2).mean()
        before = {id(n): n for n in grad_fn_nodes([loss.grad_fn])}  # held: ids stay valid
        loss.backward(create_graph=True)
        w.step()  # step 0: the create_graph pass
        grads_graph = grad_fn_nodes([p.grad.grad_fn for p in model.parameters() if p.grad is not None])
        new = [n for n in grads_graph if id(n) not in before]
        penalty = sum(p.grad.pow(2).sum() for p in model.parameters() if p.grad is not None)
        assert isinstance(penalty, torch.Tensor)
        penalty.backward()  # step 1: through the gradients' graph
        w.step()
        for p in model.parameters():
            p.grad = None  # breaks the param <-> grad cycle create_graph makes
    graphs = {e["step"]: e for e in iter_events(path) if e["kind"] == "graph"}
    assert sorted(graphs) == [0, 1]
    assert not any(n.get("higher_order") for n in graphs[0]["nodes"])
    marked = Counter(n["name"] for n in graphs[1]["nodes"] if n.get("higher_order"))
    assert marked == Counter(type(n).__name__ for n in new)
    assert marked and "AccumulateGrad" not in marked


def test_captured_step_memory_has_a_measured_peak_and_temporaries(tmp_path: Path) -> None:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    path = tmp_path / "mem.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(256, 4)).pow(2).mean().backward()
            opt.step()
    events = list(iter_events(path))
    steps = [e for e in events if e["kind"] == "step"]
    graphs = {e["step"]: e for e in events if e["kind"] == "graph"}
    for st in steps:
        mem = st["memory"]
        ledger_peak = max(o["live"] for o in graphs[st["step"]]["ops"])
        assert mem["peak"] >= ledger_peak
        # the (256, 8) hidden activation alone is 8 kB: the ledger saw more than state
        assert ledger_peak > mem["params"] + 256 * 8 * 4
        assert mem["temporaries"] >= 0
        assert mem["temporaries"] <= mem["peak"]
