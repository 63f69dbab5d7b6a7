"""torch's warnings name the user's line while a watch is open, as they do unwatched.

The capture's torch-function mode sits between the user's torch calls and torch: without
care, every warning a call raises (a Python one counted by ``stacklevel``, a C++ one named
after the innermost Python frame) would name ``torchscope/_interpose.py``."""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope


@contextlib.contextmanager
def _watched(watch: Any, action: Any) -> Iterator[tuple[nn.Module, torch.optim.Optimizer, list[warnings.WarningMessage]]]:
    """A model and its optimizer, watched by ``watch(model, opt)`` (None: unwatched), and the
    warnings raised inside, under ``warnings.simplefilter(action)``."""
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt) if watch else contextlib.nullcontext(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter(action)
        yield model, opt, seen


def _loop(kind: str, watch: Any) -> list[warnings.WarningMessage]:
    """Two steps of a loop whose line marked ``# warns`` raises ``kind``'s warning: every
    warning raised (``simplefilter("always")``)."""
    torch.manual_seed(0)
    with _watched(watch, "always") as (model, opt, seen):
        for _ in range(2):
            out = model(torch.randn(8, 4))
            target = torch.randn(8)
            loss = F.mse_loss(out.squeeze(1), target)
            if kind == "python":  # F.mse_loss warns with stacklevel=2
                F.mse_loss(out, target)  # warns
            if kind == "stacklevel3":  # F.softmax's implicit dim: stacklevel=3
                F.softmax(out)  # warns
            if kind == "cpp":  # TORCH_WARN in the binding: the innermost Python frame
                torch.tensor(out)  # warns
            if kind == "cpp_op":  # TORCH_WARN inside an aten op (resize of an out= tensor)
                torch.add(out.detach(), 1, out=torch.empty(3))  # warns
            if kind == "getter":  # a non-leaf's .grad
                _ = out.grad  # warns
            loss.backward()
            opt.step()
            opt.zero_grad()
    return [w for w in seen if w.category is UserWarning]


def _marked_lines() -> list[int]:
    lines, first = inspect.getsourcelines(_loop)
    return [first + i for i, line in enumerate(lines) if line.rstrip().endswith("# warns")]


@pytest.mark.parametrize("kind", ["python", "stacklevel3", "cpp", "cpp_op", "getter"])
@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_torch_warning_names_the_users_line(kind: str, mode: str, tmp_path: Path) -> None:
    def watch(model: nn.Module, opt: torch.optim.Optimizer) -> Any:
        return torchscope.watch(model, opt, server=None, record=tmp_path / "w.tscope", mode=mode)

    plain, watched = _loop(kind, None), _loop(kind, watch)
    assert len(plain) == 2
    assert [(w.filename, w.lineno, str(w.message)) for w in watched] == [
        (w.filename, w.lineno, str(w.message)) for w in plain
    ]
    # the line is the user's call, not torchscope's mode
    assert {(w.filename, w.lineno) for w in watched} <= {(__file__, n) for n in _marked_lines()}


def test_the_default_filter_shows_a_warning_once_per_line_of_the_users(tmp_path: Path) -> None:
    """Under the default action a warning shows once per line of the module it names: the
    user's module and line, so two steps show it once, and the same warning from two lines
    twice -- as unwatched."""

    def two_lines(watch: Any) -> list[tuple[str, int]]:
        with _watched(watch, "default") as (model, opt, seen):
            for _ in range(3):
                out = model(torch.ones(8, 4))
                a = F.mse_loss(out, torch.zeros(8))
                b = F.mse_loss(out, torch.zeros(8))  # the same message from a second line
                (a + b).backward()
                opt.step()
                opt.zero_grad()
        return [(w.filename, w.lineno) for w in seen if "target size" in str(w.message)]

    def watch(model: nn.Module, opt: torch.optim.Optimizer) -> Any:
        return torchscope.watch(model, opt, server=None, record=tmp_path / "d.tscope")

    plain = two_lines(None)
    assert len(plain) == 2 and len(set(plain)) == 2
    assert two_lines(watch) == plain


def test_a_users_filter_on_their_module_applies(tmp_path: Path) -> None:
    """A filter on the module a warning names (``module=``) matches the user's module."""
    def watch(model: nn.Module, opt: torch.optim.Optimizer) -> Any:
        return torchscope.watch(model, opt, server=None, record=tmp_path / "f.tscope")

    with _watched(watch, "always") as (model, opt, seen):
        warnings.filterwarnings("ignore", module=__name__)
        loss = F.mse_loss(model(torch.ones(8, 4)), torch.zeros(8))
        loss.backward()
        opt.step()
    assert [str(w.message) for w in seen if "target size" in str(w.message)] == []


def test_closing_the_last_watch_leaves_warnings_as_they_were(tmp_path: Path) -> None:
    before_filters, before_show = list(warnings.filters), warnings._showwarnmsg  # type: ignore[attr-defined]
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    a = torchscope.watch(model, opt, server=None, record=tmp_path / "a.tscope")
    b = torchscope.watch(nn.Linear(2, 2), None, server=None, record=tmp_path / "b.tscope")
    assert warnings._showwarnmsg is not before_show  # type: ignore[attr-defined]
    a.close()
    assert warnings._showwarnmsg is not before_show  # type: ignore[attr-defined]  # b still open
    b.close()
    assert warnings.filters == before_filters
    assert warnings._showwarnmsg is before_show  # type: ignore[attr-defined]


class _Drops(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout2d(self.fc(x).unsqueeze(-1)).squeeze(-1)  # warns: a 3-D input


def _evaluated(watch: Any) -> list[tuple[str, int, str]]:
    """A training step and an evaluation of a model whose forward warns: the evaluation runs
    under the capture's eval-mode dropout probe, a second function mode."""
    torch.manual_seed(0)
    model = _Drops()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt) if watch else contextlib.nullcontext(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            model(torch.randn(8, 4))
    return [(w.filename, w.lineno, str(w.message)) for w in seen if w.category is UserWarning]


def test_a_warning_inside_a_probed_evaluation_names_the_users_line(tmp_path: Path) -> None:
    plain = _evaluated(None)
    watched = _evaluated(lambda model, opt: torchscope.watch(model, opt, server=None, record=tmp_path / "w.tscope"))
    assert len(plain) == 2 and watched == plain
    line = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.strip().endswith("3-D input"))
    assert {(f, n) for f, n, _ in watched} == {(__file__, line)}


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_warning_raised_as_an_error_and_caught_keeps_nothing_alive(mode: str, tmp_path: Path) -> None:
    """Warnings as errors (``-W error``, pytest's ``filterwarnings = error``) and a loop that
    catches one: the warning re-raised under the user's line held, through its traceback, the
    capture's frame, whose locals held the warning -- a cycle keeping each step's loss and graph
    alive until the cyclic collector ran (and a false P7)."""
    import gc
    import weakref

    from torchscope.doctor import diagnose
    from torchscope.sessionfile import iter_events

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "errors.tscope"
    refs = []
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # as -W error sets it, before watch()
            w = torchscope.watch(model, opt, server=None, record=path, mode=mode)
            for _ in range(12):
                opt.zero_grad()
                loss = F.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 3, (16,)))
                try:
                    torch.tensor(loss)  # torch warns: copy-constructing from a tensor
                except UserWarning:
                    pass
                else:
                    raise AssertionError("torch did not warn")
                loss.backward()
                opt.step()
                refs.append(weakref.ref(loss))
                del loss
            alive = [i for i, r in enumerate(refs[:-1]) if r() is not None]
            w.close()
    finally:
        gc.enable()
    assert alive == []
    assert [f for f in diagnose(iter_events(path)) if f["code"] == "P7"] == []
