"""The CUDA adapter off CUDA: ``cuda_history`` is inert on a CPU model (no files, no error),
and the allocator figures are absent from the memory stats rather than zero."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


def test_cuda_history_is_inert_on_cpu(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "cpu.tscope"
    with torchscope.watch(model, opt, server=None, record=path, cuda_history=10_000) as w:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
        assert w._history is not None and not w._history.on
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.tscope"]
    events = list(iter_events(path))
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 3
    assert all("device" not in s["memory"] and "other" not in s["memory"] for s in steps)
    assert not [e for e in events if e["kind"] == "log" and e.get("level") == "error"]
