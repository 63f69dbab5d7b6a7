"""P2 on real captures of a SAC-style update (full mode: every forward's output gradients): the
policy loss takes ``min(q1, q2)``, so the larger critic's layers get no gradient in that pass,
while that critic learns from its own loss in the same step -- no dead branch.  A critic
whose ReLU really is dead in every pass still is one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _critic() -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))


class ActorCritic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pi = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2), nn.Tanh())
        self.q1, self.q2 = _critic(), _critic()

    def forward(self, o: torch.Tensor) -> torch.Tensor:
        return self.pi(o)


def _run(path: Path, dead_q2: bool) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    ac = ActorCritic()
    with torch.no_grad():
        ac.q2[2].bias.fill_(5.0)  # q2 reads higher: min(q1, q2) is q1's
        if dead_q2:
            ac.q2[0].bias.fill_(-100.0)  # every unit of q2's ReLU off, in every pass
    q_params = [*ac.q1.parameters(), *ac.q2.parameters()]
    pi_opt = torch.optim.Adam(ac.pi.parameters(), lr=1e-3)
    q_opt = torch.optim.Adam(q_params, lr=1e-3)
    with torchscope.watch(ac, q_opt, server=None, record=path, mode="full"):
        for _ in range(12):
            o, a, target = torch.randn(16, 4), torch.randn(16, 2), torch.randn(16, 1)
            oa = torch.cat([o, a], 1)
            q_opt.zero_grad()
            ((ac.q1(oa) - target) ** 2 + (ac.q2(oa) - target) ** 2).mean().backward()
            q_opt.step()
            for p in q_params:
                p.requires_grad_(False)
            pi_opt.zero_grad()
            act = ac(o)
            oa_pi = torch.cat([o, act], 1)
            (-torch.min(ac.q1(oa_pi), ac.q2(oa_pi))).mean().backward()
            pi_opt.step()
            for p in q_params:
                p.requires_grad_(True)
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P2"]


@pytest.mark.parametrize("dead_q2", [False, True])
def test_the_critic_min_leaves_out_is_no_dead_branch(tmp_path: Path, dead_q2: bool) -> None:
    found = _run(tmp_path / "run.tscope", dead_q2)
    named = {m for f in found for m in f["modules"]}
    if dead_q2:
        assert [f["params"] for f in found] == [["q2.0.weight", "q2.0.bias", "q2.2.weight"]], found
    else:
        assert not any(m.startswith("q2") for m in named) and not any("q2" in f["message"] for f in found), found
