"""P5 from real captures (QA round 28): parameters no optimizer holds keep their gradient through
optimizer.zero_grad(), so it piles up from step to step -- that is not a missing zero_grad().
weight_norm applied after the optimizer was built is the usual cause: its
``parametrizations.weight.original0/1`` are new tensors, the optimizer still steps the old weight,
and the layer's weight never trains.  The doctor says so instead of "zero_grad() is missing"."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations

import torchscope
from torchscope.doctor import diagnose
from torchscope.schema import Finding
from torchscope.sessionfile import iter_events

WN_PARAMS = ["0.parametrizations.weight.original0", "0.parametrizations.weight.original1"]


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))


def _train(model: nn.Module, opt: torch.optim.Optimizer, path: Path, mode: str, zero_grad: bool = True,
           steps: int = 8) -> list[Finding]:
    g = torch.Generator().manual_seed(1)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(steps):
            x = torch.randn(32, 8, generator=g)
            y = torch.sin(x.sum(1, keepdim=True))
            if zero_grad:
                opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
    return diagnose(iter_events(path))


def _missing(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f["code"] == "P5" and "zero_grad() is missing" in f["message"]]


def _unheld(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f["code"] == "P5" and f["title"] == "Parameters no optimizer updates"]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_weight_norm_applied_after_the_optimizer_is_untrained_parameters_not_a_missing_zero_grad(
        tmp_path: Path, mode: str) -> None:
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)  # the optimizer first...
    parametrizations.weight_norm(model[0])  # ...then new parameters it does not hold
    parametrizations.spectral_norm(model[2])  # (its `original` is the old weight: the optimizer holds it)
    before = model[0].parametrizations.weight.original1.detach().clone()
    found = _train(model, opt, tmp_path / f"wn-{mode}.tscope", mode)
    assert torch.equal(model[0].parametrizations.weight.original1, before)  # the bug: it never trained
    assert not _missing(found), [f["message"] for f in found]
    (f,) = _unheld(found)
    assert f["severity"] == "error" and f["params"] == WN_PARAMS, f
    assert "get gradients but no optimizer updates them" in f["message"], f["message"]
    assert "piles up" in f["message"] and "weight_norm" in f["message"], f["message"]
    assert "weight_norm / spectral_norm" in f["fix"] and "add these parameters" in f["fix"], f["fix"]
    assert [t["param"] for t in f["targets"]] == WN_PARAMS
    assert [x["code"] for x in found] == ["P5"], [x["message"] for x in found]


def test_weight_norm_applied_before_the_optimizer_is_fine(tmp_path: Path) -> None:
    model = _mlp()
    parametrizations.weight_norm(model[0])
    parametrizations.spectral_norm(model[2])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = model[0].parametrizations.weight.original1.detach().clone()
    found = _train(model, opt, tmp_path / "wn-ok.tscope", "default")
    assert not torch.equal(model[0].parametrizations.weight.original1, before)
    assert found == [], [f["message"] for f in found]


def test_a_loop_without_zero_grad_is_still_a_missing_zero_grad(tmp_path: Path) -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    found = _train(model, opt, tmp_path / "nozero.tscope", "default", zero_grad=False)
    (f,) = _missing(found)
    assert f["severity"] == "error" and len(f["params"]) == 6, f
    assert not _unheld(found)


def test_both_bugs_at_once_are_told_apart(tmp_path: Path) -> None:
    """No zero_grad() at all, and weight_norm after the optimizer: the missing zero_grad names the
    parameters the optimizer steps, the untrained ones are their own finding."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    parametrizations.weight_norm(model[0])
    found = _train(model, opt, tmp_path / "both.tscope", "default", zero_grad=False)
    (missing,) = _missing(found)
    assert not set(missing["params"]) & set(WN_PARAMS) and "4.weight" in missing["params"], missing["params"]
    (unheld,) = _unheld(found)
    assert unheld["params"] == WN_PARAMS and unheld["severity"] == "error"


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_layer_replaced_after_the_optimizer_is_an_error(tmp_path: Path, mode: str) -> None:
    """A head assigned anew after the optimizer was built: the optimizer still steps the old
    head's parameters, which are no longer the model's and get no gradient -- that proves the
    mistake (a backbone merely left trainable beside a head-only optimizer has no such tensors)."""
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model[4] = nn.Linear(32, 1)
    before = model[4].weight.detach().clone()
    found = _train(model, opt, tmp_path / "head.tscope", mode)
    assert torch.equal(model[4].weight, before)  # the bug: the new head never trained
    assert not _missing(found), [f["message"] for f in found]
    (f,) = _unheld(found)
    assert f["severity"] == "error" and f["params"] == ["4.weight", "4.bias"], f
    assert "steps 2 tensor(s) that are not the model's parameters" in f["message"], f["message"]
    assert "a layer assigned anew after the optimizer was built" in f["message"], f["message"]
    assert "add these parameters" in f["fix"], f["fix"]


def test_a_trainable_backbone_beside_a_head_only_optimizer_is_a_warning(tmp_path: Path) -> None:
    """An optimizer of the head only, the backbone left requiring grad: wasteful, maybe meant
    (a linear probe written loosely) -- a warning, with both fixes."""
    model = _mlp()
    opt = torch.optim.Adam(model[4].parameters(), lr=1e-2)
    found = _train(model, opt, tmp_path / "probe.tscope", "default")
    assert not _missing(found), [f["message"] for f in found]
    (f,) = _unheld(found)
    assert f["severity"] == "warning" and f["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"], f
    assert "not the model's parameters" not in f["message"], f["message"]
    assert "requires_grad_(False)" in f["fix"] and "add_param_group" in f["fix"], f["fix"]


@pytest.mark.parametrize("mode", ["light", "default"])
@pytest.mark.parametrize("clear", ["model", "optimizer"])
def test_gradients_of_tensors_outside_the_model_piling_up_are_p5(tmp_path: Path, mode: str, clear: str) -> None:
    """Kendall's uncertainty weighting: ``log_vars`` outside the model, in the optimizer, and the
    loop's ``model.zero_grad()``, which clears the model's gradients only -- log_vars' pile up
    (was: no finding; found by QA).  ``optimizer.zero_grad()`` clears both: no finding."""
    model = _mlp()
    log_vars = nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([*model.parameters(), log_vars], lr=1e-2)
    g = torch.Generator().manual_seed(1)
    path = tmp_path / f"{clear}-{mode}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(8):
            x = torch.randn(32, 8, generator=g)
            out = model(x)
            losses = torch.stack([(out - x.sum(1, keepdim=True)).pow(2).mean(), out.abs().mean()])
            loss = (torch.exp(-log_vars) * losses + log_vars).sum()
            if clear == "model":
                model.zero_grad()
            else:
                opt.zero_grad()
            loss.backward()  # the step's backward
            opt.step()
    found = [f for f in diagnose(iter_events(path)) if f["code"] == "P5"]
    if clear == "optimizer":
        assert found == [], [f["message"] for f in found]
        return
    (f,) = found
    assert f["severity"] == "error" and f["title"] == "Gradients outside the model never cleared", f
    # step 1's backward is the first to add onto an earlier step's gradient
    assert "not those of 1 tensor(s)" in f["message"] and "(2,)" in f["message"] and f["steps"] == list(range(1, 8)), f
    assert "optimizer.zero_grad()" in f["fix"]
    lines = Path(__file__).read_text().splitlines()
    assert f["src"] == f"{Path(__file__).name}:{next(n for n, t in enumerate(lines, 1) if '# the step' in t and 'backward' in t)}"
