"""P9 for a loss term made from ``F.one_hot(logits.argmax(1))`` (QA 44b): a Dice loss on the
hard predictions adds a term that trains nothing.  ``one_hot`` is recorded as ``zeros`` and a
``scatter_`` of ones at the argmax's positions; ``scatter`` picks values, so the constant was
lost there and the run read "no problems found".  A one-hot made from positions and applied to
data by a layer (a Switch-style router's ``einsum`` dispatch) routes: no finding, nor for the
Dice loss on softmax probabilities, nor for the one-hot as a whole target tensor (hard
pseudo-labels the probabilities are pulled towards: no gradient through them by design)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _dice(logits: torch.Tensor, target: torch.Tensor, hard: bool | str | None) -> torch.Tensor:
    if hard is None:  # sharpening towards the model's own hard predictions
        return F.mse_loss(logits.softmax(1), F.one_hot(logits.argmax(1), 3).permute(0, 3, 1, 2).float())
    if hard == "pseudo":  # a global soft Dice of the probabilities against those (QA 44e: P9)
        probs, tgt = logits.softmax(1), F.one_hot(logits.argmax(1), 3).permute(0, 3, 1, 2).float()
        return 1 - (2 * (probs * tgt).sum() + 1) / (probs.sum() + tgt.sum() + 1)
    probs = F.one_hot(logits.argmax(1), 3).permute(0, 3, 1, 2).float() if hard else logits.softmax(1)  # probs
    onehot = F.one_hot(target, 3).permute(0, 3, 1, 2).float()
    inter = (probs * onehot).sum((2, 3))
    return 1 - ((2 * inter + 1e-6) / (probs.sum((2, 3)) + onehot.sum((2, 3)) + 1e-6)).mean()


def _segment(path: Path, mode: str, hard: bool | str | None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(4):
            img = torch.randn(2, 3, 8, 8)
            target = (img[:, 0] > 0).long() + (img[:, 1] > 0.5).long()
            opt.zero_grad()
            logits = model(img)
            (F.cross_entropy(logits, target) + _dice(logits, target, hard)).backward()
            opt.step()


class Switch(nn.Module):
    """Top-1 routing as in the Switch Transformer: the argmax's one-hot dispatches tokens to
    experts by an einsum, and the router's softmax gate weighs their outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(8, 4)
        self.experts = nn.Parameter(torch.randn(4, 8, 8) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gates = self.router(x).softmax(-1)
        dispatch = F.one_hot(gates.argmax(-1), 4).to(x.dtype)  # tokens x experts
        routed = torch.einsum("te,td->etd", dispatch, x)
        out = torch.einsum("etd,edh->th", routed, self.experts)
        return out * (gates * dispatch).sum(-1, keepdim=True)


def _route(path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = Switch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(4):
            x = torch.randn(16, 8)
            opt.zero_grad()
            F.mse_loss(model(x), x).backward()
            opt.step()


def _findings(path: Path) -> list[dict[str, object]]:
    return [dict(f) for f in diagnose(list(iter_events(path))) if f["severity"] in ("warning", "error")]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_dice_loss_on_the_argmax_one_hot_is_p9(tmp_path: Path, mode: str) -> None:
    path = tmp_path / f"hard-{mode}.tscope"
    _segment(path, mode, hard=True)
    (p9,) = _findings(path)
    assert p9["code"] == "P9" and str(p9["message"]).startswith("aten::argmax is not differentiable"), p9
    line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if t.endswith("# probs"))
    assert p9["src"] == f"{Path(__file__).name}:{line}", p9


@pytest.mark.parametrize("hard", [False, None, "pseudo"], ids=["softmax-dice", "one-hot-target", "soft-dice-to-one-hot"])
def test_a_dice_loss_on_softmax_probabilities_is_no_finding(tmp_path: Path, hard: bool | str | None) -> None:
    """(the one-hot's count in a Dice denominator meets the probabilities' sum as one element,
    inside the loss: a target's, not a constant term of the loss)"""
    path = tmp_path / "soft.tscope"
    _segment(path, "default", hard=hard)
    assert _findings(path) == []


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_one_hot_dispatch_to_experts_is_routing(tmp_path: Path, mode: str) -> None:
    path = tmp_path / f"switch-{mode}.tscope"
    _route(path, mode)
    assert [f for f in _findings(path) if f["code"] == "P9"] == []


def test_a_one_element_hard_target_is_no_constant_term(tmp_path: Path) -> None:
    """Online self-training with a batch of one: BCE towards the model's own hard prediction,
    a one-element target (QA 44e: P9 at batch size 1, none at 8)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "b1.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="default"):
        for _ in range(3):
            logits = model(torch.randn(1, 4))
            target = F.one_hot(logits.argmax(1), 2).float()[:, 1]
            opt.zero_grad()
            F.binary_cross_entropy(logits.softmax(1)[:, 1], target).backward()
            opt.step()
    assert [f for f in _findings(path) if f["code"] == "P9"] == []

