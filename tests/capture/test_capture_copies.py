"""A watched model can be copied and saved like any other, and a watch leaves nothing behind.

``copy.deepcopy(model)`` (EMA weights, best-model snapshots) and ``torch.save(model)`` raised
TypeError in the user's loop while watched (the hooks dragged the watch along); closing a
watch after a forward without backward left the op recorder on the dispatch stack.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events

MODES = ["light", "default", "full"]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 4))


def _ema_run(mode: str | None, path: Path, steps: int = 6) -> list[float]:
    """A loop with an EMA copy made by deepcopy after the first step and evaluated every step."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    w = torchscope.watch(model, opt, server=None, record=path, mode=mode) if mode else None
    g = torch.Generator().manual_seed(1)
    out, ema = [], None
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        if ema is None:
            ema = copy.deepcopy(model)
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), model.parameters(), strict=True):
                pe.mul_(0.9).add_(p, alpha=0.1)
            out += [loss.item(), ema(x).sum().item()]
    if w is not None:
        w.close()
    return out + [float(p.detach().sum()) for p in model.parameters()]


@pytest.mark.parametrize("mode", MODES)
def test_ema_copy_of_a_watched_model(mode: str, tmp_path: Path) -> None:
    path = tmp_path / "ema.tscope"
    assert _ema_run(mode, path) == _ema_run(None, tmp_path / "plain.tscope")
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    # the copy's forwards are not the watched model's: one forward a step
    assert len(steps) == 6 and all(len(s["forwards"]) == 1 for s in steps)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["deepcopy", "copy"])
def test_copies_made_mid_step_are_not_watched(mode: str, how: str, tmp_path: Path) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    path = tmp_path / "mid.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(2):
            opt.zero_grad()
            loss = model(x).sum()  # on captured steps every submodule carries a hook now
            clone = copy.deepcopy(model) if how == "deepcopy" else copy.copy(model)
            with torch.no_grad():
                clone(x)
            loss.backward()
            opt.step()
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    # a shallow copy shares the hook dicts: its forward is told apart from the model's
    assert len(steps) == 2 and all(len(s["forwards"]) == 1 for s in steps)
    if mode != "light" and how == "deepcopy":
        # the deep copy's modules are not the watched model's (a shallow copy's are the same
        # module objects, rightly recorded as theirs)
        g = next(e for e in iter_events(path) if e["kind"] == "graph")
        fwd = [o for o in g["ops"] if o["phase"] == "forward"]
        assert sum(o["name"] == "aten::addmm" and o["module"] == "0" for o in fwd) == 1
        assert sum(o["name"] == "aten::addmm" for o in fwd) == 4  # the copy's, outside the model


def _hook_dicts(model: nn.Module) -> dict[str, list[dict[int, object]]]:
    return {n: [dict(getattr(m, n)) for m in model.modules()] for n in (
        "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
        "_forward_hooks_with_kwargs", "_forward_hooks_always_called")}  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
