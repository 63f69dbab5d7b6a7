"""Captured graphs carry the user's computation only, with the right owners and call sites.

The capture's own bookkeeping (placeholder tensors, ``record_function`` markers of the
optimizer) must not show up as ops; AccumulateGrad nodes name their parameter's module; an
op's ``src`` is the user's line, found without a stack walk per op inside torch modules.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events

_THIS = Path(__file__)


def _line(marker: str) -> str:
    """``basename:line`` of the line of this file that ends with ``marker``."""
    for i, text in enumerate(_THIS.read_text().splitlines(), start=1):
        if text.rstrip().endswith(marker) and "_line(" not in text:
            return f"{_THIS.name}:{i}"
    raise AssertionError(marker)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 16)
        self.body = nn.Sequential(nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 16))
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)  # src-lin
        h = torch.tanh(h) * 2  # src-tanh
        return self.head(self.body(h))  # src-head


def _run(tmp_path: Path, steps: int = 2) -> tuple[list[dict[str, Any]], list[dict[str, tuple[float, float, float]]]]:
    """Train Net under full capture; also take each module output's gradient stats by hand."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    by_hand: list[dict[str, tuple[float, float, float]]] = []

    def keep_stats(path: str) -> Any:
        def fwd_hook(m: nn.Module, args: Any, out: torch.Tensor) -> None:
            def grad_hook(g: torch.Tensor) -> None:
                by_hand[-1][path] = (g.norm().item(), g.abs().max().item(), float((g == 0).double().mean().item()))

            out.register_hook(grad_hook)

        return fwd_hook

    for path, m in model.named_modules():
        if path:
            m.register_forward_hook(keep_stats(path))
    path = tmp_path / "net.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(steps):
            by_hand.append({})
            x, y = torch.randn(6, 8), torch.randint(0, 3, (6,))
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)  # src-loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    return list(iter_events(path)), by_hand


def test_no_bookkeeping_ops_and_accumulate_grad_has_module(tmp_path: Path) -> None:
    events, _ = _run(tmp_path)
    session = events[0]
    owner = {p["name"]: p["module"] for p in session["params"]}
    graphs = [e for e in events if e["kind"] == "graph"]
    assert len(graphs) == 2
    for g in graphs:
        tensors = g["tensors"]
        names = [o["name"] for o in g["ops"]]
        assert "aten::addmm" in names and "aten::tanh" in names  # the real work is there
        assert not [n for n in names if n.startswith("profiler::")]
        empty = [
            o for o in g["ops"]
            if not o["inputs"] and o["outputs"] and all(0 in tensors[t]["shape"] for t in o["outputs"])
        ]  # fmt: skip
        assert empty == []
        acc = [n for n in g["nodes"] if n["name"] == "AccumulateGrad"]
        assert len(acc) == len(owner)
        for n in acc:
            assert n["module"] == owner[n["param"]]
        assert {n["module"] for n in acc} == {"lin", "body.2", "head"}
        # the storage ledger still adds up: live at each op = previous live + alloc - free
        ops = g["ops"]
        assert sum(o["alloc"] for o in ops) > 0
        for prev, o in zip(ops, ops[1:], strict=False):
            assert o["live"] == prev["live"] + o["alloc"] - o["free"]


def test_activation_grads_match_by_hand(tmp_path: Path) -> None:
    events, by_hand = _run(tmp_path)
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 2
    for st, hand in zip(steps, by_hand, strict=True):
        got = {a["module"]: a for a in st["activation_grads"]}
        assert set(hand) <= set(got)
        for path, (norm, max_abs, zero_frac) in hand.items():
            a = got[path]
            assert a["norm"] == pytest.approx(norm, rel=1e-5)
            assert a["max_abs"] == pytest.approx(max_abs, rel=1e-6)
            assert a["zero_frac"] == pytest.approx(zero_frac, abs=1e-9)
            assert a["nan"] == 0 and a["inf"] == 0
        # the gradient reaching the ReLU's output is zero where the dropout after it dropped:
        # the column really has zeros to count
        assert got["body.0"]["zero_frac"] > 0


def test_op_src_is_the_users_line(tmp_path: Path) -> None:
    events, _ = _run(tmp_path, steps=1)
    g = next(e for e in events if e["kind"] == "graph")
    fwd = [o for o in g["ops"] if o["phase"] == "forward"]
    src_of: dict[tuple[str, str], set[str]] = {}
    for o in fwd:
        src_of.setdefault((o["module"], o["name"]), set()).add(o["src"])
    # inside torch's own nn.Linear: the line that called the module
    assert src_of[("lin", "aten::addmm")] == {_line("# src-lin")}
    assert src_of[("head", "aten::addmm")] == {_line("# src-head")}
    assert src_of[("body.2", "aten::addmm")] == {_line("# src-head")}
    # written in the user's forward: that line
    assert src_of[("", "aten::tanh")] == {_line("# src-tanh")}
    assert src_of[("", "aten::mul")] == {_line("# src-tanh")}
    # the loss, outside the model
    loss_ops = [o for o in fwd if "outside_model" in o.get("flags", [])]
    assert loss_ops and {o["src"] for o in loss_ops} == {_line("# src-loss")}


def test_memory_follows_a_replaced_parameter_storage(tmp_path: Path) -> None:
    """The boundary's storage sizes are remembered per tensor, but a parameter whose data is
    replaced (``p.data = ...``) is measured again."""
    torch.manual_seed(0)
    model = nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "lin.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for i in range(3):
            if i == 2:  # the weight now views a storage twice its size
                big = torch.zeros(2 * model.weight.numel())
                big[: model.weight.numel()] = model.weight.detach().reshape(-1)
                model.weight.data = big[: model.weight.numel()].view(32, 32)
            loss = model(torch.randn(4, 32)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    params = [s["memory"]["params"] for s in steps]
    w, b = 32 * 32 * 4, 32 * 4
    assert params == [w + b, w + b, 2 * w + b]
    assert all(math.isfinite(s["loss"]) for s in steps)
