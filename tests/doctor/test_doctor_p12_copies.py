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


@pytest.mark.parametrize("what", ["weight", "grad", "buffer"])
def test_converting_a_tensor_written_in_place_since_is_no_p12(tmp_path: Path, what: str) -> None:
    """A norm logged in float64 every step of a parameter (the optimizer updates it in place), of
    a ``.grad`` kept by ``zero_grad(set_to_none=False)`` (zeroed and accumulated into), or of a
    2 MiB buffer filled anew each step: the same tensor object, new values -- not the same data
    converted again (found by QA); the same buffer left unchanged still is."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    buf = torch.empty(8192, 64)
    path = tmp_path / f"{what}.tscope"
    norms = []
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(8):
            x, y = torch.randn(16, 512), torch.randn(16, 4)
            opt.zero_grad(set_to_none=False)
            nn.functional.mse_loss(model(x), y).backward()
            if what == "weight":
                norms.append(model[0].weight.double().norm().item())
            elif what == "grad":
                norms.append(model[0].weight.grad.double().norm().item())
            else:
                buf.normal_()
                norms.append(buf.double().sum().item())
            opt.step()
    assert len(set(norms)) == 8  # the values changed every step
    assert [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P12"] == []


def test_converting_an_unchanged_buffer_every_step_is_still_p12(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(64, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    table = torch.randn(8192, 64)
    path = tmp_path / "table.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for i in range(8):
            rows = table.double()[i * 16:(i + 1) * 16]
            opt.zero_grad()
            model(rows).pow(2).mean().backward()
            opt.step()
    (f,) = [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P12"]
    assert "the same data converted/copied again every step" in f["message"]
