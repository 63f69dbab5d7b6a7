"""P14 "Loss not scaled by the GradScaler" on real captures (QA round 29): ``scaler.scale(loss)``
with its result dropped and ``loss.backward()`` on the raw loss -- scaler.step() then divides
every gradient by the scale (65536), silently.  The right call, with or without gradient
accumulation, is no finding."""

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


def _run(tmp_path: Path, how: str, mode: str) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    path = tmp_path / f"{how}-{mode}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(8):
            opt.zero_grad()
            for _ in range(2 if how == "accumulated" else 1):
                x, y = torch.randn(32, 16), torch.randn(32, 1)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.mse_loss(model(x).float(), y)
                if how == "dropped":
                    scaler.scale(loss)
                    loss.backward()  # the raw loss
                elif how == "accumulated":
                    scaler.scale(loss / 2).backward()
                else:
                    scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P14"]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_dropped_scaled_loss_is_p14(tmp_path: Path, mode: str) -> None:
    (f,) = _run(tmp_path, "dropped", mode)
    assert f["severity"] == "error" and f["title"] == "Loss not scaled by the GradScaler", f
    assert "(65536)" in f["message"] and f["steps"] == list(range(8))
    lines = Path(__file__).read_text().splitlines()
    assert f["src"] == f"{Path(__file__).name}:{next(n for n, t in enumerate(lines, 1) if '# the raw loss' in t)}"
    assert "scaler.scale(loss).backward()" in f["fix"]


@pytest.mark.parametrize("how", ["scaled", "accumulated"])
def test_a_scaled_loss_is_no_finding(tmp_path: Path, how: str) -> None:
    assert _run(tmp_path, how, "default") == []
