"""Two deliberate uses of eval mode mid-training that P11 read as mistakes (QA 48a):

- Grad-CAM every few steps: ``model.eval()``, a class score's ``backward()``, ``model.zero_grad()``,
  ``model.train()``.  No optimizer step applies that backward (its gradients are reset first), yet
  it read as "Training while the model is in eval mode".
- Monte Carlo dropout: ``model.eval()``, then only the Dropout modules back in ``train()``, several
  stochastic passes under ``no_grad``: it read as "Evaluating with ... in train mode".

- Batch-norm recalibration: train-mode ``no_grad`` forwards over some batches with the batch norms'
  ``momentum=None`` (a cumulative average), as ``torch.optim.swa_utils.update_bn`` runs them
  (after pruning, after SWA): read as an evaluation in train mode.  The capture marks such a
  forward (``ForwardInfo.bn_recalibration``, format 1.12).

Their buggy twins stay findings: the saliency backward applied by the next ``optimizer.step()``
(no ``zero_grad()`` between), an evaluation that forgot ``model.eval()``, and train-mode
``no_grad`` forwards with the batch norms' usual momentum."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _p11(path: Path) -> list[dict]:
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P11"]


@pytest.mark.parametrize("mode", ["light", "default"])
@pytest.mark.parametrize("cleared", [True, False], ids=["zero_grad_after", "applied"])
def test_a_saliency_backward_in_eval_mode_is_no_training(tmp_path: Path, mode: str, cleared: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    x_all, y_all = torch.randn(128, 1, 8, 8), torch.randint(0, 2, (128,))
    path = tmp_path / "cam.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(24):
            i = torch.randint(0, 128, (32,))
            if step % 8 == 7:
                model.eval()
                out = model(x_all[:1])
                out[0, out[0].argmax()].backward()  # the saliency of the top class
                if cleared:
                    model.zero_grad()
                model.train()
            if cleared:
                opt.zero_grad()
            F.cross_entropy(model(x_all[i]), y_all[i]).backward()
            opt.step()
            if not cleared:
                opt.zero_grad()
    found = [f for f in _p11(path) if "eval mode" in f["message"]]
    assert (found == []) is cleared, [f["message"] for f in _p11(path)]


@pytest.mark.parametrize("mode", ["light", "default"])
@pytest.mark.parametrize("mc", [True, False], ids=["mc_dropout", "eval_forgotten"])
def test_mc_dropout_passes_are_no_evaluation_in_train_mode(tmp_path: Path, mode: str, mc: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    path = tmp_path / "mc.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(24):
            x = torch.randn(32, 6)
            opt.zero_grad()
            F.mse_loss(model(x), x[:, :1].sin()).backward()
            opt.step()
            if step % 6 == 5:
                if mc:
                    model.eval()
                    model[2].train()  # only the dropout on: Monte Carlo dropout
                with torch.no_grad():
                    torch.stack([model(x) for _ in range(4)]).std(0)
                model.train()
    found = [f for f in _p11(path) if f["message"].startswith("Evaluating with")]
    assert (found == []) is mc, [f["message"] for f in _p11(path)]


@pytest.mark.parametrize("mode", ["light", "default"])
@pytest.mark.parametrize("how", ["by_hand", "update_bn", "update_bn_dropout", "forgot_eval", "forgot_eval_dropout"])
def test_batch_norm_recalibration_is_no_evaluation_in_train_mode(tmp_path: Path, mode: str, how: str) -> None:
    """(``update_bn`` puts the whole model in train mode: a Dropout on beside the batch norms is
    no evaluation's either -- QA 48e.)"""
    torch.manual_seed(0)
    drop = nn.Dropout(0.1) if how.endswith("dropout") else nn.Identity()
    model = nn.Sequential(nn.Linear(6, 32), nn.BatchNorm1d(32), nn.ReLU(), drop, nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = [torch.randn(32, 6) for _ in range(4)]
    path = tmp_path / "bn.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(20):
            x = torch.randn(32, 6)
            opt.zero_grad()
            F.mse_loss(model(x), x[:, :1]).backward()
            opt.step()
            if step == 9:
                if how.startswith("update_bn"):
                    torch.optim.swa_utils.update_bn(data, model)
                    continue
                bn = model[1]
                if how == "by_hand":
                    bn.reset_running_stats()
                    bn.momentum = None
                with torch.no_grad():
                    for xb in data:
                        model(xb)
                bn.momentum = 0.1
    found = [f for f in _p11(path) if f["message"].startswith("Evaluating with")]
    assert (found == []) is (not how.startswith("forgot_eval")), [f["message"] for f in _p11(path)]
