"""A step's ``loss``: the micro-batches' losses together (with ``loss / accum_steps``, their
mean -- what a loop logs), not the last micro-batch's alone; a ``torch.autograd.grad`` pass
(an inner loop) is no micro-batch, and a closure that resets the gradients starts over."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))


def _steps(path: Path) -> list[dict[str, Any]]:
    return [e for e in iter_events(path) if e["kind"] == "step"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_the_loss_of_an_accumulated_step_is_its_micro_batches_together(tmp_path: Path, mode: str) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "accum.tscope"
    logged: list[float] = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            opt.zero_grad()
            total = 0.0
            for _ in range(4):
                loss = model(torch.randn(5, 6)).pow(2).mean() / 4
                loss.backward()
                total += loss.item()
            opt.step()
            logged.append(total)
    steps = _steps(path)
    assert [len(st["losses"]) for st in steps] == [4, 4, 4]
    assert [st["loss"] for st in steps] == pytest.approx(logged, rel=1e-6)
    assert all(st["loss"] != st["losses"][-1] for st in steps)  # not the last micro-batch's


def test_an_inner_autograd_grad_pass_is_no_micro_batch(tmp_path: Path) -> None:
    """First-order MAML: torch.autograd.grad on the support loss (a pass of the step: its
    gradients are of the watched parameters), then backward() on the query loss at the
    adapted weights: the step's loss is the query loss."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / "maml.tscope"
    outer: list[float] = []
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(3):
            opt.zero_grad()
            params = dict(model.named_parameters())
            support = torch.func.functional_call(model, params, torch.randn(5, 6)).pow(2).mean()
            grads = torch.autograd.grad(support, list(params.values()))
            fast = {k: v - 0.1 * g for (k, v), g in zip(params.items(), grads, strict=True)}
            query = torch.func.functional_call(model, fast, torch.randn(5, 6)).pow(2).mean()
            query.backward()
            opt.step()
            outer.append(query.item())
    steps = _steps(path)
    assert [st["loss"] for st in steps] == pytest.approx(outer, rel=1e-6)
    assert all(len(st["losses"]) == 2 for st in steps)  # both were seen


def test_an_autograd_grad_pass_after_the_backward_leaves_the_loss(tmp_path: Path) -> None:
    """A loop that measures another loss's gradient after backward() (a torch.autograd.grad
    pass of the watched parameters): the step's loss is still the backward's."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "probe.tscope"
    logged: list[float] = []
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(3):
            opt.zero_grad()
            loss = model(torch.randn(5, 6)).pow(2).mean()
            loss.backward()
            probe = model(torch.randn(5, 6)).abs().mean()
            torch.autograd.grad(probe, list(model.parameters()))  # how another loss would pull
            opt.step()
            logged.append(loss.item())
    steps = _steps(path)
    assert [len(st["losses"]) for st in steps] == [2, 2, 2]  # both were seen
    assert [st["loss"] for st in steps] == pytest.approx(logged, rel=1e-6)


def test_a_closure_that_resets_the_gradients_starts_over(tmp_path: Path) -> None:
    """LBFGS calls its closure several times a step, each zeroing the gradients first: the
    step's loss is the first evaluation's, which ``opt.step(closure)`` returns (the loop logs
    it), not all of them added up, nor the last."""
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    path = tmp_path / "lbfgs.tscope"
    x = torch.randn(16, 6)
    last: list[float] = []

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        last.append(loss.item())
        return loss

    returned = []
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(2):
            last.clear()
            returned.append(opt.step(closure).item())
    steps = _steps(path)
    assert len(steps) == 2 and len(steps[-1]["losses"]) == len(last) > 1
    assert last[0] != last[-1]  # the evaluations differ: the test tells them apart
    assert [st["loss"] for st in steps] == pytest.approx(returned, rel=1e-6)
    assert steps[-1]["loss"] == pytest.approx(last[0], rel=1e-6)


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_the_last_micro_batch_in_the_closure_is_read_with_the_others(tmp_path: Path, mode: str) -> None:
    """Lightning's accumulate_grad_batches=4: three micro-batches backward before
    optimizer.step(closure), the fourth (and the clipping) inside the closure.  The step's loss,
    gradient statistics and clip are those of all four -- they were read at step()'s start,
    without the closure's micro-batch and clip, so a NaN in it went unseen."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "closure_accum.tscope"
    seen: list[tuple[float, list[float], float]] = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            opt.zero_grad()
            total = 0.0
            for _ in range(3):
                loss = model(torch.randn(5, 6)).pow(2).mean() / 4
                loss.backward()
                total += loss.item()

            def closure() -> torch.Tensor:
                nonlocal total
                loss = model(torch.randn(5, 6)).pow(2).mean() / 4
                loss.backward()
                total += loss.item()
                before = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05))
                seen.append((total, [float(p.grad.norm()) for p in model.parameters()], before))
                return loss

            opt.step(closure)
    steps = _steps(path)
    assert [len(st["losses"]) for st in steps] == [4, 4, 4]
    assert [st["loss"] for st in steps] == pytest.approx([t for t, _, _ in seen], rel=1e-6)
    for st, (_, norms, before) in zip(steps, seen, strict=True):
        assert st["grads"]["norm"] == pytest.approx(norms, rel=1e-5)  # clipped, as optimizer.step() used them
        assert st["grads"]["clip"]["norm"] == pytest.approx(before, rel=1e-5)


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("how", ["autograd.backward", "Tensor.backward"])
def test_roots_given_a_gradient_count_weighted(tmp_path: Path, mode: str, how: str) -> None:
    """``autograd.backward([l1, l2], [1, 0.01])`` differentiates l1 + 0.01·l2, and
    ``loss.backward(gradient=w)`` w·loss: the step's loss is that weighted sum, each root as
    weighted (was: l1 + l2; found by QA)."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = []
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(4):
            opt.zero_grad()
            out = model(torch.randn(8, 6))
            l1, l2 = out.pow(2).mean(), out.abs().sum()
            if how == "autograd.backward":
                torch.autograd.backward([l1, l2], [torch.tensor(1.0), torch.tensor(0.01)])
                expected.append(((l1 + 0.01 * l2).item(), [l1.item(), 0.01 * l2.item()]))
            else:
                l2.backward(gradient=torch.tensor(0.5))
                expected.append((0.5 * l2.item(), [0.5 * l2.item()]))
            opt.step()
    steps = _steps(path)
    assert [s["loss"] for s in steps] == pytest.approx([e[0] for e in expected], rel=1e-6)
    assert [s["losses"] for s in steps] == [pytest.approx(e[1], rel=1e-6) for e in expected]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_backward_that_raised_adds_no_loss(tmp_path: Path, mode: str) -> None:
    """A second backward through a freed graph raises (P10) and the loop carries on: it put
    nothing into the gradients, so its loss is not in the step's (it was counted twice)."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "raised.tscope"
    logged: list[float] = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            opt.zero_grad()
            loss = model(torch.randn(5, 6)).pow(2).mean()
            loss.backward()
            with contextlib.suppress(RuntimeError):
                loss.backward()  # "Trying to backward through the graph a second time"
            opt.step()
            logged.append(loss.item())
    steps = _steps(path)
    assert [st["accumulated"] for st in steps] == [1, 1, 1]
    assert all(len(st["backward_errors"]) == 1 for st in steps)
    assert [st["loss"] for st in steps] == pytest.approx(logged, rel=1e-6)
