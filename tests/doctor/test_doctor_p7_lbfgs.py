"""P7 and LBFGS (QA 48e)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def test_lbfgs_history_beside_the_returned_loss_is_no_graph_kept_alive(tmp_path: Path) -> None:
    """``loss = opt.step(closure)``: the loss step() returns holds one graph until the next step,
    a steady count, while LBFGS's history grows live memory by two parameter-sized tensors a step
    -- optimizer state, not graphs.  P7 read both together as "Graph kept alive ... +660 KiB per
    step" (QA 48e)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4, history_size=50)
    x, y = torch.randn(64, 256), torch.randn(64, 1)
    path = tmp_path / "lbfgs.tscope"

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(12):
            loss = opt.step(closure)
    assert loss is not None
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    grew = steps[6]["memory"]["optimizer"] - steps[2]["memory"]["optimizer"]
    assert grew > 4 * 256 * 1024  # the premise: the history grows the state well past P7's threshold
    assert [f for f in diagnose(iter_events(path)) if f["code"] == "P7"] == []
