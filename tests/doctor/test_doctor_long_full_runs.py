"""A long ``full`` run's graphs are sampled as the doctor reads them (doctor/kept.py).

``full`` captures a graph every step; the doctor held every one: 6.9 GB and 101 s for a
30,000-step three-layer MLP (QA 51a), and the server's doctor child reads a streamed run the same
way.  Past a budget of records it now keeps what a sampled capture would have -- every
``stride``-th step (a stride that doubles as the run grows), structure changes, the steps around
a NaN -- and reaches the same findings.  The budget is made small here so a short real run
crosses it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose, kept
from torchscope.doctor.run import split_by_rank
from torchscope.sessionfile import iter_events

STEPS = 160
NAN_AT = 130
WIDE_FROM = 90  # the forward takes another path from here on: a new graph structure


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 2)
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if self.step >= WIDE_FROM:
            h = h + torch.tanh(self.b(h))
        # a sqrt of a negative number once, at NAN_AT: NaN made by aten::sqrt
        h = torch.sqrt(h + (-1e3 if self.step == NAN_AT else 1.0))
        return self.c(h)


@pytest.fixture(scope="module")
def run_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("long") / "long.tscope"
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for i in range(STEPS):
            model.step = i
            loss = nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 2, (4,)))
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():  # the NaN batch's gradients are dropped: the run goes on
                p.grad = torch.nan_to_num(p.grad, nan=0.0) if p.grad is not None else None
            opt.step()
    return path


def _graph_records(path: Path) -> int:
    """Records of one graph of the run: the budget is set to a few graphs' worth."""
    g = next(e for e in iter_events(path) if e["kind"] == "graph")
    return sum(len(g.get(k, [])) for k in ("ops", "nodes", "edges", "tensors", "memory_timeline"))


def _p4(findings: list[Any]) -> list[str]:
    return [f["message"] for f in findings if f["code"] == "P4"]


def test_a_long_full_run_keeps_sampled_graphs_and_the_same_nan_origin(run_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = diagnose(iter_events(run_file))
    (origin,) = _p4(whole)
    assert "aten::sqrt" in origin and f"step {NAN_AT}" in origin, origin

    monkeypatch.setattr(kept, "BUDGET_RECORDS", 10 * _graph_records(run_file))
    monkeypatch.setattr(kept, "FIRST_STRIDE", 8)
    (run,) = split_by_rank(iter_events(run_file))
    steps = sorted(run.graphs)
    assert run.graphs_left_out == STEPS - len(steps) > STEPS // 2
    assert steps[:10] == list(range(10))  # the budget's graphs, whole
    assert {NAN_AT - 1, NAN_AT, NAN_AT + 1} <= set(steps)  # around the NaN
    assert WIDE_FROM in steps  # the new structure
    assert {s for s in steps if s % 8 == 0 and s < STEPS - kept.WINDOW} == set(range(0, STEPS - kept.WINDOW, 8))
    # the same finding, at the same op and step
    assert _p4(diagnose(iter_events(run_file))) == [origin]


def test_the_sampled_graphs_stay_bounded_however_long_the_run(run_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past SAMPLED_CAP sampled graphs the stride doubles and every other one goes."""
    monkeypatch.setattr(kept, "BUDGET_RECORDS", 2 * _graph_records(run_file))
    monkeypatch.setattr(kept, "FIRST_STRIDE", 2)
    monkeypatch.setattr(kept, "SAMPLED_CAP", 6)
    monkeypatch.setattr(kept, "MARKED_CAP", 0)
    (run,) = split_by_rank(iter_events(run_file))
    # (the last WINDOW + 1 steps are never judged: no step came after them)
    sampled = [s for s in run.graphs if s >= 2 and s != WIDE_FROM and s < STEPS - kept.WINDOW - 1]
    assert len(sampled) <= 6, sorted(run.graphs)
    stride = min(b - a for a, b in zip(sorted(sampled), sorted(sampled)[1:], strict=False))
    assert stride >= 32 and all(s % stride == 0 for s in sampled), sorted(sampled)
