"""P6 for training forwards from the loop's own call site that no backward used (QA 44e): on a
few steps they are batches the loop skipped (a caught error); on many steps, as likely outputs
used only detached -- a teacher trained every few steps, its other forwards only the student's
targets -- which "Batches skipped before backward" misread as a fault of the loop."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _p6(path: Path) -> dict[str, object]:
    (p6,) = [dict(f) for f in diagnose(list(iter_events(path))) if f["code"] == "P6"]
    return p6


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_teacher_trained_every_few_steps_is_no_skipped_batch(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    teacher, student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), nn.Linear(8, 4)
    t_opt, s_opt = torch.optim.Adam(teacher.parameters()), torch.optim.Adam(student.parameters())
    path = tmp_path / "teacher.tscope"
    with torchscope.watch(teacher, t_opt, server=None, record=path, mode=mode):
        for i in range(24):
            x = torch.randn(16, 8)
            t = teacher(x)
            s_opt.zero_grad()
            F.mse_loss(student(x), t.detach()).backward()
            s_opt.step()
            if i % 4 == 3:
                t_opt.zero_grad()
                F.binary_cross_entropy_with_logits(t, (x[:, :4] > 0).float()).backward()
                t_opt.step()
    p6 = _p6(path)
    assert p6["severity"] == "info" and p6["title"] == "Graph built but never used", p6
    assert "18 training forward passes" in str(p6["message"]) and "detached" in str(p6["message"]), p6
    assert "no_grad" in str(p6["fix"]), p6


def test_a_batch_skipped_on_an_error_is_told_as_skipped(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "skip.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="default"):
        for i in range(12):
            x = torch.randn(16, 8)
            out = model(x)
            try:
                if i == 5:
                    raise ValueError("a bad batch")
                loss = F.mse_loss(out, x.sum(1, keepdim=True))
            except ValueError:
                continue
            opt.zero_grad()
            loss.backward()
            opt.step()
    p6 = _p6(path)
    assert p6["title"] == "Batches skipped before backward" and str(p6["message"]).startswith("1 training forward"), p6
