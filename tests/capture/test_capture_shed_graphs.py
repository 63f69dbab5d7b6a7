"""Graph events shed under back-pressure (the writer behind: more than _MAX_PENDING_GRAPHS
waiting) never slow the loop, and the steps whose graph was shed say so: ``graph_captured``
false, so the dashboard and the doctor do not look for a graph that is not in the file; the end
event counts the ops shed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope import transport
from torchscope.sessionfile import iter_events


@pytest.mark.parametrize("room", [0, 16])
def test_a_step_whose_graph_was_shed_says_it_has_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, room: int) -> None:
    monkeypatch.setattr(transport, "_MAX_PENDING_GRAPHS", room)  # 0: a writer that has fallen far behind
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "shed.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
    events = list(iter_events(path))
    steps = {e["step"]: e for e in events if e["kind"] == "step"}
    graphs = {e["step"] for e in events if e["kind"] == "graph"}
    assert len(steps) == 5
    assert {s for s, e in steps.items() if e["graph_captured"]} == graphs
    end = next(e for e in events if e["kind"] == "end")
    if room == 0:
        assert graphs == set() and end["shed_ops"] > 0
    else:
        assert graphs == set(range(5)) and not end.get("shed_ops")
