"""Gradients that are exactly zero at optimizer.step(): the loss went through a step function
(round, sign...: P9), or zero_grad(set_to_none=False) cleared them after backward (P5) --
told apart by whether the loop's gradients were None before its backward (real captures)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _run(tmp_path: Path, loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], misplaced: bool = False,
         set_to_none: bool = True, penalty: float = 0.0) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="default"):
        for _ in range(6):
            x, y = torch.randn(16, 6), torch.randint(0, 4, (16, 1)).float()
            if not misplaced:
                opt.zero_grad(set_to_none=set_to_none)
            (loss_of(model(x), y) + penalty * model[0].weight.pow(2).sum()).backward()
            if misplaced:
                opt.zero_grad(set_to_none=set_to_none)  # "clean up before stepping"
            opt.step()
    return [dict(f) for f in diagnose(iter_events(path))]


def test_a_rounded_prediction_is_p9_not_a_misplaced_zero_grad(tmp_path: Path) -> None:
    findings = _run(tmp_path, lambda out, y: nn.functional.l1_loss(out.round(), y))
    assert [f["code"] for f in findings if f["severity"] == "error"] == ["P9"], findings
    p9 = next(f for f in findings if f["code"] == "P9")
    assert "aten::round" in p9["message"] and "zero everywhere" in p9["message"]
    assert p9["src"] == f"{Path(__file__).name}:{test_a_rounded_prediction_is_p9_not_a_misplaced_zero_grad.__code__.co_firstlineno + 1}"


def test_an_integer_cast_in_the_loss_is_one_p9_naming_the_parameters_it_cuts_off(tmp_path: Path) -> None:
    """Predictions binned with ``.long()`` inside the loss beside a weight penalty (so backward
    runs): the cast is the one cause -- P9 names the parameters behind it, without a P1 for
    the same op nor a P6 for the forward whose graph the cast left unused."""
    def binned(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.l1_loss((out * 4).long().float() / 4, y)

    findings = _run(tmp_path, binned, penalty=1e-4)
    # what plain PyTorch says: only the penalised weight gets a gradient
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    (binned(model(torch.randn(16, 6)), torch.zeros(16, 1)) + 1e-4 * model[0].weight.pow(2).sum()).backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == ["0.bias", "2.weight", "2.bias"]
    assert [f["code"] for f in findings] == ["P9"], findings
    p9 = findings[0]
    assert "aten::_to_copy" in p9["message"] and p9["params"] == ["0.bias", "2.weight", "2.bias"], p9
    assert "0.bias, 2.weight, 2.bias get no gradient at all" in p9["message"]
    assert {t.get("param") for t in p9["targets"]} >= {"0.bias", "2.weight", "2.bias"}


class _STESign(torch.autograd.Function):
    """A binarised net's straight-through sign: its hand-written backward passes the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.sign(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * (x.abs() <= 1).to(grad.dtype)


@pytest.mark.parametrize("trick", ["function", "detach"])
def test_straight_through_estimators_are_no_p9(tmp_path: Path, trick: str) -> None:
    """A step function whose zero gradient the loop goes around on purpose: inside a custom
    autograd.Function's forward (grad mode off there), or the quantiser's
    ``z + (round(z) - z).detach()`` -- gradients flow, and the doctor says nothing."""
    ste: Callable[[torch.Tensor], torch.Tensor] = (
        _STESign.apply if trick == "function" else lambda z: z + (torch.round(z * 4) / 4 - z).detach())  # type: ignore[assignment]
    findings = _run(tmp_path, lambda out, y: nn.functional.l1_loss(ste(out), y))
    assert not [f for f in findings if f["severity"] in ("error", "warning")], findings
    grads = [e["grads"] for e in iter_events(tmp_path / "run.tscope") if e["kind"] == "step"]
    assert all(n > 0 for g in grads for n in g["norm"]), grads  # the gradient did get through


def test_gradients_zeroed_between_backward_and_step_are_p5(tmp_path: Path) -> None:
    for set_to_none in (True, False):  # cleared to None, or to zeros
        findings = _run(tmp_path, lambda out, y: nn.functional.mse_loss(out, y), misplaced=True, set_to_none=set_to_none)
        p5 = [f for f in findings if f["code"] == "P5"]
        assert len(p5) == 1 and "between backward() and step()" in p5[0]["message"], (set_to_none, findings)
        # at the zero_grad()'s own line, not optimizer.step()'s after it (QA 46a)
        line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1)
                    if t.rstrip().endswith('# "clean up before stepping"'))
        assert p5[0]["src"] == f"{Path(__file__).name}:{line}", (set_to_none, p5)


