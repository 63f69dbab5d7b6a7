"""Capture changes nothing: bit-for-bit identical training, RNG untouched, no error escapes,
no tensor kept alive."""

from __future__ import annotations

import collections
import contextlib
import gc
import inspect
import os
import traceback
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from capture_models import make, train
from torch import nn
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._python_dispatch import TorchDispatchMode

import torchscope
from torchscope.sessionfile import iter_events
from torchscope.validate import validate_event


@pytest.mark.parametrize("kind", ["mlp", "zoo", "cnn", "transformer"])
@pytest.mark.parametrize("mode", ["default", "full", "light"])
def test_bit_identical_training(kind: str, mode: str, tmp_path: Path) -> None:
    plain = train(kind, 4)
    watched = train(
        kind, 4, {"server": None, "record": tmp_path / "r.tscope", "mode": mode, "sample_every": 2}
    )
    assert plain["losses"] == watched["losses"]
    for a, b in zip(plain["params"], watched["params"], strict=True):
        assert torch.equal(a, b)
    for ga, gb in zip(plain["grads"], watched["grads"], strict=True):
        for a, b in zip(ga, gb, strict=True):
            assert (a is None and b is None) or torch.equal(a, b)
    assert torch.equal(plain["rng"], watched["rng"])  # capture consumed no random numbers
    events = list(iter_events(tmp_path / "r.tscope"))
    for e in events:
        validate_event(e)  # every record matches schema.py
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "session" and kinds[-1] == "end" and kinds.count("step") == 4
    expected_graphs = {"full": 4, "default": 2, "light": 0}[mode]
    assert kinds.count("graph") == expected_graphs


def test_no_tensor_or_graph_kept_alive(tmp_path: Path) -> None:
    model, batch = make("zoo")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = torchscope.watch(model, opt, server=None, record=tmp_path / "a.tscope", mode="full")
    refs = []
    for i in range(3):
        x, y = batch(i)
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        refs += [weakref.ref(out), weakref.ref(loss), weakref.ref(x)]
    del out, loss, x, y
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    w.close()
    mref = weakref.ref(model)
    del model, opt
    gc.collect()
    assert mref() is None  # the watch does not keep the model alive either


