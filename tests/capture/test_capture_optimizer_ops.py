"""Full mode records ``optimizer.step()``'s own ops (OpRecord.phase "optimizer"; forty-second
session): a step's memory does not end at the backward -- Adam makes its state on its first
step, and every update has temporaries (a foreach Adam's ``_foreach_sqrt`` of every parameter
at once).  Checked against the ops a plain ``TorchDispatchMode`` sees over the same
``opt.step()`` and against the bytes of the state the optimizer then holds."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import alive_after_each_op
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import torchscope
from torchscope.doctor import diagnose
from torchscope.session import load
from torchscope.sessionfile import iter_events


class _Names(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(func._schema.name)
        return func(*args, **(kwargs or {}))


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)) for _ in range(2)]


def _plain(foreach: bool) -> tuple[list[str], list[torch.Tensor]]:
    """What a dispatch mode sees of the first opt.step() of a plain run, and its parameters after."""
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=foreach)
    names: list[str] = []
    for i, (x, y) in enumerate(_batches()):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        if i == 0:
            with _Names() as mode:
                opt.step()
            names = [n for n in mode.names if not n.startswith("profiler::")]
        else:
            opt.step()
    return names, [p.detach().clone() for p in model.parameters()]


def _watched(tmp_path: Path, mode: str, foreach: bool, opt_cls: Any = torch.optim.Adam) -> tuple[Any, nn.Module, Any]:
    torch.manual_seed(0)
    model = _model()
    opt = opt_cls(model.parameters(), lr=1e-2, foreach=foreach)
    path = tmp_path / "opt.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for x, y in _batches():
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()  # (the update)
    return load(str(path)), model, opt


def _subsequence(short: list[str], long: list[str]) -> bool:
    it = iter(long)
    return all(any(n == m for m in it) for n in short)


def _nbytes(ts: Any) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in ts}.values())


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "for-loop"])
@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_full_mode_records_optimizer_step_as_pytorch_runs_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool, foreach: bool) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    names, plain_params = _plain(foreach)
    run, model, opt = _watched(tmp_path, "full", foreach)
    for p, q in zip(model.parameters(), plain_params, strict=True):
        assert torch.equal(p, q)  # recording the update changed nothing
    ev = dict(run.graph(0))
    ops = sorted(ev["ops"], key=lambda o: o["id"])
    update = [o for o in ops if o["phase"] == "optimizer"]
    assert update and all(o["id"] > max(b["id"] for b in ops if b["phase"] == "backward") for o in update)
    got = [o["name"] for o in update]
    # every op the dispatch mode saw, in order (the C++ recorder also sees ops some of them run)
    assert _subsequence(names, got), (names, got)
    if not native:
        assert got == names
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.strip() == "opt.step()  # (the update)")
    assert {o["src"] for o in update} == {f"{Path(__file__).name}:{line}"}
    assert all(not o["module"] for o in update)
    # the state Adam made on its first step (exp_avg, exp_avg_sq, step per parameter) is
    # allocated by those ops, and the step's peak holds parameters, gradients, state and the
    # update's temporaries (at least the largest parameter's) at once
    state = _nbytes(t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor))
    params = _nbytes(model.parameters())
    assert sum(o["alloc"] for o in update) >= state
    mem = run.steps[0]["memory"]
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    assert mem["peak"] >= 2 * params + state + largest, (mem, params, state)
    assert mem["peak"] == max(o["live"] for o in ops) and mem["temporaries"] >= largest
    # the doctor's rules read the step's graph without them: a clean loop stays clean
    found = [dict(f) for f in diagnose(list(iter_events(tmp_path / "opt.tscope")))]
    assert not [f for f in found if f["severity"] in ("warning", "error")], found


def test_default_mode_and_step_closures_record_no_optimizer_ops(tmp_path: Path) -> None:
    run, _, _ = _watched(tmp_path, "default", True)
    assert not [o for o in run.graph(0)["ops"] if o["phase"] == "optimizer"]
    # LBFGS runs its closure's forward and backward inside step(): those stay forward and
    # backward ops, and the rest of its step() is not recorded
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2)
    x, y = _batches()[0]

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    path = tmp_path / "lbfgs.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        opt.step(closure)
    ops = load(str(path)).graph(0)["ops"]
    assert {o["phase"] for o in ops} == {"forward", "backward"}
    assert any(o["name"] == "aten::addmm" and o["module"] == "0" for o in ops)


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_the_gradients_backward_made_stay_alive_in_the_ledger(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """AccumulateGrad stores a ``detach()`` of the backward's result as ``.grad``: a dispatch
    mode sees it as an op right after the one that made the result, which the Python recorder
    leaves out (it is not the user's); watched by the result alone, the gradients read as freed
    when the backward ended (13.1 KiB live where 23.1 KiB were), at the update's first op."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    run, model, _ = _watched(tmp_path, "full", True)
    ev = dict(run.graph(0))
    lives = dict(alive_after_each_op(ev))
    first = min(o["id"] for o in ev["ops"] if o["phase"] == "optimizer")
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    # alive as the update begins: at least the gradients (the step had none before)
    assert sum(lives[first].values()) >= grads, (sum(lives[first].values()), grads)


class _Flaky(torch.optim.SGD):
    """An update that raises once, after its first op (a NaN check of the loop's own, say)."""

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        super().step(closure)
        if not getattr(self, "raised", False):
            self.raised = True
            raise RuntimeError("update refused")


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_a_step_that_raised_leaves_the_next_forward_a_forward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """optimizer.step() raised inside it and the loop caught it and went on: its post-hook never
    came to leave the update's phase.  The next forward ends that step (a forward after a
    backward whose update began), and its ops are a new step's forward ops."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    torch.manual_seed(0)
    model = _model()
    opt = _Flaky(model.parameters(), lr=0.1)
    path = tmp_path / "flaky.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for x, y in _batches() * 2:
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            with contextlib.suppress(RuntimeError):
                opt.step()
    run = load(str(path))
    for s in run.graph_steps:
        ops = run.graph(s)["ops"]
        assert not [o for o in ops if o["phase"] == "optimizer" and o.get("module")], s  # no module's op is the update's
        assert any(o["phase"] == "forward" and o["name"] == "aten::addmm" for o in ops), s


def _clipped(clip: str, path: Path | None, mode: str = "full") -> tuple[list[str], list[torch.Tensor]]:
    """Two steps of a loop that clips its gradients; what a dispatch mode sees of the first
    clipping (unwatched runs), and the parameters after."""
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    names: list[str] = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode) if path else contextlib.nullcontext():
        for i, (x, y) in enumerate(_batches()):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            with _Names() if path is None and i == 0 else contextlib.nullcontext() as seen:
                if clip == "norm":
                    nn.utils.clip_grad_norm_(model.parameters(), 0.05)  # (the clipping)
                else:
                    nn.utils.clip_grad_value_(model.parameters(), 0.01)  # (the clipping)
            if seen is not None:
                names = [n for n in seen.names if not n.startswith("profiler::")]
            opt.step()
    return names, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("clip", ["norm", "value"])
@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_full_mode_records_gradient_clipping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool, clip: str) -> None:
    """``clip_grad_norm_``'s ops -- the per-gradient norms, their total, the coefficient, the
    in-place scaling -- are the step's too, recorded with the update at the clipping's line
    (QA 45b: none was), and none of torchscope's own reads between them and the step."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    names, plain = _clipped(clip, None)
    path = tmp_path / "clip.tscope"
    _, params = _clipped(clip, path)
    assert all(torch.equal(p, q) for p, q in zip(params, plain, strict=True))
    run = load(str(path))
    for step in (0, 1):
        ops = sorted(run.graph(step)["ops"], key=lambda o: o["id"])
        text = Path(__file__).read_text().splitlines()
        at = {f"{Path(__file__).name}:{i}" for i, t in enumerate(text, 1) if t.strip().endswith("# (the clipping)")}
        clipping = [o for o in ops if o["src"] in at]
        got = [o["name"] for o in clipping]
        assert got and _subsequence(names, got), (names, got)
        if not native:
            assert got == names
        assert {o["phase"] for o in clipping} == {"optimizer"} and all(not o["module"] for o in clipping)
        backward = max(o["id"] for o in ops if o["phase"] == "backward")
        update = [o for o in ops if o["phase"] == "optimizer" and o["src"] not in at]
        assert update and backward < min(o["id"] for o in clipping) and max(o["id"] for o in clipping) < min(o["id"] for o in update)


def test_recording_a_clipping_stops_when_it_returns(tmp_path: Path) -> None:
    """A hand-written update after the clipping (no optimizer): the clipping's ops are
    recorded, and the loop's own after it -- the update, ``float(n)``, the next batch's slice
    -- are not taken for the clipping's (QA 46e: all recorded at the clip's line)."""
    torch.manual_seed(0)
    model = _model()
    x_all, y_all = torch.randn(64, 32), torch.randn(64, 8)
    path = tmp_path / "manual.tscope"
    with torchscope.watch(model, None, server=None, record=path, mode="full"):
        for step in range(3):
            i = step * 16
            model.zero_grad()
            F.mse_loss(model(x_all[i:i + 16]), y_all[i:i + 16]).backward()
            n = nn.utils.clip_grad_norm_(model.parameters(), 0.05)  # (the clipping, by hand)
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
            float(n)
    run = load(str(path))
    line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1)
                if t.rstrip().endswith("# (the clipping, by hand)"))
    ops = run.graph(1)["ops"]
    update = [o for o in ops if o["phase"] == "optimizer"]
    assert update and {o["src"] for o in update} == {f"{Path(__file__).name}:{line}"}
    assert not [o for o in update if o["name"] in ("aten::sub_", "aten::_local_scalar_dense", "aten::slice")], update