def test_a_copy_made_while_watched_has_no_hook_of_ours(mode: str, tmp_path: Path) -> None:
    """``AveragedModel(model)`` (an EMA), made while watched, deep-copies the model: the copy
    kept an inert stand-in for each of torchscope's hooks for good, on which
    ``torch.jit.script`` and ``torch.compile(fullgraph=True)`` of the EMA model failed."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    model = _model()
    mark = model[0].register_forward_hook(lambda m, i, o: None)  # the user's: copied with it
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torchscope.watch(model, opt, server=None, record=tmp_path / "e.tscope", mode=mode):
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            mid = copy.deepcopy(model)  # mid-step: a captured step's module hooks are on
            opt.step()
            ema.update_parameters(model)
        assert _hook_dicts(model)["_forward_pre_hooks"][0]  # the watched model's are on
    mark.remove()
    for clone in (ema.module, mid):
        hooks = _hook_dicts(clone)
        users = hooks["_forward_hooks"][1]
        assert len(users) == 1  # the user's hook on its Linear ...
        users.clear()
        clone[0]._forward_hooks.clear()  # ... which TorchScript could not compile either
        assert all(d == {} for ds in hooks.values() for d in ds)
    torch.jit.script(ema.module)
    x = torch.randn(2, 8)
    ema.module.eval()  # no dropout: the two calls below compare equal
    assert torch.equal(torch.compile(ema.module, fullgraph=True, backend="eager")(x), ema.module(x))


@pytest.mark.parametrize("mode", MODES)
def test_model_saved_while_watched_loads_without_torchscope(mode: str, tmp_path: Path) -> None:
    model = _model().eval()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 8)
    with torchscope.watch(model, opt, server=None, record=tmp_path / "s.tscope", mode=mode):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        model(x)  # mid-step: a captured step's module hooks are on
        torch.save(model, tmp_path / "model.pt")
        expected = model(x)
    torch.save(x, tmp_path / "x.pt")
    # a fresh interpreter in which torchscope cannot be imported
    code = (
        "import sys, torch; sys.modules['torchscope'] = None; "
        f"m = torch.load({str(tmp_path / 'model.pt')!r}, weights_only=False); "
        f"x = torch.load({str(tmp_path / 'x.pt')!r}); "
        "print(repr(m(x).sum().item()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert float(out.stdout.strip()) == expected.sum().item()


@pytest.mark.parametrize("mode", MODES)
def test_close_after_a_forward_leaves_no_mode_or_hook(mode: str, tmp_path: Path) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dispatch, function = torch._C._len_torch_dispatch_stack(), torch._C._len_torch_function_stack()
    with torchscope.watch(model, opt, server=None, record=tmp_path / "c.tscope", mode=mode):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        model.eval()
        model(torch.randn(4, 8))  # a trailing evaluation: a forward without backward
    assert torch._C._len_torch_dispatch_stack() == dispatch
    assert torch._C._len_torch_function_stack() == function
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks


def test_torchscript_of_a_watched_model_says_what_to_do(tmp_path: Path) -> None:
    """TorchScript compiles a module's hooks (ours cannot be): the error says to close the
    watch first, and after close the model scripts and runs as before."""
    model = _model().eval()
    w = torchscope.watch(model, server=None, record=tmp_path / "j.tscope")
    x = torch.randn(2, 8)
    with pytest.raises(AttributeError, match="close the watch"):
        torch.jit.script(model)
    w.close()
    assert torch.equal(torch.jit.script(model)(x), model(x))


@pytest.mark.parametrize("mode", MODES)
def test_two_watches_closed_in_opening_order_leave_no_mode(mode: str, tmp_path: Path) -> None:
    """A GAN: generator and discriminator watched, closed in the order they were opened; and a
    user's function mode entered above ours, still open at close."""
    from torch.overrides import TorchFunctionMode

    class UserMode(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            UserMode.calls += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    gen, disc = nn.Linear(4, 8), nn.Linear(8, 1)
    og, od = torch.optim.SGD(gen.parameters(), lr=0.1), torch.optim.SGD(disc.parameters(), lr=0.1)
    function = torch._C._len_torch_function_stack()
    wg = torchscope.watch(gen, og, server=None, record=tmp_path / "g.tscope", mode=mode)
    wd = torchscope.watch(disc, od, server=None, record=tmp_path / "d.tscope", mode=mode)
    for _ in range(3):
        fake = gen(torch.randn(8, 4))
        od.zero_grad()
        disc(fake.detach()).mean().backward()
        od.step()
        og.zero_grad()
        (-disc(fake).mean()).backward()
        og.step()
    user = UserMode()
    user.__enter__()
    gen(torch.randn(2, 4))
    wg.close()
    wd.close()
    # ours are gone, the user's mode is still on top and leaves as it came
    assert torch._C._len_torch_function_stack() == function + 1
    assert torch._C._get_function_stack_at(function) is user
    one = torch.ones(1)
    before = UserMode.calls
    torch.add(one, 1)
    assert UserMode.calls == before + 1
    user.__exit__(None, None, None)
    assert torch._C._len_torch_function_stack() == function


@pytest.mark.parametrize("mode", MODES)
def test_jit_trace_of_a_watched_model(mode: str, tmp_path: Path) -> None:
    """torch.jit.trace runs the forward twice and compares the graphs: a forward under trace is
    not a step's (in full mode the recording made the two traced graphs differ)."""
    model = _model().eval()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "t.tscope"
    x = torch.randn(2, 8)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(2):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            traced = torch.jit.trace(model, x)
        assert torch.equal(traced(x), model(x))
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    # (the trace check's own eager run of the model is a forward that ran: it is counted)
    assert len(steps) == 2 and all(s["micro_batches"] == 1 for s in steps)
    assert all(sum(bool(f.get("backward")) for f in s["forwards"]) == 1 for s in steps)
