"""P11 and adversarial training (QA 45a): the attack's forwards run in eval mode with autograd
on, and ``torch.autograd.grad`` of the loss for the input -- no training.  They read as
"Training while the model is in eval mode"; the capture now marks a forward whose graph only
such a pass went through (``ForwardInfo.input_grad``).  A loop that never puts the model back
in train mode is still told."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _pgd(tmp_path: Path, mode: str, restore: bool) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / f"pgd-{mode}-{restore}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(5):
            x, y = torch.randn(16, 10), torch.randint(0, 2, (16,))
            model.eval()  # the attack, as Madry et al.'s PGD: three steps of the input's gradient sign
            adv = x.clone()
            for _ in range(3):
                adv.requires_grad_(True)
                (grad,) = torch.autograd.grad(F.cross_entropy(model(adv), y), adv)
                adv = (adv + 0.05 * grad.sign()).detach()
            if restore:
                model.train()
            loss = F.cross_entropy(model(adv), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    events = list(iter_events(path))
    attacks = [f for e in events if e["kind"] == "step" for f in e["forwards"] if f.get("input_grad")]
    assert len(attacks) == 15, attacks  # every attack forward, and no training one
    return [dict(f) for f in diagnose(events) if f["code"] == "P11" and f["severity"] != "info"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_an_attack_in_eval_mode_is_no_training_in_eval_mode(tmp_path: Path, mode: str) -> None:
    assert _pgd(tmp_path, mode, restore=True) == []


def test_training_left_in_eval_mode_after_the_attack_is_told(tmp_path: Path) -> None:
    (p11,) = _pgd(tmp_path, "default", restore=False)
    assert p11["message"].startswith("Training while the model is in eval mode"), p11
    assert "`model.train` alone does nothing" in p11["fix"]  # (QA 51b: a call left without its parentheses)


@pytest.mark.parametrize("every", [1, 5])
def test_a_consistency_target_of_every_step_is_told_an_evaluation_warned(tmp_path: Path, every: int) -> None:
    """UDA's (the Π-model's) target: the clean batch's prediction under ``no_grad``, the model left
    in train mode on purpose, every step -- said as such (QA 45a: "Evaluating with '1'
    (BatchNorm1d) in train mode", a warning).  The same forward every fifth step is an
    evaluation that forgot model.eval(): the warning."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / f"uda-{every}.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for i in range(10):
            xl, yl, xu = torch.randn(16, 10), torch.randint(0, 3, (16,)), torch.randn(32, 10)
            loss = F.cross_entropy(model(xl), yl)
            if i % every == 0:
                with torch.no_grad():
                    target = F.softmax(model(xu), dim=1)
                if every == 1:
                    loss = loss + F.kl_div(F.log_softmax(model(xu + 0.1 * torch.randn_like(xu)), 1), target,
                                           reduction="batchmean")
            opt.zero_grad()
            loss.backward()
            opt.step()
    (p11,) = [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P11"]
    if every == 1:
        assert p11["severity"] == "info" and p11["title"] == "Train mode in a no_grad forward of every step", p11
        assert p11["steps"] == list(range(10)) and p11["modules"] == ["1"], p11
    else:
        assert p11["severity"] == "warning" and p11["message"].startswith("Evaluating with '1' (BatchNorm1d)"), p11


@pytest.mark.parametrize("frozen", [True, False])
def test_a_dropout_of_a_frozen_feature_network_in_eval_is_meant(tmp_path: Path, frozen: bool) -> None:
    """An LPIPS-style perceptual loss: a feature network frozen and put in eval, its Dropout with
    it -- no parameters of its own, so "all its parameters frozen" never cleared it (QA 45a).  A
    trained block's Dropout left in eval is still told."""

    class Perceptual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 8)
            self.feat = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
            self.feat.requires_grad_(not frozen)
            self.feat.eval()

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.mse_loss(self.feat(self.net(x)), self.feat(y))

    torch.manual_seed(0)
    model = Perceptual()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    path = tmp_path / f"lpips-{frozen}.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(5):
            loss = model(torch.randn(16, 8), torch.randn(16, 8))
            opt.zero_grad()
            loss.backward()
            opt.step()
    found = [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P11" and f["severity"] != "info"]
    assert [f["modules"] for f in found] == ([] if frozen else [["feat.1"]]), found
