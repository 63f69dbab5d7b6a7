"""P11 on the PyTorch QAT recipe (QA round 29): conv+bn+relu fused, ``prepare_qat``, and after a
few epochs the observers disabled and the batch-norm statistics frozen (``freeze_bn_stats``):
batch norm in eval from that step to the end, set by the loop, is deliberate -- the "frozen
statistics" info, not a warning.  The same batch norm left in eval by an evaluation (under
no_grad) is still the warning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.ao.quantization as Q
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.quant, self.dequant = Q.QuantStub(), Q.DeQuantStub()
        self.conv, self.bn, self.relu = nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU()
        self.fc = nn.Linear(64, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dequant(self.fc(self.relu(self.bn(self.conv(self.quant(x)))).flatten(1)))


def _p11(tmp_path: Path, mode: str, how: str) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model: nn.Module = Net().train()
    if how == "freeze_bn_stats":
        model.qconfig = Q.get_default_qat_qconfig("x86")  # type: ignore[assignment]
        model = Q.fuse_modules_qat(model, [["conv", "bn", "relu"]])
        Q.prepare_qat(model, inplace=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    path = tmp_path / f"{how}-{mode}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(24):
            if step == 6 and how == "freeze_bn_stats":
                model.apply(Q.disable_observer)
                model.apply(torch.ao.nn.intrinsic.qat.freeze_bn_stats)
            elif step == 6:  # an evaluation, after which only the head is put back in train mode
                model.eval()
                with torch.no_grad():
                    model(torch.randn(8, 2, 6, 6))
                model.fc.train()
            x, y = torch.randn(8, 2, 6, 6), torch.randint(0, 3, (8,))
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P11"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_freezing_batch_norm_statistics_late_in_qat_is_an_info(tmp_path: Path, mode: str) -> None:
    (f,) = _p11(tmp_path, mode, "freeze_bn_stats")
    assert f["severity"] == "info" and f["title"] == "Batch-norm statistics frozen (norm_eval)", f
    assert f["modules"] == ["conv.bn"] and "freeze_bn_stats" in f["message"]


def test_batch_norm_left_in_eval_by_an_evaluation_is_still_a_warning(tmp_path: Path) -> None:
    (f,) = _p11(tmp_path, "default", "evaluation")
    assert f["severity"] == "warning" and "eval mode" in f["message"] and "'bn'" in f["message"], f
