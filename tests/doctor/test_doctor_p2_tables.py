"""P2 and parameters that are tables (QA 45a): learned positions sliced to the sequence's length,
a factorisation machine's raw ``nn.Parameter`` rows indexed by ids -- the rows not read get a
zero gradient, by design, as an ``nn.Embedding``'s do.  They read as a dead branch; a parameter
every captured forward op reads only rows of (slice, index, gather, ...) is a table now.  A light
run has no graph to tell: a parameter of a module's own (no layer's weight or bias) is an info
naming both readings (QA 48a: a warning); a layer's weight whose ReLU died stays a warning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class _Positions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1024, 16) * 0.02)
        self.fc = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x + self.pos[: x.size(1)]).mean(1)


class _FM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(20000))
        self.v = nn.Parameter(torch.randn(20000, 8) * 0.01)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        v = self.v[ids]
        return self.w[ids].sum(1) + 0.5 * (v.sum(1).pow(2) - v.pow(2).sum(1)).sum(1)


@pytest.mark.parametrize("mode", ["default", "light"])
@pytest.mark.parametrize("kind", ["positions", "fm"])
def test_a_table_read_by_rows_is_no_dead_branch(tmp_path: Path, kind: str, mode: str) -> None:
    torch.manual_seed(0)
    model: nn.Module = _FM() if kind == "fm" else _Positions()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / f"{kind}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(30):
            x = torch.randint(0, 20000, (16, 5)) if kind == "fm" else torch.randn(8, 6, 16)
            loss = F.mse_loss(model(x).squeeze(), torch.randn(16 if kind == "fm" else 8))
            opt.zero_grad()
            loss.backward()
            opt.step()
    p2 = [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P2" and f["severity"] != "info"]
    assert p2 == [], p2


def test_a_dead_layer_weight_in_a_light_run_stays_a_warning(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    nn.init.constant_(model[0].bias, -100.0)  # every unit of the ReLU off: 0.weight's gradient all zeros
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / "dead.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(30):
            loss = F.mse_loss(model(torch.randn(8, 16)).squeeze(), torch.randn(8))
            opt.zero_grad()
            loss.backward()
            opt.step()
    p2 = [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P2"]
    assert [f for f in p2 if f["severity"] == "warning" and "0.weight" in f["params"]], p2


class _RawDead(nn.Module):
    """A layer of raw parameters (no 'weight' or 'bias' in their names) before a ReLU that never fires."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Parameter(torch.randn(16, 32) * 0.1)
        self.shift = nn.Parameter(torch.full((32,), -100.0))
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(x @ self.proj + self.shift)).squeeze(-1)


def test_raw_parameters_of_a_dead_branch_in_a_light_run_stay_a_warning(tmp_path: Path) -> None:
    """Every gradient of them exactly zero on every step: no row read at all, not a table
    (QA 48c: the table info hid this dead ReLU)."""
    torch.manual_seed(0)
    model = _RawDead()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / "raw.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(30):
            loss = F.mse_loss(model(torch.randn(8, 16)), torch.randn(8))
            opt.zero_grad()
            loss.backward()
            opt.step()
    p2 = [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P2"]
    assert [f for f in p2 if f["severity"] == "warning" and "proj" in f["params"]], p2
