"""Three mistakes beyond the seeds' fifteen, on real watched loops: a loss given probabilities
instead of logits (P16), ``module.requires_grad = False`` that froze nothing (P17), and float16
training with no GradScaler (P14) -- each against its correct twin, which must stay silent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.session import load
from torchscope.sessionfile import iter_events


def _train(path: Path, model: nn.Module, loss_of: Callable[[nn.Module, torch.Tensor], torch.Tensor], *,
           mode: str = "default", steps: int = 3, params: Any = None,
           autocast: torch.dtype | None = None, scaler: bool = False) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    opt = torch.optim.SGD(params if params is not None else model.parameters(), lr=0.05)
    amp = torch.amp.GradScaler("cpu") if scaler else None
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(steps):
            x = torch.randn(8, 6)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                loss = loss_of(model, x)
            if amp is not None:
                amp.scale(loss).backward()
                amp.step(opt)
                amp.update()
            else:
                loss.backward()
                opt.step()
    return [dict(f) for f in diagnose(iter_events(path))]


def _codes(found: list[dict[str, Any]], code: str) -> list[dict[str, Any]]:
    return [f for f in found if f["code"] == code]


def _classes(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return torch.arange(x.shape[0]) % 3


# ---------------------------------------------------------------- P16: probabilities into the loss
@pytest.mark.parametrize("mode", ["default", "full"])
def test_softmax_into_cross_entropy_is_found_at_the_softmax(tmp_path: Path, mode: str) -> None:
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3), nn.Softmax(dim=-1))
    found = _train(tmp_path / "ce.tscope", model,
                   lambda m, x: nn.functional.cross_entropy(m(x), _classes(m, x)), mode=mode)
    (f,) = _codes(found, "P16")
    assert f["modules"] == ["3"] and f["severity"] == "warning" and "cross_entropy" in f["message"]
    graph = load(tmp_path / "ce.tscope").graph(0)
    by_id = {op["id"]: op for op in graph["ops"]}
    names = [by_id[t["op"]]["name"] for t in f["targets"]]
    assert names == ["aten::_softmax", "aten::_log_softmax"], names  # the Softmax, then the loss's own
    assert f["steps"] == ([0, 1, 2] if mode == "full" else [0])  # the captured steps


@pytest.mark.parametrize("loss_name", ["nll", "bce_with_logits"])
def test_probabilities_into_nll_or_bce_with_logits_are_found(tmp_path: Path, loss_name: str) -> None:
    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if loss_name == "nll":
            return nn.functional.nll_loss(m(x), _classes(m, x))
        return nn.functional.binary_cross_entropy_with_logits(m(x).view(-1), (_classes(m, x) > 0).float())

    last = nn.Softmax(dim=1) if loss_name == "nll" else nn.Sigmoid()
    model = nn.Sequential(nn.Linear(6, 3 if loss_name == "nll" else 1), last)
    (f,) = _codes(_train(tmp_path / "p.tscope", model, loss), "P16")
    assert f["modules"] == ["1"]
    assert ("nll_loss" if loss_name == "nll" else "binary_cross_entropy_with_logits") in f["message"]
    assert ("sigmoid" if loss_name != "nll" else "log-probabilities") in f["message"] + f["fix"]


def test_logits_soft_targets_and_log_softmax_are_no_finding(tmp_path: Path) -> None:
    """The correct twins: logits into cross_entropy (with label smoothing), a teacher's softmax
    as soft targets, a KL divergence on log_softmax, NLLLoss on log_softmax, BCE on a sigmoid
    (BCELoss wants probabilities) -- and softmax inside the model for attention."""
    teacher = nn.Linear(6, 3)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            attn = torch.softmax(self.q(x) @ x.T, dim=-1)  # attention weights: a softmax, used as one
            return self.head(attn @ x)

    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        out = m(x)
        with torch.no_grad():
            soft = torch.softmax(teacher(x) / 2.0, dim=-1)
        y = _classes(m, x)
        return (nn.functional.cross_entropy(out, soft) + nn.functional.cross_entropy(out, y, label_smoothing=0.1)
                + nn.functional.kl_div(torch.log_softmax(out, -1), soft, reduction="batchmean")
                + nn.functional.nll_loss(torch.log_softmax(out, -1), y)
                + nn.functional.binary_cross_entropy(torch.sigmoid(out[:, 0]), (y > 0).float()))

    for mode in ("default", "full"):
        found = _train(tmp_path / f"ok-{mode}.tscope", Net(), loss, mode=mode)
        assert [(f["code"], f["message"]) for f in found if f["severity"] != "info"] == []


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("log_softmax", [False, True], ids=["raw_scores", "log_softmax"])
def test_raw_scores_into_nll_are_found(tmp_path: Path, mode: str, log_softmax: bool) -> None:
    """NLLLoss on a Linear layer's raw scores (log_softmax forgotten): the loss falls below zero,
    which log-probabilities never give, and the graph shows the layer feeding it (QA 48a: no
    finding).  Its correct twin, on log_softmax, is silent."""
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))

    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        out = m(x)
        return nn.functional.nll_loss(torch.log_softmax(out, -1) if log_softmax else out, _classes(m, x))

    path = tmp_path / "nll.tscope"
    found = _codes(_train(path, model, loss, mode=mode, steps=30), "P16")
    losses = [st["loss"] for st in load(path).steps]
    if log_softmax:
        assert found == [] and min(losses) > 0
        return
    assert min(losses) < 0  # the premise: raw scores drive the loss below zero
    (f,) = found
    assert f["title"] == "NLLLoss not given log-probabilities" and "below zero" in f["message"], f["message"]
    if mode != "light":
        assert "raw output of module '2' (Linear)" in f["message"] and f["modules"] == ["2"], f["message"]


@pytest.mark.parametrize("how", ["shifted", "scaled", "logsumexp"])
def test_raw_scores_shifted_by_a_number_into_nll_are_found(tmp_path: Path, how: str) -> None:
    """``nll_loss(out - 10.0, y)`` keeps the loss above zero, and ``out / 2`` is a layer's scores
    still: the graph's walk back from the loss passes arithmetic with a number (QA 48c: the first
    went untold).  ``out - out.logsumexp(-1, keepdim=True)`` is log_softmax written by hand."""
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))

    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        out = m(x)
        made = {"shifted": lambda: out - 10.0, "scaled": lambda: out / 2.0,
                "logsumexp": lambda: out - out.logsumexp(-1, keepdim=True)}[how]()
        return nn.functional.nll_loss(made, _classes(m, x))

    found = _codes(_train(tmp_path / "nll.tscope", model, loss, mode="default", steps=4), "P16")
    if how == "logsumexp":
        assert found == []
    else:
        (f,) = found
        assert "raw output of module '2' (Linear)" in f["message"], f["message"]


# ---------------------------------------------------------------- P17: module.requires_grad = False
def test_requires_grad_attribute_on_a_module_is_found_and_the_method_is_not(tmp_path: Path) -> None:
    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8)), nn.Linear(8, 3))

    wrong = model()
    wrong[0].requires_grad = False
    wrong[0][0].requires_grad = False  # inside the first: told once, at the outermost
    before = wrong[0][0].weight.detach().clone()
    found = _train(tmp_path / "attr.tscope", wrong, lambda m, x: nn.functional.cross_entropy(m(x), _classes(m, x)))
    assert not torch.equal(before, wrong[0][0].weight)  # plain PyTorch: it trained
    (f,) = _codes(found, "P17")
    assert f["modules"] == ["0"] and f["steps"] == [0, 1, 2]
    assert set(f["params"]) == {"0.0.weight", "0.0.bias", "0.2.weight", "0.2.bias"}
    assert "model[0].requires_grad = False" in f["message"] and "requires_grad_(False)" in f["fix"]

    right = model()
    right[0].requires_grad_(False)
    found = _train(tmp_path / "method.tscope", right, lambda m, x: nn.functional.cross_entropy(m(x), _classes(m, x)),
                   params=[p for p in right.parameters() if p.requires_grad])
    assert _codes(found, "P17") == []
    # the attribute with its parameters frozen by hand as well: nothing trains them
    both = model()
    both[0].requires_grad = False
    for p in both[0].parameters():
        p.requires_grad = False
    found = _train(tmp_path / "both.tscope", both, lambda m, x: nn.functional.cross_entropy(m(x), _classes(m, x)))
    assert _codes(found, "P17") == []
    assert load(tmp_path / "both.tscope").meta["modules"][1]["requires_grad_attr"] is False


def test_requires_grad_attribute_set_after_watch_is_found(tmp_path: Path) -> None:
    """``torchscope.watch(model)`` at the top of the script, the "freezing" line after it: the
    session event has no attribute yet; the capture reads it again (every 10 steps) and says so."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8)), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / "late.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        model[0].requires_grad = False
        for _ in range(3):
            x = torch.randn(8, 6)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), _classes(model, x)).backward()
            opt.step()
    assert all("requires_grad_attr" not in m for m in load(path).meta["modules"])
    (f,) = _codes([dict(f) for f in diagnose(iter_events(path))], "P17")
    assert f["modules"] == ["0"] and f["steps"] == [0, 1, 2], f
    assert "model[0].requires_grad = False" in f["message"]


