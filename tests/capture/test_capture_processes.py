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


# a process that watches its own model, trains 30 steps and never closes the watch
_SCRIPT_HEAD = textwrap.dedent("""
    import multiprocessing, os, signal, sys, torch, torchscope
    from torch import nn
    def watch_and_train(path):
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        torchscope.watch(model, opt, server=None, record=path)  # never closed
        for _ in range(30):
            opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
""")
GONE = _SCRIPT_HEAD + textwrap.dedent("""
    watch_and_train(sys.argv[1])  # the model goes with the function
    os.kill(os.getpid(), signal.SIGTERM)  # a Pool's exit terminating its worker
""")
CHILD_KILLED = _SCRIPT_HEAD + textwrap.dedent("""
    def child(path):
        watch_and_train(path)
        os.kill(os.getpid(), signal.SIGTERM)
    if __name__ == "__main__":
        w = torchscope.watch(nn.Linear(2, 2), server=None, record=sys.argv[1] + ".parent")  # its SIGTERM handler
        p = multiprocessing.get_context("fork").Process(target=child, args=(sys.argv[1],))
        p.start(); p.join(60)
        w.close()
        print("child", p.exitcode)
""")


def _interrupted_whole(script: str, path: Path) -> subprocess.CompletedProcess[str]:
    """Runs ``script``; its run recorded to ``path`` has all 30 steps and ended "interrupted"."""
    res = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    events = list(iter_events(path))
    assert sum(e["kind"] == "step" for e in events) == 30, res.stderr
    assert [e["status"] for e in events if e["kind"] == "end"] == ["interrupted"]
    return res


def test_a_sigterm_ends_a_watch_whose_model_is_gone(tmp_path: Path) -> None:
    """A Pool's task that watched its own model and returned: the pool's exit terminates the
    worker (SIGTERM), and the watch, no longer found by its model, lost its last steps and read
    "ended unexpectedly"."""
    res = _interrupted_whole(GONE, tmp_path / "task.tscope")
    assert res.returncode == -15, res.stderr  # it still dies of the signal


def test_a_forked_child_with_a_watch_of_its_own_ends_it_on_sigterm(tmp_path: Path) -> None:
    """The child inherits the parent's SIGTERM handler, which ended only the parent's runs: the
    child's own watch read "ended unexpectedly", without its last steps."""
    res = _interrupted_whole(CHILD_KILLED, tmp_path / "child.tscope")
    assert "child -15" in res.stdout, res.stderr


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
