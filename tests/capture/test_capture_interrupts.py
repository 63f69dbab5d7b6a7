"""A forward cut short by KeyboardInterrupt (a notebook's Stop button, Ctrl-C), then training
goes on in the next cell.

torch runs a module's ``always_call`` forward hooks when the forward raises an ``Exception``,
not a ``KeyboardInterrupt``: the capture must notice the forward that never ended, or every
later forward counts as nested in it and none is recorded (nor judged by the doctor).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 32)
        self.drop = nn.Dropout(0.3)
        self.b = nn.Linear(32, 2)
        self.stop = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.relu(self.a(x)))
        if self.stop:
            self.stop = False
            raise KeyboardInterrupt  # what SIGINT does to a cell stopped mid-forward
        return self.b(h)


class Stoppable(nn.Linear):
    stop = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if Stoppable.stop:
            Stoppable.stop = False
            raise KeyboardInterrupt
        return super().forward(x)


def _train(model: nn.Module, opt: torch.optim.Optimizer, forward: Any, steps: int, data: Any) -> None:
    for _ in range(steps):
        x, y = data()
        opt.zero_grad()
        nn.functional.cross_entropy(forward(x), y).backward()
        opt.step()


def _interrupted_run(tmp_path: Path, mode: str, watched: bool, evaluate: bool) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    path = tmp_path / f"{mode}.tscope"
    w = torchscope.watch(model, opt, server=None, record=path, mode=mode) if watched else None
    _train(model, opt, model, 4, lambda: (x, y))
    model.stop = True
    with pytest.raises(KeyboardInterrupt):
        _train(model, opt, model, 4, lambda: (x, y))
    for _ in range(4):  # the next cells: epochs, each with an evaluation
        model.train()
        _train(model, opt, model, 4, lambda: (x, y))
        model.eval()
        if evaluate:
            (model(x).argmax(1) == y).float().mean()  # without no_grad: a graph nobody uses (P6)
    if w is not None:
        w.close()
    return path, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_forwards_after_a_stop_are_recorded(tmp_path: Path, mode: str) -> None:
    path, params = _interrupted_run(tmp_path, mode, watched=True, evaluate=False)
    _, plain = _interrupted_run(tmp_path / "plain", mode, watched=False, evaluate=False)
    assert all(torch.equal(params[k], plain[k]) for k in plain)
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert len(steps) == 4 + 16
    # the interrupted step's forward, and every one after it
    assert [e["step"] for e in steps if not e.get("forwards")] == []
    assert all(e["forwards"][-1].get("built_graph") for e in steps[5:])
    if mode == "full":  # every step's graph has its forward ops
        graphs = [e for e in iter_events(path) if e["kind"] == "graph"]
        assert all(any(o["phase"] == "forward" for o in g["ops"]) for g in graphs[5:])


def test_the_doctor_still_sees_the_evaluations_after_a_stop(tmp_path: Path) -> None:
    path, _ = _interrupted_run(tmp_path, "default", watched=True, evaluate=True)
    codes = {(f["code"], f["severity"]) for f in diagnose(iter_events(path))}
    assert ("P6", "warning") in codes


def test_a_forward_begun_by_a_submodule_and_stopped(tmp_path: Path) -> None:
    """A loop that calls the model's layers itself (``for layer in model: h = layer(h)``): each
    layer's call is a forward of the model; a Stop inside the last one cuts it short, and it
    is told as a forward that built no graph, not merged with the next call of that layer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Stoppable(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))

    def by_layers(h: torch.Tensor) -> torch.Tensor:
        for layer in model:
            h = layer(h)
        return h

    path = tmp_path / "layers.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        _train(model, opt, by_layers, 3, lambda: (x, y))
        Stoppable.stop = True
        with pytest.raises(KeyboardInterrupt):
            _train(model, opt, by_layers, 1, lambda: (x, y))
        _train(model, opt, by_layers, 6, lambda: (x, y))
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert len(steps) == 3 + 6
    stopped = steps[3]["forwards"]
    assert [f["built_graph"] for f in stopped[:3]] == [True, True, False]
    for e in steps[4:]:  # three layers' calls each, every one with its graph
        assert [f["built_graph"] for f in e["forwards"]] == [True, True, True]


def test_a_step_stopped_inside_optimizer_step_is_still_a_step(tmp_path: Path) -> None:
    """A Stop that lands inside ``optimizer.step()`` (after its pre-hooks: mid-update) leaves
    the step's post-hooks unrun; the next forward ends the step it began."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    path = tmp_path / "in_step.tscope"
    began = [0]

    def stop_in_step(o: torch.optim.Optimizer, a: Any, k: Any) -> None:
        began[0] += 1
        if began[0] == 4:
            raise KeyboardInterrupt  # the capture's pre-hook (a global one) ran before this

    with torchscope.watch(model, opt, server=None, record=path):
        opt.register_step_pre_hook(stop_in_step)
        with pytest.raises(KeyboardInterrupt):
            _train(model, opt, model, 6, lambda: (x, y))
        _train(model, opt, model, 5, lambda: (x, y))  # the next cell
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert began[0] == 3 + 1 + 5 and len(steps) == began[0]
    cut = [e["step"] for e in steps if {"what": "step_cut_short"} in e.get("events", [])]
    assert cut == [3]
    assert all(e["micro_batches"] == 1 for e in steps)  # no step took two backward passes
    assert [f["code"] for f in diagnose(iter_events(path)) if f["severity"] != "info"] == []


# the step's close that optimizer.step() ends with; the global pre-hook every step() runs first
CLOSE, PRE_HOOK = ("_close_step", "_opt_post"), ("_any_opt_pre",)


class _StopAtCall:
    """Raises KeyboardInterrupt at the n-th Python call made while the functions ``under`` are
    all on the stack (by default the capture closing a step at the end of ``optimizer.step()``:
    its ``Watch._close_step`` under the step's post-hook): where a real SIGINT lands, since the
    interpreter raises it at a function's entry (or a loop's jump back), not mid-line.  With
    n=0 it stops nowhere; ``names`` holds each call's function and file."""

    def __init__(self, n: int, under: tuple[str, ...] = CLOSE) -> None:
        self.n, self.under, self.calls, self.fired = n, under, 0, False
        self.names: list[tuple[str, str]] = []

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" or self.fired:
            return None
        names = []
        f = frame.f_back
        while f is not None:
            names.append(f.f_code.co_name)
            f = f.f_back
        if not all(u in names for u in self.under):
            return None
        self.calls += 1
        self.names.append((frame.f_code.co_name, Path(frame.f_code.co_filename).name))
        if self.calls == self.n:
            self.fired = True
            raise KeyboardInterrupt
        return None


