"""A watch never closed, its loop over: the function mode the capture had on for the step's
data movement (after optimizer.step(), until a next forward that never comes) stayed on the
stack for the rest of the process, every later torch call paying 1.5-2.4x (QA 37c).  Once the
watched loop has been idle for _IDLE_S, the next module call takes it off; a watch whose model
is gone is closed there, as the next watch() would close it."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope import _watch
from torchscope.sessionfile import iter_events


def _steps(model: nn.Module, opt: torch.optim.Optimizer, n: int) -> None:
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()


def _train(path: Path, steps: int) -> tuple[nn.Module, torch.optim.Optimizer, torchscope.Watch]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = torchscope.watch(model, opt, server=None, record=path)
    _steps(model, opt, steps)
    return model, opt, w


def _busy(n: int = 5000) -> None:
    """Plain torch calls, as a notebook's next cells make them."""
    x = torch.ones(3)
    for _ in range(n):
        x = x + 0


@pytest.fixture
def quick_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_watch, "_IDLE_S", 0.2, raising=False)  # the idle time a test can wait


def test_a_loop_gone_idle_leaves_no_mode_on_the_stack(tmp_path: Path, quick_idle: None) -> None:
    path = tmp_path / "idle.tscope"
    model, opt, w = _train(path, 20)  # step 20 counts copies: the mode stays on after it
    try:
        assert torch._C._len_torch_function_stack() == 1  # the precondition: left on
        import time

        time.sleep(0.3)
        _busy()
        nn.Linear(2, 2)(torch.ones(1, 2))  # a module call of the next cell: outside the mode's handler
        assert torch._C._len_torch_function_stack() == 0
        assert not w._closed  # its model lives: the watch goes on, only the mode is off
        _steps(model, opt, 10)  # the loop goes on: the mode is on again after its 30th step
        assert torch._C._len_torch_function_stack() == 1
        time.sleep(0.3)
        _busy()  # idle again, and the loop comes back: its own forward is no idle module call
        _steps(model, opt, 5)
    finally:
        w.close()
    assert torch._C._len_torch_function_stack() == 0
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(35))


def test_a_watch_whose_model_is_gone_is_closed_at_the_next_module_call(tmp_path: Path, quick_idle: None) -> None:
    path = tmp_path / "gone.tscope"
    model, opt, w = _train(path, 20)
    del opt
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None and torch._C._len_torch_function_stack() == 1
    _busy()
    nn.Linear(2, 2)(torch.ones(1, 2))
    assert torch._C._len_torch_function_stack() == 0 and w._closed
    events = list(iter_events(path))
    assert events[-1]["kind"] == "end" and sum(e["kind"] == "step" for e in events) == 20
