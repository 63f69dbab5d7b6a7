"""P3's "gradients shrink through depth" judged by what the optimizer does with them (QA 44d):
a deep stack whose input-end gradients are 1e4x smaller still learns at the same relative
rate under Adam, which scales each parameter's step by its own gradient's size (while they
stay above its eps) -- the
Annotated Transformer's post-LN encoder read "barely learn" while its weights moved 1.1e-2 a
step against the output layer's 1.7e-2.  Under SGD the same stack is the warning it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _p3(tmp_path: Path, optimizer: str, depth: int, mode: str = "default") -> list[dict[str, Any]]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(32, 32), nn.Sigmoid()]
    model = nn.Sequential(*layers, nn.Linear(32, 4))
    opt = (torch.optim.Adam(model.parameters(), lr=1e-3) if optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(64, 32), torch.randint(0, 4, (64,))
    path = tmp_path / f"{optimizer}-{depth}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(21):  # (default mode reads the update ratio on steps 0, 10 and 20)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return [dict(f) for f in diagnose(list(iter_events(path))) if f["code"] == "P3"]


@pytest.mark.parametrize(("optimizer", "depth", "learns"), [("adam", 6, True), ("sgd", 6, False), ("adam", 12, False)])
def test_shrinking_gradients_are_told_by_what_the_updates_do(tmp_path: Path, optimizer: str, depth: int,
                                                              learns: bool) -> None:
    """Six sigmoid layers under Adam: the input layer's gradients are 5e5x smaller, its weights
    move as fast (0.0077 a step against 0.0098).  Under SGD they do not; nor under Adam at
    twelve layers, where gradients of ~3e-11 fall under Adam's eps and its steps shrink too
    (update ÷ weight 1e-6): the warning stands there, read from what the updates did."""
    (p3,) = _p3(tmp_path, optimizer, depth)
    assert p3["params"] == ["0.weight", f"{2 * depth}.weight"], p3
    if learns:
        assert p3["severity"] == "info" and "but the updates do not: update ÷ weight" in p3["message"], p3
        assert "barely learn" not in p3["message"] and p3["fix"].startswith("Nothing to fix"), p3
    else:
        assert p3["severity"] == "warning" and "barely learn" in p3["message"], p3


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_light_mode_under_adam_says_it_cannot_tell(tmp_path: Path, optimizer: str) -> None:
    """``light`` reads no update ratios: under Adam the shrinking gradients are told, not warned
    about as layers that barely learn (QA 44e); under SGD the warning stands."""
    (p3,) = _p3(tmp_path, optimizer, 6, mode="light")
    if optimizer == "adam":
        assert p3["severity"] == "info" and "read no update ÷ weight ratios" in p3["message"], p3
        assert "barely learn" not in p3["message"], p3
    else:
        assert p3["severity"] == "warning" and "barely learn" in p3["message"], p3