class _OddOptimizer(torch.optim.Optimizer):
    """A user optimizer whose param group carries an lr the capture cannot read as a float."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, {"lr": "0.1 (per layer)"})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-0.1)


def test_capture_error_never_reaches_the_user(tmp_path: Path) -> None:
    model, batch = make("mlp")
    opt = _OddOptimizer(model.parameters())
    path = tmp_path / "odd.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for i in range(3):
            x, y = batch(i)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()  # the capture's step hook fails inside; training must go on
    events = list(iter_events(path))
    logs = [e for e in events if e["kind"] == "log"]
    assert len(logs) == 1 and "turned off" in logs[0]["message"]
    assert events[-1]["kind"] == "end"


def test_user_backward_error_is_reraised_unchanged_and_recorded(tmp_path: Path) -> None:
    model, batch = make("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "twice.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        x, y = batch(0)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time") as raised:
            loss.backward()
        opt.step()
    # the frames that put the backward at the user's line (for torch's warnings) are not shown:
    # the user's line appears once, as unwatched
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert [f.line for f in frames if f.filename == __file__] == ["loss.backward()"]
    # and one frame of torchscope's (the torch-function mode's, which torch calls): its line
    # says what it does, the watch's backward wrapper is not shown
    ours = [f for f in frames if f.filename.startswith(os.path.dirname(torchscope.__file__) + os.sep)]
    assert len(ours) == 1 and ours[0].line is not None and ours[0].line.endswith("# torchscope runs your call unchanged")
    assert frames[-1].name == "_engine_run_backward"  # torch's frames down to the engine, as unwatched
    step = next(e for e in iter_events(path) if e["kind"] == "step")
    assert step["micro_batches"] == 2
    assert any("second time" in m for m in step["backward_errors"])


def _warned_at(call: str, watch: Any) -> set[tuple[str, int]]:
    """Where the warnings of a full backward hook on a module whose input needs no gradient
    (one per backward) are said to come from, over two steps of ``call``'s backward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4))
    model[0].register_full_backward_hook(lambda m, gi, go: None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt) if watch else contextlib.nullcontext(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            loss = model(torch.randn(2, 4)).sum()
            if call == "tensor":
                loss.backward()
            elif call == "autograd":
                torch.autograd.backward(loss)
            else:
                grads = torch.autograd.grad(loss, list(model.parameters()))
                for p, g in zip(model.parameters(), grads, strict=True):
                    p.grad = g
            opt.step()
            opt.zero_grad()
    hooks = [w for w in seen if "Full backward hook" in str(w.message)]
    assert len(hooks) == 2
    return {(w.filename, w.lineno) for w in hooks}


@pytest.mark.parametrize("call", ["tensor", "autograd", "grad"])
def test_a_warning_from_backward_is_where_it_is_unwatched(call: str, tmp_path: Path) -> None:
    """torch warns from inside backward() with a fixed stacklevel that counts its own frames:
    watched, the frames it lands on are still the user's (not the watch's), so the warning,
    and filters on its module or line, are as without the watch."""
    def watch(model: nn.Module, opt: torch.optim.Optimizer) -> Any:
        return torchscope.watch(model, opt, server=None, record=tmp_path / "w.tscope")

    plain, watched = _warned_at(call, None), _warned_at(call, watch)
    assert watched == plain
    if call == "tensor":  # the stacklevel torch chose for this one: the loss.backward() line
        (where,) = plain
        assert where[0] == __file__
        assert "loss.backward()" in inspect.getsource(_warned_at).splitlines()[where[1] - _warned_at.__code__.co_firstlineno]


def test_a_failure_placing_the_backward_at_the_users_line_is_not_the_users(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the frames that put a backward at the user's line can fail (a frame without a
    line number): the backward then runs as it would unwatched, and nothing is raised."""
    from torchscope import _srcloc

    def broken(f: Any) -> Any:
        raise TypeError("no line number")

    monkeypatch.setattr(_srcloc, "_caller", broken)
    plain = train("mlp", 2)
    watched = train("mlp", 2, {"server": None, "record": tmp_path / "r.tscope", "mode": "default"})
    assert plain["losses"] == watched["losses"]
    steps = [e for e in iter_events(tmp_path / "r.tscope") if e["kind"] == "step"]
    assert [st["micro_batches"] for st in steps] == [1, 1]


class _Marker:
    pass


class _Tag(torch.autograd.Function):
    """Identity whose graph node holds a marker: the marker lives exactly as long as the graph."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.marker = _Marker()
        _Tag.made.append(weakref.ref(ctx.marker))
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return g

    made: list[weakref.ref[_Marker]] = []


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_failed_backward_leaves_no_graph_alive(mode: str, tmp_path: Path) -> None:
    """A second backward through a freed graph raises; the loop catches it and goes on.  Each
    step's graph must die with the step, without waiting for the cyclic collector: an exception
    kept by the capture (its traceback holds frames holding the graph) made earlier steps'
    graphs pile up, and the doctor then blamed the user for graphs kept alive (P7)."""
    model, batch = make("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _Tag.made.clear()
    alive = []
    gc.disable()  # what only a collection would free is what the test is about
    try:
        with torchscope.watch(model, opt, server=None, record=tmp_path / "f.tscope", mode=mode):
            for i in range(5):
                x, y = batch(i)
                opt.zero_grad()
                out = _Tag.apply(model(x))
                first, second = nn.functional.cross_entropy(out, y), out.pow(2).mean()
                first.backward()
                with contextlib.suppress(RuntimeError):
                    second.backward()  # through the freed graph: raises
                opt.step()
                del out, first, second
                alive.append(sum(r() is not None for r in _Tag.made))
    finally:
        gc.enable()
    assert len(_Tag.made) == 5 and alive == [0] * 5, alive


def _live_tensor_bytes() -> int:
    """Bytes of every storage reachable from a live tensor object in the process."""
    gc.collect()
    seen: dict[int, int] = {}
    for o in gc.get_objects():
        # plain tensors only: other tests in the process may leave FakeTensors (torch.compile)
        if type(o) in (torch.Tensor, nn.Parameter) and o.layout == torch.strided and o.device.type == "cpu":
            st = o.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("mode", ["default", "full"])
def test_tensor_memory_stays_within_the_plain_runs(mode: str, tmp_path: Path) -> None:
    """At every step boundary the process holds the same tensor bytes with the capture as
    without it, give or take the capture's own few scalars; and that margin does not grow."""

    def run(watch: bool) -> list[int]:
        model, batch = make("cnn")
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        w = (
            torchscope.watch(model, opt, server=None, record=tmp_path / f"{mode}.tscope", mode=mode)
            if watch
            else None
        )
        live = []
        for i in range(12):
            x, y = batch(i)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            del x, y, loss
            live.append(_live_tensor_bytes())
        if w is not None:
            w.close()
        return live

    plain, watched = run(False), run(True)
    margin = [w - p for w, p in zip(watched, plain, strict=True)]
    # measured: 0 bytes; one kept activation of this model is 8 KiB (4x8x8x8 floats)
    assert max(margin) <= 1024, margin
    assert margin[-1] <= margin[2] + 1024, margin  # flat: nothing accumulates step after step


def test_garbage_collector_is_back_after_every_pass(tmp_path: Path) -> None:
    """The collector is paused only inside recorded passes: after each forward of an
    inference loop that never steps, and after each training step, it runs again."""
    model, batch = make("zoo")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert gc.isenabled()
    with torchscope.watch(model, opt, server=None, record=tmp_path / "gc.tscope", mode="full"):
        for i in range(3):  # training steps
            x, y = batch(i)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            assert gc.isenabled()
            opt.step()
            assert gc.isenabled()
        for i in range(3):  # then evaluation forwards, no optimizer step ever again
            model(batch(i)[0])
            assert gc.isenabled()
    assert gc.isenabled()


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_learned_scale_draws_no_warning_from_the_capture(mode: str, tmp_path: Path) -> None:
    """A loss multiplied by a learned 0-dim parameter (multi-task loss weights, CLIP's
    logit_scale; spectral_norm divides by one): reading the factor for P15 once drew torch's
    'Converting a tensor with requires_grad=True to a scalar' warning into the user's stderr."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    log_w = nn.Parameter(torch.zeros(()))
    opt = torch.optim.SGD([*model.parameters(), log_w], lr=0.1)
    with torchscope.watch(model, opt, server=None, record=tmp_path / "w.tscope", mode=mode), \
            warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the step
        for _ in range(3):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).square().mean() * log_w.exp() + log_w
            loss.backward()
            opt.step()
    graph = next(e for e in iter_events(tmp_path / "w.tscope") if e["kind"] == "graph")
    assert any(n.get("scalar") == 1.0 for n in graph["nodes"] if n["name"] == "MulBackward0")  # exp(0), read


class _UserMode(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def _stack() -> list[str]:
    return [type(m).__name__ for m in _get_current_function_mode_stack()]


def _modes_loop(mode: str | None, ctx: str, path: Path) -> tuple[list[float], list[list[str]]]:
    """Ten steps whose forward and backward run inside a mode the loop enters and leaves itself,
    with the default device set before the loop and changed mid-run: the losses, and the user's
    modes on the stack after each step (torchscope's left out: its own is on by design)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode) if mode else contextlib.nullcontext()
    losses, stacks = [], []
    torch.set_default_device("cpu")
    try:
        with watch:
            for i in range(10):
                if i == 6:
                    torch.set_default_device(None)
                x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
                opt.zero_grad()
                with torch.device("cpu") if ctx == "device" else _UserMode():
                    loss = nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                opt.step()
                losses.append(loss.item())
                stacks.append([m for m in _stack() if m != "Interposer"])
        stacks.append(_stack())  # after close
    finally:
        torch.set_default_device(None)
    return losses, stacks


@pytest.mark.parametrize("ctx", ["user", "device"])
@pytest.mark.parametrize("mode", ["default", "light", "full"])
def test_a_mode_the_loop_enters_is_left_as_the_loop_left_it(mode: str, ctx: str, tmp_path: Path) -> None:
    """``with torch.device(...)`` or a user's TorchFunctionMode around the forward and backward
    pops the top of the stack on exit: torchscope's mode, pushed on top inside the block, was
    popped in its place, and theirs stayed on for the rest of the process (with
    ``torch.device("cuda")``: every later tensor on the GPU); from then on no backward was seen."""
    plain, plain_stacks = _modes_loop(None, ctx, tmp_path / "plain.tscope")
    losses, stacks = _modes_loop(mode, ctx, tmp_path / "w.tscope")
    assert losses == plain and stacks == plain_stacks
    assert stacks == [["DeviceContext"]] * 6 + [[]] * 4 + [[]]
    steps = [e for e in iter_events(tmp_path / "w.tscope") if e["kind"] == "step"]
    assert [s["micro_batches"] for s in steps] == [1] * 10  # every backward seen
    assert [s["loss"] for s in steps] == pytest.approx(plain)


class _OpCounter(TorchDispatchMode):
    """A loop's own dispatch mode (what FlopCounterMode and memory trackers are): it counts
    the aten ops it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_dispatch_mode_of_the_loop_sees_only_the_loops_ops(
    mode: str, native: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capture's own reads (gradient statistics, NaN checks, the loss's alias, saved
    tensors unpacked) are not counted by the loop's dispatch mode: a FLOP counter reads the
    same watched as unwatched."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")

    def run(watched: bool) -> collections.Counter[str]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = torch.optim.Adam(model.parameters())
        counter = _OpCounter()
        with (torchscope.watch(model, opt, server=None, record=tmp_path / "c.tscope", mode=mode, sample_every=2)
              if watched else contextlib.nullcontext()):
            for _ in range(5):
                x = torch.randn(4, 8)
                with counter:
                    opt.zero_grad()
                    model(x).pow(2).mean().backward()
                    opt.step()
        return counter.seen

    plain = run(False)
    assert plain["aten.addmm"] == 10  # it counts
    assert run(True) == plain
    steps = [ev for ev in iter_events(tmp_path / "c.tscope") if ev["kind"] == "step"]
    assert len(steps) == 5 and steps[0]["graph_captured"] == (mode != "light")


@pytest.mark.parametrize("mode", ["default", "full"])
def test_user_forward_and_loss_errors_name_no_torchscope_line_but_one_that_says_so(tmp_path: Path, mode: str) -> None:
    """A shape error in the loss (the function mode is on between forward and step) or in the
    forward of a captured step (full mode's dispatch mode): each torchscope frame the traceback
    shows is a line that says it runs the user's call unchanged."""
    model, batch = make("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchscope.watch(model, opt, server=None, record=tmp_path / f"{mode}.tscope", mode=mode):
        x, y = batch(0)
        for _ in range(2):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        out = model(x)
        with pytest.raises(RuntimeError, match="target") as in_loss:
            nn.functional.cross_entropy(out, y[:, None].expand(-1, 3))
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as in_forward:
            model(x[:, :-1])
    root = os.path.dirname(torchscope.__file__) + os.sep
    for raised in (in_loss, in_forward):
        ours = [f for f in traceback.extract_tb(raised.value.__traceback__) if f.filename.startswith(root)]
        # the loss runs under the function mode (torch calls its frame); the forward only in full
        # mode, under its dispatch mode (default mode's uncaptured forward runs with none)
        assert ours or (raised is in_forward and mode == "default")
        assert all(f.line and f.line.endswith("# torchscope runs your call unchanged") for f in ours), ours
