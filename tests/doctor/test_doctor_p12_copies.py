"""P12 on real captures: a dataset kept in one tensor and copied again every step
(``X.clone()``, ``torch.tensor(X)``) is work that belongs before the loop; a small clone of the
same tensor every step (an initial hidden state) and a clone of what needs grad are not."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

COPIES = {"clone": "data = x_all.clone()", "torch.tensor": "data = torch.tensor(x_all)"}


def _p12(tmp_path: Path, how: str, mode: str) -> list[dict[str, Any]]:
    """P12's findings on 12 steps of a linear regression over an in-memory dataset (2 MiB)."""
    torch.manual_seed(0)
    x_all, y_all = torch.randn(8192, 64), torch.randn(8192, 1)
    h0 = torch.zeros(16, 64)
    model = nn.Linear(64, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / f"{how}.tscope"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.tensor(t)'s own advice to use clone()
        with torchscope.watch(model, opt, server=None, record=path, mode=mode):
            for i in range(12):
                data = x_all
                if how == "clone":
                    data = x_all.clone()
                elif how == "torch.tensor":
                    data = torch.tensor(x_all)
                elif how == "small clone":
                    data = x_all + h0.clone().sum()
                elif how == "clone with grad":
                    data = x_all + model.weight.clone().sum()
                xb, yb = data[i * 16:(i + 1) * 16], y_all[i * 16:(i + 1) * 16]
                opt.zero_grad()
                ((model(xb) - yb) ** 2).mean().backward()
                opt.step()
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P12"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("how", ["clone", "torch.tensor"])
def test_a_dataset_copied_every_step_is_p12(tmp_path: Path, how: str, mode: str) -> None:
    found = _p12(tmp_path, how, mode)
    assert len(found) == 1, found
    f = found[0]
    assert f["severity"] == "warning" and "the same data converted/copied again every step" in f["message"]
    assert "2.0 MiB moved per step" in f["message"]
    lines = Path(__file__).read_text().splitlines()
    copy_line = next(n for n, text in enumerate(lines, 1) if text.strip() == COPIES[how])
    assert f["src"] == f"test_doctor_p12_copies.py:{copy_line}"  # the loop's line that copies
    assert f["steps"][0] == 1 and "clone()" in f["fix"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("how", ["no copy", "small clone", "clone with grad"])
def test_small_or_graph_clones_are_no_p12(tmp_path: Path, how: str, mode: str) -> None:
    assert _p12(tmp_path, how, mode) == []
