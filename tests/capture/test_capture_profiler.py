"""A profiler the user runs around a watched loop (``torch.profiler.profile``) sees the user's
ops as it would without torchscope, and the capture's own under ``torchscope::<part>`` labels:
QA 49c found ~20 aten kinds of ours (the gradient statistics' norms, NaN checks, ``item``)
counted as the user's, with nothing to tell them apart."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import torchscope
from torchscope import _native


def _profiled_loop(mode: str | None, path: Path) -> tuple[collections.Counter[str], int, float]:
    """(aten ops under no torchscope label by name, events under one, the last loss)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)) for _ in range(12)]
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode) if mode else None
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for x, y in data:
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                opt.step()
    finally:
        if watch is not None:
            watch.close()

    def ours(e: Any) -> bool:
        while e is not None:
            if e.name.startswith("torchscope::"):
                return True
            e = e.cpu_parent
        return False

    events = list(prof.events())
    theirs = collections.Counter(e.name for e in events if e.name.startswith("aten::") and not ours(e))
    return theirs, sum(1 for e in events if ours(e)), loss.item()


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_the_users_profile_counts_their_ops_alone(tmp_path: Path, mode: str) -> None:
    if mode != "light":  # as CI runs: the C++ recorder's NaN checks label themselves too
        assert _native.get(block=True) is not None, _native._error
    plain, _, plain_loss = _profiled_loop(None, tmp_path / "plain.tscope")
    watched, labelled, loss = _profiled_loop(mode, tmp_path / f"{mode}.tscope")
    assert loss == plain_loss
    assert labelled > 0  # the capture did work under the profiler, and said so
    assert watched == plain


class _Ranges(TorchDispatchMode):
    """A user's op-counting dispatch mode: the profiler ranges it sees."""

    seen = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if "record_function" in str(func):
            _Ranges.seen += 1
        return func(*args, **(kwargs or {}))


class _RangeCalls(TorchFunctionMode):
    """... and a user's function mode."""

    seen = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if "record_function" in str(func):
            _RangeCalls.seen += 1
        return func(*args, **(kwargs or {}))


def _ranges_seen(mode: str | None, path: Path) -> tuple[int, int]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _Ranges.seen = _RangeCalls.seen = 0
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode) if mode else None
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]), _Ranges(), _RangeCalls():
            for _ in range(6):
                opt.zero_grad()
                F.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
                opt.step()
    finally:
        if watch is not None:
            watch.close()
    return _Ranges.seen, _RangeCalls.seen


@pytest.mark.parametrize("mode", ["light", "default"])
def test_the_users_own_modes_do_not_see_our_labels(tmp_path: Path, mode: str) -> None:
    """Entering and leaving a ``record_function`` range is a dispatched op: a user's op-counting
    mode saw ours (QA 50c: the optimizer's own 12 ranges of six steps became 72 and 84)."""
    assert _ranges_seen(mode, tmp_path / "run.tscope") == _ranges_seen(None, tmp_path / "plain.tscope")


def test_a_label_that_cannot_be_made_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing of ours raises into the loop: a ``record_function`` range that fails to open (a
    profiler torch cannot label in some state) leaves the capture's work unlabelled, no more."""
    from torchscope import _profiled

    class Refused:
        def __enter__(self) -> None:
            raise RuntimeError("no ranges here")

        def __exit__(self, *exc: object) -> None:
            raise AssertionError("a range never opened is not closed")

    def refused(label: Any, name: str) -> None:
        label._range, label._open = Refused(), False

    plain = _profiled_loop(None, tmp_path / "plain.tscope")
    monkeypatch.setattr(_profiled._Label, "__init__", refused)
    theirs, _, loss = _profiled_loop("default", tmp_path / "run.tscope")
    assert loss == plain[2] and theirs  # the loop ran on, profiled (only the C++ NaN checks labelled)
