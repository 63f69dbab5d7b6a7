"""Watches and worker processes (mnist_hogwild's shared-memory training, a ``Pool``): a watch
made inside a forked worker is closed as the worker ends (it leaves by ``os._exit``, which runs
no ``atexit``: the run read "ended unexpectedly" and lost its last steps), and a parent's watch
captures nothing in a child forked from it (the child printed "following SGD ..." and recorded
nothing)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


def _train(model: nn.Module, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 2)).backward()
        opt.step()


def _worker(path: str) -> None:
    torch.set_num_threads(1)
    model = nn.Linear(4, 2)
    torchscope.watch(model, server=None, record=path, mode="default")  # closed by nobody: as the worker ends
    _train(model, 30)


def test_a_watch_in_a_forked_worker_ends_with_the_worker(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_worker, args=(str(tmp_path / f"worker{r}.tscope"),)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for r in range(2):
        events = list(iter_events(tmp_path / f"worker{r}.tscope"))
        assert sum(e["kind"] == "step" for e in events) == 30
        assert [e["status"] for e in events if e["kind"] == "end"] == ["finished"]


PARENT = textwrap.dedent("""
    import multiprocessing, sys, torch, torchscope
    from torch import nn
    def train(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(5):
            opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
    if __name__ == "__main__":
        model = nn.Linear(4, 2); model.share_memory()
        w = torchscope.watch(model, server=None, record=sys.argv[1])
        child = multiprocessing.get_context("fork").Process(target=train, args=(model,))
        child.start(); child.join(60)
        train(model)
        w.close()
        print("exit", child.exitcode)
""")


def test_a_parents_watch_captures_nothing_in_a_forked_child(tmp_path: Path) -> None:
    path = tmp_path / "parent.tscope"
    res = subprocess.run([sys.executable, "-c", PARENT, str(path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0 and "exit 0" in res.stdout, res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("torchscope:")]
    # the parent's own lines (its watch, the optimizer it follows), none from the child
    assert [line.split(" ")[1] for line in said] == ["watching", "following"], said
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert len(steps) == 5  # the parent's own steps, not the child's
