"""The native walk key of a backward's graph (``graph_key``, capture/native/graph.cpp): equal
exactly where an independent Python walk of ``grad_fn`` finds the same structure."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from capture_models import Square, make
from torch import nn

from torchscope import _native
from torchscope._autograd import AutogradWalk


@pytest.fixture(scope="module")
def ext() -> Any:
    ext = _native.get(block=True)
    assert ext is not None, f"the native extension did not build: {_native._error}"
    return ext


def _loss(kind: str, seed: int) -> torch.Tensor:
    model, batch = make(kind)
    x, y = batch(seed)
    out = model(x)
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y)


@pytest.mark.parametrize("kind", ["zoo", "cnn", "transformer", "mlp"])
def test_key_counts_the_nodes_a_python_walk_finds(ext: Any, kind: str) -> None:
    """Branches, shared parameters, a custom Function, in-place ops, views, detach and no_grad
    islands (the zoo), convolutions, attention: the same nodes, and the same key for the same
    structure built again from other data."""
    a, b = _loss(kind, 0), _loss(kind, 1)
    key, nodes = ext.graph_key([a], 0)
    assert nodes == len(AutogradWalk([a.grad_fn]).nodes)
    assert ext.graph_key([b], 0) == (key, nodes)
    assert ext.graph_key([b], nodes) == (key, nodes)  # the size hint changes nothing
    assert AutogradWalk([a.grad_fn]).signature() == AutogradWalk([b.grad_fn]).signature()


def test_key_differs_exactly_where_the_signature_does(ext: Any) -> None:
    """Same node count, another class; another edge; another input slot; several roots, a
    root twice, None roots and roots without a graph; Python autograd.Functions by class."""
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)

    class Twice(Square):
        pass

    graphs = {
        "relu": lambda: [torch.relu(lin(x)).sum()],
        "tanh": lambda: [torch.tanh(lin(x)).sum()],
        "add_xy": lambda: [(lin(x) + x).sum()],
        "add_yx": lambda: [(x + lin(x)).sum()],  # same nodes, edges into other input slots
        "square": lambda: [Square.apply(lin(x)).sum()],
        "twice": lambda: [Twice.apply(lin(x)).sum()],  # same C++ node class (PyNode), other Function
        "two_roots": lambda: [torch.relu(lin(x)).sum(), torch.tanh(lin(x)).sum()],
        "root_twice": lambda: [torch.relu(lin(x)).sum()] * 2,
    }
    keys: dict[str, tuple[int, int]] = {}
    sigs: dict[str, str] = {}
    for name, build in graphs.items():
        roots = build()
        keys[name] = ext.graph_key(roots, 0)
        walk = AutogradWalk([r.grad_fn for r in roots])
        sigs[name] = walk.signature()
        assert keys[name][1] == len(walk.nodes), name
        assert ext.graph_key(build(), 0) == keys[name], name  # rebuilt: the same key
    for a in graphs:
        for b in graphs:
            assert (keys[a] == keys[b]) == (sigs[a] == sigs[b]), (a, b)
    assert keys["relu"][1] == keys["tanh"][1] and keys["relu"] != keys["tanh"]
    no_graph = torch.randn(3)
    assert ext.graph_key([None, no_graph], 0)[1] == 0
    assert ext.graph_key([None, *graphs["relu"]()], 0) == keys["relu"]
    with pytest.raises(TypeError):
        ext.graph_key([1.0], 0)
