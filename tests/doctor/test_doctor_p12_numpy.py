"""P12 for a numpy dataset converted every step (QA 46a: missed).  ``torch.from_numpy(X_np).float()``
makes a new tensor object over the same numpy memory each step, so the repeat the capture
told by the source tensor's identity went unseen; ``torch.tensor(X_np)`` was no tensor source
at all.  Told now by the memory's address and a sample of its values.  A batch loaded into a
reused numpy buffer (the same address, new values) and the conversion done once before the
loop are no finding; training is unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

N = 8192


def _run(tmp_path: Path, how: str, mode: str) -> tuple[list[dict[str, object]], list[float]]:
    rng = np.random.default_rng(0)
    x_np, y_np = rng.standard_normal((N, 32)), rng.standard_normal((N, 1))  # float64, 2 MiB
    buf = np.empty((64, 32))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / f"{how}.tscope"
    x_once = torch.from_numpy(x_np).float()
    losses = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode) if mode else _Off():
        for _ in range(12):
            idx = torch.randint(0, N, (64,))
            if how == "from_numpy":
                x = torch.from_numpy(x_np).float()[idx]  # (the conversion)
            elif how == "tensor":
                x = torch.tensor(x_np, dtype=torch.float32)[idx]  # (the conversion)
            elif how == "buffer":  # a batch loaded into the same numpy buffer each step
                buf[:] = x_np[idx.numpy()]
                x = torch.from_numpy(buf).float()
            else:
                x = x_once[idx]
            y = torch.from_numpy(y_np[idx.numpy()]).float()
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    found = [dict(f) for f in diagnose(list(iter_events(path)))] if mode else []
    return found, losses


class _Off:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("mode", ["default", "full"])
@pytest.mark.parametrize("how", ["from_numpy", "tensor"])
def test_a_numpy_dataset_converted_every_step_is_p12(tmp_path: Path, how: str, mode: str) -> None:
    found, losses = _run(tmp_path, how, mode)
    assert losses == _run(tmp_path, how, "")[1]  # training unchanged
    (p12,) = [f for f in found if f["code"] == "P12"]
    assert p12["severity"] == "warning" and "the same data converted/copied again every step" in str(p12["message"])
    line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1)
                if t.rstrip().endswith("# (the conversion)") and f"torch.{how}(" in t)
    assert p12["src"] == f"{Path(__file__).name}:{line}", p12


@pytest.mark.parametrize("how", ["buffer", "once"])
def test_a_reused_buffer_or_one_conversion_is_no_p12(tmp_path: Path, how: str) -> None:
    found, _ = _run(tmp_path, how, "full")
    assert not [f for f in found if f["code"] == "P12"], found
