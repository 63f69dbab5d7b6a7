"""P2 names where a dead branch's gradient stops: the module whose output gets a gradient while
its input, another module's output, gets none (a ReLU after a layer whose bias is far below
zero).  Real captures: the doctor listed every dead parameter upstream and never the ReLU (QA)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _p2(tmp_path: Path, mode: str, bias: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    with torch.no_grad():
        model[3].bias.fill_(bias)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    path = tmp_path / f"{mode}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(6):
            opt.zero_grad()
            F.cross_entropy(model(torch.randn(32, 20)), torch.randint(0, 5, (32,))).backward()
            opt.step()
    events = list(iter_events(path))
    return [dict(f) for f in diagnose(events) if f["code"] == "P2"], events


def test_the_relu_that_never_fires_is_named(tmp_path: Path) -> None:
    found, events = _p2(tmp_path, "default", bias=-20.0)
    (p2,) = found
    # what plain PyTorch computed: every gradient before the ReLU is zero, the last layer's bias learns
    first = next(e for e in events if e["kind"] == "step")
    assert first["grads"]["norm"][4] == 0.0 and first["grads"]["norm"][-1] > 0
    assert "The gradient stops at '4' (ReLU): its output gets a gradient, but its input, the output of '3' (Linear), " \
           "gets none: a ReLU whose input is never positive." in p2["message"], p2["message"]
    assert p2["modules"][0] == "4" and "3.bias" in p2["params"]


def test_a_healthy_relu_net_has_no_dead_branch(tmp_path: Path) -> None:
    assert _p2(tmp_path, "default", bias=0.0)[0] == []


def test_light_names_no_stop_it_did_not_see(tmp_path: Path) -> None:
    """light captures no graph and no module output gradients: the finding keeps to the parameters."""
    (p2,), events = _p2(tmp_path, "light", bias=-20.0)
    assert not any(e.get("activation_grads") for e in events if e["kind"] == "step")
    assert "3.bias" in p2["params"] and "The gradient stops at" not in p2["message"]


def test_a_mostly_dead_layer_read_every_tenth_step_is_told_as_such() -> None:
    """A layer whose gradient is 99.5% zeros (a few live units still learn) on the steps whose
    share of zeros was read, every tenth: "(nearly) dead", and its steps counted against those
    read -- "on 3 steps" of 30 were 3 of the 3 read (found by QA on a 5,000-step run)."""
    from doctor_events import grads, session, step

    events = [session(), *[
        step(i, grads=grads(norm=[0.01, 0.02, 0.5, 0.5], zero_frac=[0.995, 0.0, 0.0, 0.0]) if i % 10 == 0
             else {k: v for k, v in grads(norm=[0.01, 0.02, 0.5, 0.5]).items() if k != "zero_frac"})
        for i in range(30)]]
    (p2,) = [f for f in diagnose(events) if f["code"] == "P2"]
    assert p2["params"] == ["enc.weight"] and p2["steps"] == [0, 10, 20], p2
    assert "3 of the 3 steps whose share of zeros was read" in p2["message"], p2["message"]
    assert "this branch is (nearly) dead: it barely learns" in p2["message"]
    assert "does not learn" not in p2["message"]