def test_layers_frozen_by_attribute_in_a_loop_are_one_finding(tmp_path: Path) -> None:
    """``for layer in list(model.children())[:4]: layer.requires_grad = False`` (two convolutions
    and their ReLUs): one line of code, one finding naming both layers (QA 51b: two warnings)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(128, 10))
    for layer in list(model.children())[:4]:
        layer.requires_grad = False
    opt = torch.optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), lr=1e-3)
    path = tmp_path / "loop.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(3):
            opt.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(4, 1, 8, 8)), torch.randint(0, 10, (4,))).backward()
            opt.step()
    (f,) = _codes([dict(f) for f in diagnose(iter_events(path))], "P17")
    assert f["modules"] == ["0", "2"] and set(f["params"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}, f
    assert f["message"].startswith("model[0].requires_grad = False and model[2].requires_grad = False set plain "
                                   "attributes on these 2 Conv2d modules"), f["message"]


# ---------------------------------------------------------------- P14: float16 without a GradScaler
def _mse(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(m(x).float(), x[:, :2].float())


@pytest.mark.parametrize("how", ["autocast", "half"])
def test_float16_without_a_grad_scaler_is_found(tmp_path: Path, how: str) -> None:
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    if how == "half":
        model = model.half()
        found = _train(tmp_path / "h.tscope", model, lambda m, x: _mse(m, x.half()))
    else:
        found = _train(tmp_path / "a.tscope", model, _mse, autocast=torch.float16)
        assert [e.get("autocast_dtype") for e in load(tmp_path / "a.tscope").steps] == ["float16"] * 3
    (f,) = _codes(found, "P14")
    assert f["title"] == "float16 training without a GradScaler" and f["steps"] == [0, 1, 2]
    assert ("float16 (0.weight" in f["message"]) == (how == "half"), f["message"]


@pytest.mark.parametrize("how", ["bfloat16", "scaler"])
def test_bfloat16_or_a_grad_scaler_is_no_finding(tmp_path: Path, how: str) -> None:
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    found = _train(tmp_path / "ok.tscope", model, _mse, autocast=torch.bfloat16 if how == "bfloat16" else torch.float16,
                   scaler=how == "scaler")
    assert [f["message"] for f in found if f["severity"] != "info"] == []
    assert load(tmp_path / "ok.tscope").steps[0]["autocast_dtype"] == ("bfloat16" if how == "bfloat16" else "float16")
