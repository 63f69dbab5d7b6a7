"""Reading a run while it goes on, from the process that records it (a notebook's next cell)
and from another (``torchscope info`` in a terminal): up to date, and told as running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

import torchscope


def test_load_in_the_same_process_sees_every_step_so_far(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / "live.tscope"
    w = torchscope.watch(model, opt, server=None, record=path)
    try:
        for _ in range(30):
            x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        run = torchscope.load(path)  # at once: no wait for the writer's next flush
        assert len(run.steps) == 30
        assert run.status == "running"
        # another process reads the same file: the writer (this test) is alive
        info = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "info", str(path)],
                              capture_output=True, text=True, timeout=120)
        assert info.returncode == 0, info.stderr
        status = next(line for line in info.stdout.splitlines() if "status" in line)
        assert "running" in status and "unexpectedly" not in status
    finally:
        w.close()
    assert torchscope.load(path).status == "finished"
