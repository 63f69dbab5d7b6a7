"""P7 on real captures: a copy of the weights (an EMA, a target network) updated from the
parameters outside ``torch.no_grad()`` carries a graph back to the model that every update
extends; the same updates under ``no_grad`` and a penalty built in a fresh tensor each step
and added to the loss are no finding.  Training is unchanged by the watch in every case."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

UPDATES = {
    "mul_ add_": "pe.mul_(0.99).add_(pm, alpha=0.01)",
    "lerp_": "pe.lerp_(pm, 0.01)",
    "copy_": "pe.copy_(0.99 * pe + 0.01 * pm)",
    "+=": "pe += 0.01 * pm",
    "_foreach_lerp_": "torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.01)",
}


def _steps(path: Path | None, mode: str, no_grad: bool, start: Callable[[nn.Module], Any],
           update: Callable[[nn.Module, Any], Any]) -> tuple[nn.Module, Any]:
    """30 Adam steps of an MLP; after each, ``update(model, copy)`` (under no_grad or not) gives
    the copy of the weights ``start(model)`` began: the model and the final copy."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    kept = start(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode) if path else None
    for _ in range(30):
        x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        with torch.no_grad() if no_grad else torch.enable_grad():
            kept = update(model, kept)
    if watch is not None:
        watch.close()
    return model, kept


def _train(path: Path | None, how: str, no_grad: bool, mode: str = "default") -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """An EMA model updated in place after each step; the model's and the copy's final tensors."""

    def update(model: nn.Module, ema: nn.Module) -> nn.Module:
        if how == "_foreach_lerp_":
            torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.01)
        for pe, pm in zip(ema.parameters(), model.parameters(), strict=True):
            if how == "mul_ add_":
                pe.mul_(0.99).add_(pm, alpha=0.01)
            elif how == "lerp_":
                pe.lerp_(pm, 0.01)
            elif how == "copy_":
                pe.copy_(0.99 * pe + 0.01 * pm)
            elif how == "+=":
                pe += 0.01 * pm
        return ema

    model, ema = _steps(path, mode, no_grad, lambda m: copy.deepcopy(m).requires_grad_(False), update)
    return [p.detach().clone() for p in model.parameters()], [p.detach().clone() for p in ema.parameters()]


def _p7(path: Path) -> list[dict[str, Any]]:
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P7"]


@pytest.mark.parametrize("how", list(UPDATES))
def test_an_ema_updated_with_autograd_on_is_p7_at_its_line(tmp_path: Path, how: str) -> None:
    path = tmp_path / "ema.tscope"
    watched = _train(path, how, no_grad=False)
    plain = _train(None, how, no_grad=False)
    assert all(torch.equal(a, b) for a, b in zip(watched[0] + watched[1], plain[0] + plain[1], strict=True))
    found = _p7(path)
    assert len(found) == 1, found
    f = found[0]
    assert f["severity"] == "error" and f["title"] == "Copy of the weights updated with autograd on"
    assert "outside torch.no_grad()" in f["message"] and "'0.weight'" in f["message"]
    assert f["params"] and f["params"][0] == "0.weight"
    lines = Path(__file__).read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if text.strip() == UPDATES[how])
    assert f["src"] == f"test_doctor_weight_copies.py:{line}"
    assert "torch.no_grad()" in f["fix"]
    # the copy carries its graph from the first step it was seen on to the run's end (it was
    # said "at step 2" alone: QA), and a _foreach_ update names all the parameters it took
    steps = [e["step"] for e in iter_events(path) if e["kind"] == "step"]
    assert f["steps"] == list(range(f["steps"][0], steps[-1] + 1)) and len(f["steps"]) > 1, f["steps"]
    assert ("and the others that call updates at once" in f["message"]) == how.startswith("_foreach")


