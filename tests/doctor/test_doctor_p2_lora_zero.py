"""LoRA adapters with both factors initialised to zero: each one's gradient is the other's value,
zero, so nothing ever trains.  P2 found it, but blamed "a round(), an output ReLU or clamp between
the model's output and the loss" (QA 50a).  The parameters themselves are all zeros: that is said,
with LoRA's own initialisation as the fix; the usual initialisation (A random, B zero) is clean."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, both_zero: bool, r: int = 4) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.A = nn.Parameter(torch.zeros(r, base.in_features))
        self.B = nn.Parameter(torch.zeros(base.out_features, r))
        if not both_zero:
            nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.A.t() @ self.B.t() * 2.0


def _p2(path: Path, both_zero: bool) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(LoRALinear(nn.Linear(16, 32), both_zero), nn.ReLU(), LoRALinear(nn.Linear(32, 4), both_zero))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(12):
            x, y = torch.randn(16, 16), torch.randint(0, 4, (16,))
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P2" and f["severity"] != "info"]


@pytest.mark.parametrize("both_zero", [True, False])
def test_lora_factors_both_zero_are_named_as_such(tmp_path: Path, both_zero: bool) -> None:
    found = _p2(tmp_path / "lora.tscope", both_zero)
    if not both_zero:
        assert found == []
        return
    (f,) = found
    assert f["message"].startswith("Every trainable parameter (0.A, 0.B, 2.A, 2.B) is all zeros and so is its gradient"), f["message"]
    assert "kaiming_uniform_" in f["fix"]
