"""A finding read from captured graphs tells its steps against the steps that have a graph.

Default mode captures every ``sample_every``-th step, and a long ``full`` run's graphs are
sampled as the doctor reads them (doctor/kept.py): a loss given probabilities on every step from
5,500 of a 6,000-step full run read "on 15 steps (5500, 5550, ...)", as though the steps between
were clean (QA 52a).  Now "every captured graph since step 5500", and a sample is said to be one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose, kept
from torchscope.sessionfile import iter_events

STEPS = 60
FROM = 20  # the loss is given probabilities from this step on


def _record(path: Path, mode: str) -> Path:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode, sample_every=10):
        for i in range(STEPS):
            out = model(torch.randn(4, 8))
            out = torch.softmax(out, dim=-1) if i >= FROM else out
            loss = nn.functional.cross_entropy(out, torch.randint(0, 3, (4,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return path


def _p16(path: Path) -> str:
    (found,) = [f["message"] for f in diagnose(iter_events(path)) if f["code"] == "P16"]
    return found


def test_every_sampled_graph_since_a_step_reads_so(tmp_path: Path) -> None:
    message = _p16(_record(tmp_path / "default.tscope", "default"))
    assert "(every captured graph since step 20, 4 graphs: 20, 30, 40, 50)" in message, message


def test_a_long_full_runs_sampled_graphs_read_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _record(tmp_path / "full.tscope", "full")
    assert "(captured graphs since step 20, every step)" in _p16(path)  # read whole: every step has one
    monkeypatch.setattr(kept, "BUDGET_RECORDS", 1)
    monkeypatch.setattr(kept, "FIRST_STRIDE", 10)
    message = _p16(path)
    assert ("(every captured graph since step 20, 9 graphs: 20, 30, 40, 50, 55, 56, ...; the doctor read a sample of "
            "this long run's graphs, not every step's)") in message, message