@pytest.mark.parametrize("mode", ["light", "full"])
def test_the_other_modes_see_it_too(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "ema.tscope"
    _train(path, "lerp_", no_grad=False, mode=mode)
    assert [f["title"] for f in _p7(path)] == ["Copy of the weights updated with autograd on"]




def test_a_penalty_built_from_the_weights_each_step_is_no_finding(tmp_path: Path) -> None:
    """A fresh tensor of a weight's shape filled from it in place every step and summed into the
    loss: it gains a graph from the parameter, and the backward uses it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "penalty.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(30):
            x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
            opt.zero_grad()
            penalty = torch.zeros(4, 64)
            penalty += model[2].weight.abs()
            reg = torch.zeros(())
            for p in model.parameters():
                reg += p.norm()
            (nn.functional.cross_entropy(model(x), y) + 1e-4 * (penalty.sum() + reg)).backward()
            opt.step()
    assert _p7(path) == []


OUT_OF_PLACE = {
    "* +": "shadow[i] = 0.99 * shadow[i] + 0.01 * pm",
    "lerp": "shadow[i] = torch.lerp(shadow[i], pm, 0.01)",
    "_foreach_lerp": "shadow = list(torch._foreach_lerp(shadow, list(model.parameters()), 0.01))",
}


def _train_shadow(path: Path | None, how: str, no_grad: bool) -> list[torch.Tensor]:
    """A shadow copy of the weights rebuilt out of place after each step (the EMA of a
    hand-written loop); the model's final parameters, then the shadow's."""

    def update(model: nn.Module, shadow: list[torch.Tensor]) -> list[torch.Tensor]:
        if how == "_foreach_lerp":
            shadow = list(torch._foreach_lerp(shadow, list(model.parameters()), 0.01))
        for i, pm in enumerate(model.parameters()):
            if how == "* +":
                shadow[i] = 0.99 * shadow[i] + 0.01 * pm
            elif how == "lerp":
                shadow[i] = torch.lerp(shadow[i], pm, 0.01)
        return shadow

    model, shadow = _steps(path, "default", no_grad, lambda m: [p.detach().clone() for p in m.parameters()], update)
    # what plain PyTorch says: with autograd on, the shadow's graph reaches back to the weights
    assert all((s.grad_fn is None) == no_grad for s in shadow)
    return [p.detach().clone() for p in [*model.parameters(), *shadow]]


@pytest.mark.parametrize("how", list(OUT_OF_PLACE))
def test_an_ema_rebuilt_out_of_place_with_autograd_on_is_p7_at_its_line(tmp_path: Path, how: str) -> None:
    path = tmp_path / "shadow.tscope"
    watched = _train_shadow(path, how, no_grad=False)
    plain = _train_shadow(None, how, no_grad=False)
    assert all(torch.equal(a, b) for a, b in zip(watched, plain, strict=True))
    found = _p7(path)
    assert [f["title"] for f in found] == ["Copy of the weights updated with autograd on"], found
    lines = Path(__file__).read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if text.strip() == OUT_OF_PLACE[how])
    assert found[0]["src"] == f"test_doctor_weight_copies.py:{line}"
    assert found[0]["params"][0] == "0.weight"


@pytest.mark.parametrize(("train", "how"), [(_train, h) for h in UPDATES] + [(_train_shadow, h) for h in OUT_OF_PLACE])
def test_the_same_updates_under_no_grad_are_no_finding(tmp_path: Path, train: Any, how: str) -> None:
    path = tmp_path / "ema.tscope"
    train(path, how, no_grad=True)
    assert _p7(path) == []


def test_a_weight_change_taken_fresh_each_step_is_no_finding(tmp_path: Path) -> None:
    """``p - prev`` after every step, with autograd on, for a log of how far the weights moved:
    a tensor of a weight's shape leading back to it, made anew each step and never taken into
    the next one."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    prev = [p.detach().clone() for p in model.parameters()]
    moved = []
    path = tmp_path / "moved.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(30):
            x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            deltas = [pm - pp for pm, pp in zip(model.parameters(), prev, strict=True)]
            moved.append(sum(d.norm().item() for d in deltas))
            prev = [p.detach().clone() for p in model.parameters()]
    assert moved[-1] > 0
    assert _p7(path) == []
