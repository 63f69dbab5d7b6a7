"""P1 on a discrete choice without a straight-through estimator (QA 46a): a categorical
autoencoder's Gumbel ``one_hot(argmax)`` fed to the decoder leaves the encoder without a
gradient.  The finding names the argmax, and its fix is the estimator -- ``hard - y.detach() +
y`` or ``F.gumbel_softmax(..., hard=True)`` -- not P1's advice to leave out a ``.detach()``
the code never called.  With the estimator the loop is clean."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class _CatAE(nn.Module):
    def __init__(self, straight_through: bool) -> None:
        super().__init__()
        self.st = straight_through
        self.enc = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4 * 8))
        self.dec = nn.Sequential(nn.Linear(4 * 8, 32), nn.ReLU(), nn.Linear(32, 20))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.enc(x).view(-1, 4, 8)
        y = F.softmax(logits, -1)
        hard = F.one_hot(y.argmax(-1), 8).float()  # (the discrete choice)
        z = hard - y.detach() + y if self.st else hard
        return self.dec(z.view(-1, 4 * 8))


def _run(tmp_path: Path, mode: str, straight_through: bool) -> list[dict[str, object]]:
    torch.manual_seed(0)
    model = _CatAE(straight_through)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(6):
            x = (torch.rand(16, 20) < 0.3).float()
            loss = F.binary_cross_entropy_with_logits(model(x), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(f) for f in diagnose(list(iter_events(path)))]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_argmax_without_straight_through_is_p1_with_the_estimator_as_fix(tmp_path: Path, mode: str) -> None:
    found = _run(tmp_path, mode, straight_through=False)
    (p1,) = [f for f in found if f["code"] == "P1"]
    assert "enc.0.weight" in str(p1["message"]) and "aten::argmax" in str(p1["message"]), p1
    text = Path(__file__).read_text().splitlines()
    line = next(i for i, t in enumerate(text, 1) if t.rstrip().endswith("# (the discrete choice)"))
    assert p1["src"] == f"{Path(__file__).name}:{line}"
    assert "hard - y.detach() + y" in str(p1["fix"]) and "gumbel_softmax" in str(p1["fix"]), p1["fix"]


def test_with_the_estimator_it_is_clean(tmp_path: Path) -> None:
    found = _run(tmp_path, "default", straight_through=True)
    assert not [f for f in found if f["severity"] in ("warning", "error")], found


def test_light_mode_names_a_rounded_prediction_among_the_causes(tmp_path: Path) -> None:
    """Light mode has no graph to name ``round``: "No gradient reaches the model" listed only an
    output ReLU or clamp, and its fix to remove them would keep the rounding (QA 46a)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    path = tmp_path / "round.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(12):
            x, y = torch.randn(64, 16), torch.randint(1, 6, (64, 1)).float()
            opt.zero_grad()
            pred = torch.round(model(x) * 2 + 3).clamp(1, 5)
            F.mse_loss(pred, y).backward()
            opt.step()
    (f,) = [f for f in diagnose(list(iter_events(path))) if f["title"] == "No gradient reaches the model"]
    assert "round" in str(f["message"]) and "x + (x.round() - x).detach()" in str(f["fix"]), f
