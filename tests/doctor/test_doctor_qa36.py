"""What the thirty-sixth session's QA (36a) found on clean multi-task loops whose two heads take
turns (each step trains one head; the other's backward graph has no node of it):

- with one optimizer per head (the watched one the trunk's), the idle head keeps the gradient
  of its last turn until its own zero_grad() on its next: P5 called that "zero_grad() is
  missing" (an error, exit 1) -- no backward adds onto it, which the capture now checks (the
  stale gradient's tensor version across each backward);
- with ``zero_grad(set_to_none=False)``, the idle head's gradient is zeros: P2 called both heads
  a dead branch "on every step" -- a parameter the step's backward graph does not reach is no
  dead branch there (told by the graph of that structure: captured, or walked in light mode).

Both rules still fire where they should: heads whose optimizers never zero_grad() pile up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class MultiTask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.cls_head, self.reg_head = nn.Linear(32, 4), nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, task: str) -> torch.Tensor:
        h = self.trunk(x)
        return self.cls_head(h) if task == "cls" else self.reg_head(h)


def _train(tmp_path: Path, mode: str, variant: str, steps: int = 24) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = MultiTask()
    if variant == "zeros":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        heads = {}
    else:  # one optimizer per head; the watched one steps the trunk
        opt = torch.optim.Adam(model.trunk.parameters(), lr=1e-3)
        heads = {"cls": torch.optim.Adam(model.cls_head.parameters(), lr=1e-3),
                 "reg": torch.optim.Adam(model.reg_head.parameters(), lr=1e-3)}
    wc, wr = torch.randn(24, 4), torch.randn(24, 1)
    path = tmp_path / f"{variant}-{mode}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(steps):
            task = "cls" if step % 2 == 0 else "reg"
            x = torch.randn(32, 24)
            out = model(x, task)
            loss = F.cross_entropy(out, (x @ wc).argmax(1)) if task == "cls" else F.mse_loss(out, x @ wr)
            opt.zero_grad(set_to_none=variant != "zeros")
            if variant == "per_head":
                heads[task].zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # in place, the idle head's gradient too
            opt.step()
            if heads:
                heads[task].step()
    return list(iter_events(path))


def _codes(events: list[dict[str, Any]]) -> dict[str, str]:
    return {f["code"]: f["severity"] for f in diagnose(events)}


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_heads_with_their_own_optimizers_are_no_missing_zero_grad(tmp_path: Path, mode: str) -> None:
    events = _train(tmp_path, mode, "per_head")
    assert "P5" not in _codes(events), diagnose(events)
    # the capture's record: the idle head's stale gradient is no longer counted as piled up
    steps = [e for e in events if e["kind"] == "step"]
    assert all(not s["grads"]["pre_nonzero"] for s in steps), [s["grads"]["pre_nonzero"] for s in steps]


@pytest.mark.parametrize("mode", ["light", "full"])
def test_heads_whose_optimizers_never_zero_grad_are_still_p5(tmp_path: Path, mode: str) -> None:
    events = _train(tmp_path, mode, "never_zeroed")
    findings = [f for f in diagnose(events) if f["code"] == "P5"]
    assert findings and findings[0]["severity"] == "error", findings
    assert set(findings[0]["params"]) == {"cls_head.weight", "cls_head.bias", "reg_head.weight", "reg_head.bias"}
    assert findings[0]["steps"][0] == 2  # the cls head's second turn adds onto its first


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_an_idle_heads_zero_gradient_is_no_dead_branch(tmp_path: Path, mode: str) -> None:
    events = _train(tmp_path, mode, "zeros")
    codes = _codes(events)
    assert "P2" not in codes and all(sev == "info" for sev in codes.values()), diagnose(events)
    zero_norm = [s["step"] for s in (e for e in events if e["kind"] == "step") if s["grads"]["norm"][-1] == 0.0]
    assert len(zero_norm) >= 10  # (the reg head's gradient is exactly zero on the cls steps)


class FineTunedCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(8 * 4 * 4, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


@pytest.mark.parametrize("mode", ["light", "default"])
def test_forgetting_train_names_the_modules_it_changed_not_a_batch_norm_frozen_on_purpose(tmp_path: Path,
                                                                                         mode: str) -> None:
    """The backbone's batch-norm is in eval mode from the start (frozen on purpose); an evaluation
    at step 5 calls model.eval() and the loop never calls model.train() again: P11 names the
    dropout that changed -- it named the frozen batch-norm beside it (QA 36a finding 5)."""
    torch.manual_seed(0)
    model = FineTunedCNN()
    model.backbone[1].requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    path = tmp_path / f"bn-{mode}.tscope"
    model.train()
    model.backbone[1].eval()
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(12):
            loss = F.cross_entropy(model(torch.randn(8, 3, 8, 8)), torch.randint(0, 5, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == 5:
                model.eval()  # an evaluation; the loop never calls model.train() again
                with torch.no_grad():
                    model(torch.randn(8, 3, 8, 8))
    (f,) = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P11" and f["severity"] == "warning"]
    assert f["message"].startswith("Training while the model is in eval mode (since step 6"), f["message"]
    assert "'head.1'" in f["message"] and "backbone.1" not in f["message"], f["message"]
