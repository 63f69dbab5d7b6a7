"""P11 and P6 on a model with lazy modules watched before its dry run (QA round 32b, finding 5).

``nn.LazyLinear``/``nn.LazyConv2d``/``nn.LazyBatchNorm2d`` make their parameters in their first
forward, so PyTorch's docs run the model once on a sample batch (its output thrown away) before
building the optimizer.  Watched before that dry run, the model recorded it as the first forward
of step 0, in train mode: the doctor told it as an evaluation with dropout on (P11) and, without
``no_grad``, as a graph no backward used (P6).  It is neither, in every mode: the capture marks
the forward whose call made the lazy parameters (``materialized``).  Real evaluations in train
mode later in such a run are still P11, and so is a lone first forward of a model without lazy
modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _lazy_mlp() -> nn.Module:
    return nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.Dropout(0.1), nn.LazyLinear(4))


def _lazy_cnn() -> nn.Module:
    return nn.Sequential(nn.LazyConv2d(4, 3, padding=1), nn.ReLU(), nn.LazyBatchNorm2d(), nn.Flatten(),
                         nn.Dropout(0.2), nn.LazyLinear(4))


def _batch(model: str, n: int) -> torch.Tensor:
    return torch.randn(n, 3, 6, 6) if model == "cnn" else torch.randn(n, 12)


def _run(path: Path, mode: str, *, model: str = "mlp", dry: str = "no_grad", evaluate: bool = False,
         lazy: bool = True) -> list[dict[str, Any]]:
    """Watch, dry run (``dry``: under no_grad, with grad as in torch's LazyModuleMixin docs),
    optimizer built after it, 20 training steps; ``evaluate``: every 5 steps a validation under
    no_grad with the model left in train mode (the real mistake)."""
    torch.manual_seed(0)
    if lazy:
        net = _lazy_cnn() if model == "cnn" else _lazy_mlp()
    else:
        net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))
    w = torchscope.watch(net, server=None, record=path, mode=mode)
    try:
        if dry == "no_grad":
            with torch.no_grad():
                net(_batch(model, 2))  # dry run
        else:
            net(_batch(model, 2))  # dry run, with grad as in torch's docs
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        xv, yv = _batch(model, 16), torch.randint(0, 4, (16,))
        accuracies = []
        for step in range(20):
            x, y = _batch(model, 8), torch.randint(0, 4, (8,))
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()
            if evaluate and step % 5 == 4:
                with torch.no_grad():
                    accuracies.append((net(xv).argmax(1) == yv).float().mean().item())  # validation
    finally:
        w.close()
    return [dict(f) for f in diagnose(iter_events(path))]


def _line(marker: str) -> str:
    n = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.endswith(marker))
    return f"{Path(__file__).name}:{n}"


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_lazy_models_dry_run_under_no_grad_is_no_evaluation(tmp_path: Path, mode: str) -> None:
    found = _run(tmp_path / "x.tscope", mode)
    assert [f for f in found if f["code"] in ("P11", "P6")] == [], found


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_lazy_models_dry_run_with_grad_is_no_evaluation_nor_unused_graph(tmp_path: Path, mode: str) -> None:
    found = _run(tmp_path / "x.tscope", mode, dry="grad")
    assert [f for f in found if f["code"] in ("P11", "P6")] == [], found


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_lazy_conv_batch_norm_models_dry_run_is_no_evaluation(tmp_path: Path, mode: str) -> None:
    found = _run(tmp_path / "x.tscope", mode, model="cnn", dry="grad")
    assert [f for f in found if f["code"] in ("P11", "P6")] == [], found


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_real_evaluation_in_train_mode_in_a_lazy_models_run_is_still_p11(tmp_path: Path, mode: str) -> None:
    found = _run(tmp_path / "x.tscope", mode, evaluate=True)
    p11 = [f for f in found if f["code"] == "P11"]
    assert len(p11) == 1, found
    assert p11[0]["severity"] == "warning" and "Evaluating with '2' (Dropout) in train mode" in p11[0]["message"], p11
    assert p11[0]["src"] == _line("# validation"), p11  # the validation's line, not the dry run's
    assert p11[0]["steps"] == [4, 9, 14, 19], p11  # each told with the step it ran after; not the dry run's 0


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_lone_first_forward_of_a_model_without_lazy_modules_is_still_p11(tmp_path: Path, mode: str) -> None:
    """That forward made no parameter: no lazy module's dry run, an evaluation in train mode as
    before."""
    found = _run(tmp_path / "x.tscope", mode, lazy=False)
    p11 = [f for f in found if f["code"] == "P11"]
    assert len(p11) == 1 and p11[0]["steps"] == [0] and p11[0]["src"] == _line("# dry run"), found
