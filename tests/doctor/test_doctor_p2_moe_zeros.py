"""A top-1 mixture-of-experts whose loop clears with ``zero_grad(set_to_none=False)``: an expert
no token was routed to on a step keeps the zeros ``zero_grad`` wrote -- unused that step, not
dead.  Routing changes the graph nearly every step, so few steps have a captured graph of their
structure to tell that the backward never reached the expert; P2 read those zeros as "Dead
branch: gradient is all zeros" (QA 47b).  An expert that gets a gradient again later is not
dead; a branch whose ReLU died stays P2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class _MoE(nn.Module):
    def __init__(self, dead: bool, d: int = 8, experts: int = 4) -> None:
        super().__init__()
        self.gate = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(experts))
        self.branch = nn.Linear(d, d)
        if dead:  # a ReLU that never fires: its branch's gradient is all zeros on every step
            nn.init.constant_(self.branch.bias, -100.0)
        self.out = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(self.gate(x), -1)
        weight, idx = probs.max(-1)
        y = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            mask = idx == e
            if mask.any():
                y[mask] = expert(x[mask]) * weight[mask, None]
        return self.out(F.relu(y) + F.relu(self.branch(x)))


def _run(path: Path, mode: str, dead: bool) -> tuple[list[dict], list[list[float]]]:
    torch.manual_seed(0)
    model = _MoE(dead)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    norms = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(15):
            x, y = torch.randn(5, 8), torch.randint(0, 2, (5,))
            opt.zero_grad(set_to_none=False)
            F.cross_entropy(model(x), y).backward()
            norms.append([0.0 if (g := model.experts[e].weight.grad) is None else float(g.norm()) for e in range(4)])
            opt.step()
    return [f for f in diagnose(list(iter_events(path))) if f["code"] == "P2"], norms


@pytest.mark.parametrize("mode", ["light", "default"])
def test_an_expert_no_token_was_routed_to_is_no_dead_branch(tmp_path: Path, mode: str) -> None:
    findings, norms = _run(tmp_path / "moe.tscope", mode, dead=False)
    # the premise: some expert got exact zeros on a step, and a gradient again on a later one
    assert any(n[e] == 0.0 and any(later[e] > 0 for later in norms[i + 1:])
               for i, n in enumerate(norms) for e in range(4))
    assert findings == [], [f["message"] for f in findings]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_dead_relu_beside_the_experts_stays_a_dead_branch(tmp_path: Path, mode: str) -> None:
    findings, _ = _run(tmp_path / "dead.tscope", mode, dead=True)
    assert len(findings) == 1 and "branch.weight" in findings[0]["message"], [f["message"] for f in findings]
    assert not [p for p in findings[0]["params"] if p.startswith("experts.")]