def _step_stopped_at(n: int, model: nn.Module, opt: torch.optim.Optimizer, data: Any,
                     under: tuple[str, ...] = CLOSE) -> None:
    """One training step with a Stop at the n-th call made ``under`` (``_StopAtCall``)."""
    sys.settrace(_StopAtCall(n, under))
    try:
        _train(model, opt, model, 1, data)
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)


def _count_close_calls(model: nn.Module, opt: torch.optim.Optimizer, data: Any) -> int:
    probe = _StopAtCall(0)
    sys.settrace(probe)
    try:
        _train(model, opt, model, 1, data)
    finally:
        sys.settrace(None)
    return probe.calls


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_stop_inside_the_capture_closing_a_step_never_repeats_its_number(tmp_path: Path, mode: str) -> None:
    """A Ctrl-C that lands while the capture writes a step's record (after optimizer.step()'s
    update, in its post-hook): at every call of that close in turn.  Each step keeps its own
    number (the next step used to be merged into the number already written), the training is
    unchanged, and the capture goes on recording."""

    def run(watched: bool, stops: int = 0) -> tuple[Path, dict[str, torch.Tensor], int]:
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
        path = tmp_path / f"{mode}-{watched}.tscope"
        w = torchscope.watch(model, opt, server=None, record=path, mode=mode) if watched else None
        _train(model, opt, model, 2, lambda: (x, y))
        total = _count_close_calls(model, opt, lambda: (x, y)) if watched else 0
        stride = max(1, total // 60)
        for n in range(1, total + 1, stride):  # a Stop at the n-th call of one step's close
            _step_stopped_at(n, model, opt, lambda: (x, y))
        if not watched:  # the same number of steps, none stopped
            _train(model, opt, model, 1 + stops, lambda: (x, y))
        _train(model, opt, model, 3, lambda: (x, y))
        if w is not None:
            w.close()
        return path, {k: v.clone() for k, v in model.state_dict().items()}, total

    path, params, total = run(True)
    assert total > 20  # the close made calls to stop at
    _, plain, _ = run(False, stops=len(range(1, total + 1, max(1, total // 60))))
    assert all(torch.equal(params[k], plain[k]) for k in plain)
    numbers = [e["step"] for e in iter_events(path) if e["kind"] == "step"]
    assert numbers == sorted(set(numbers)), [n for n in numbers if numbers.count(n) > 1]
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert all(e["micro_batches"] <= 1 for e in steps)  # no step took the next one's backward
    assert [e["micro_batches"] for e in steps[-3:]] == [1, 1, 1]  # and it goes on recording
    assert all(e["forwards"] for e in steps[-3:])


@pytest.mark.parametrize("under", [CLOSE, PRE_HOOK], ids=["close", "pre_hook"])
def test_a_stop_at_the_exit_of_a_no_grad_block_of_ours_leaves_grad_mode_on(tmp_path: Path, under: tuple[str, ...]) -> None:
    """A Ctrl-C landing on the ``__exit__`` of a ``torch.no_grad()`` of ours (a Python call, where
    a signal is raised) skipped its restore: grad mode stayed off, and every later
    ``loss.backward()`` of the loop raised "element 0 of tensors does not require grad".  In the
    step's close (found when this session's changes moved the sampled stops onto one), and in the
    global pre-hook every optimizer.step() runs first, whose own grad-mode guard then restored the
    mode our interrupted block had left off (QA 48e: 4 of ~8,300 SIGINTs).  Full mode reads the
    update and the parameters under no_grad there; each puts grad mode back as it found it."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    with torchscope.watch(model, opt, server=None, record=tmp_path / "run.tscope", mode="full"):
        _train(model, opt, model, 2, lambda: (x, y))
        probe = _StopAtCall(0, under)
        sys.settrace(probe)
        try:
            _train(model, opt, model, 1, lambda: (x, y))
        finally:
            sys.settrace(None)
        exits = [n for n, (name, file) in enumerate(probe.names, 1) if name == "__exit__" and file == "grad_mode.py"]
        assert exits  # the premise: no_grad blocks of ours run there
        for n in exits:
            _step_stopped_at(n, model, opt, lambda: (x, y), under)
            assert torch.is_grad_enabled(), f"grad mode left off by a stop at call {n}"
        _train(model, opt, model, 2, lambda: (x, y))  # and the loop trains on
