"""A layer frozen mid-run with ``requires_grad_(False)`` in a loop that zeroes with
``zero_grad(set_to_none=False)``: its ``.grad`` stays a zero tensor.  Adam's momentum still
moves it, and the step's ``update_ratio`` says by how much (it read None, "not updated", QA
44a); and light mode, which captures no graph, tells the doctor the backward no longer
reaches it (its walk's ``unreached``), so its zero gradient is no dead branch (P2 warned)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

FREEZE_AT, STEPS = 5, 12


def _train(path: Path | None, mode: str) -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    w = torchscope.watch(model, opt, server=None, record=path, mode=mode) if path else None
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    moved = []  # the frozen weight's relative change at each step, as the ratio is defined
    for i in range(STEPS):
        if i == FREEZE_AT:
            model[0].requires_grad_(False)
        before = model[0].weight.detach().clone()
        opt.zero_grad(set_to_none=False)
        F.mse_loss(model(x[i * 4:i * 4 + 4]), y[i * 4:i * 4 + 4]).backward()
        opt.step()
        moved.append(float((model[0].weight.detach() - before).norm() / before.norm()))
    if w is not None:
        w.close()
    return moved, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_layer_frozen_mid_run_that_adam_still_moves(tmp_path: Path, mode: str) -> None:
    moved, plain = _train(None, mode)
    path = tmp_path / f"{mode}.tscope"
    w_moved, watched = _train(path, mode)
    assert w_moved == moved and all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
    assert min(moved[FREEZE_AT:]) > 1e-3  # frozen, and still moving
    events = list(iter_events(path))
    findings = [f for f in diagnose(events) if f["severity"] in ("warning", "error")]
    assert findings == [], findings
    if mode == "light":
        return  # (light reads no update ratios)
    steps = [e for e in events if e["kind"] == "step"]
    ratios = {e["step"]: e["grads"]["update_ratio"][0] for e in steps if e["grads"].get("update_ratio")}
    frozen = [s for s in ratios if s >= FREEZE_AT]
    assert frozen and (mode == "default" or len(frozen) == STEPS - FREEZE_AT), ratios
    for s in frozen:
        assert ratios[s] == pytest.approx(moved[s], rel=1e-4), (s, ratios[s], moved[s])