def test_a_correct_loop_with_zeroed_gradients_is_silent(tmp_path: Path) -> None:
    findings = _run(tmp_path, lambda out, y: nn.functional.mse_loss(out, y), set_to_none=False)
    assert not [f for f in findings if f["severity"] in ("error", "warning")], findings


def test_a_gan_watched_whole_clears_its_discriminator_each_step(tmp_path: Path) -> None:
    """A GAN module watched whole with its discriminator's optimizer: the generator's backward
    also fills D's gradients, then opt_d.zero_grad() clears D's (not G's) before D's backward.
    That is a reset, not two micro-batches summed (P15) or stale gradients (P5)."""
    torch.manual_seed(0)
    gen, disc = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2)), nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
    gan = nn.ModuleDict({"G": gen, "D": disc})
    opt_g, opt_d = torch.optim.Adam(gen.parameters(), 1e-3), torch.optim.Adam(disc.parameters(), 1e-3)
    bce = nn.functional.binary_cross_entropy_with_logits
    path = tmp_path / "gan.tscope"
    with torchscope.watch(gan, opt_d, server=None, record=path):
        for _ in range(8):
            fake = gen(torch.randn(16, 4))
            opt_d.zero_grad()
            bce(disc(torch.randn(16, 2) + 2), torch.ones(16, 1)).add(bce(disc(fake.detach()), torch.zeros(16, 1))).backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(disc(fake), torch.ones(16, 1)).backward()
            opt_g.step()
    events = list(iter_events(path))
    steps = [e for e in events if e["kind"] == "step"][1:-1]  # the last: the generator's backward, closed at the end
    assert steps and all(e["micro_batches"] == 2 and e["zero_grad"] == 1 and e["accumulated"] == 1 for e in steps), steps
    assert not [f for f in diagnose(events) if f["severity"] in ("error", "warning")]


def _dead_end(tmp_path: Path, mode: str, end: str) -> list[dict[str, Any]]:
    """A regression net whose last module passes no gradient: an output ReLU under negative
    targets (its bias pushed below zero), or a clamp that is always saturated."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    with torch.no_grad():
        model[2].bias.fill_(-5.0 if end == "relu" else 5.0)
    last = nn.ReLU() if end == "relu" else nn.Hardtanh(-1.0, 1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / f"{end}-{mode}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(12):
            x, y = torch.randn(64, 8), -1.0 - torch.rand(64, 1)
            opt.zero_grad()
            nn.functional.mse_loss(last(model(x)), y).backward()
            opt.step()
    return [dict(f) for f in diagnose(iter_events(path))]


@pytest.mark.parametrize("mode", ["light", "default"])
@pytest.mark.parametrize("end", ["relu", "clamp"])
def test_a_model_no_gradient_reaches_is_p2(tmp_path: Path, mode: str, end: str) -> None:
    """Every gradient exactly zero, the loss not zero, gradients None before each backward (so no
    zero_grad cleared them): nothing reaches the model (was: no finding outside full mode, whose
    activation gradients showed it; found by QA)."""
    findings = _dead_end(tmp_path, mode, end)
    (p2,) = [f for f in findings if f["code"] == "P2"]
    assert p2["severity"] == "warning" and p2["title"] == "No gradient reaches the model", p2
    assert "Every parameter's gradient is exactly zero although the loss is not" in p2["message"]
    assert p2["steps"] == list(range(12)) and len(p2["params"]) == 4
    assert not [f for f in findings if f["code"] in ("P5", "P9")], findings


def test_a_loss_of_zero_is_no_dead_model(tmp_path: Path) -> None:
    """Satisfied margins: the loss is exactly 0 and so is every gradient -- nothing to learn, no bug."""
    findings = _run(tmp_path, lambda out, y: torch.relu(-out - 100.0).mean())
    assert not [f for f in findings if f["severity"] in ("error", "warning")], findings


def test_a_rounded_prediction_is_not_also_a_dead_model(tmp_path: Path) -> None:
    findings = _run(tmp_path, lambda out, y: nn.functional.l1_loss(out.round(), y))
    assert [f["code"] for f in findings if f["severity"] != "info"] == ["P9"], findings
