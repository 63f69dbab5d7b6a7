"""P2 names a branch whose output cancels out of the loss: a Gaussian policy's ``log_prob`` of
its own ``rsample()`` reads ``(loc + eps * scale - loc) / scale``, so the mean head gets exact
zeros, which read as a dead ReLU with a fix about ReLUs, gates and masks (QA 49a).  The same
loss of ``sample()`` trains the mean head: no P2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributions import Normal

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class _Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 16), nn.Tanh())
        self.mu = nn.Linear(16, 1)
        self.log_std = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> Normal:
        return Normal(self.mu(self.body(x)), self.log_std.exp())


def _policy_gradient_step(pi: _Policy, opt: torch.optim.Optimizer, how: str) -> None:
    """REINFORCE on a one-step task: the reward is how close the action lands to the first input."""
    obs = torch.randn(16, 3)
    dist = pi(obs)
    a = dist.rsample() if how == "rsample" else dist.sample()
    reward = -(a - obs[:, :1]).pow(2).detach()
    opt.zero_grad()
    (-(dist.log_prob(a).sum(-1) * (reward.squeeze(1) - reward.mean())).mean()).backward()
    opt.step()


def _p2(tmp_path: Path, how: str, mode: str) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    pi = _Policy()
    opt = torch.optim.Adam(pi.parameters(), lr=1e-3)
    with torchscope.watch(pi, opt, server=None, record=tmp_path / f"{how}-{mode}.tscope", mode=mode) as w:
        for _ in range(6):
            _policy_gradient_step(pi, opt, how)
    return [dict(f) for f in diagnose(iter_events(w.path)) if f["code"] == "P2"]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_log_prob_of_its_own_rsample_is_named(tmp_path: Path, mode: str) -> None:
    (f,) = _p2(tmp_path, "rsample", mode)
    assert "mu.weight" in f["params"] and "mu" in f["modules"], f
    assert f"The output of 'mu' cancels out of the loss at {Path(__file__).name}:" in f["message"], f["message"]
    assert "log_prob of its own rsample()" in f["message"] and "dist.sample()" in f["fix"] and "ReLU" not in f["fix"]


def test_log_prob_of_a_sample_trains_the_mean(tmp_path: Path) -> None:
    assert _p2(tmp_path, "sample", "default") == []


class _Block(nn.Module):
    """A block whose output is its ``Sequential``'s last member's (a ReLU's), not its Linear's."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.f = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.out = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        fh = self.f(h)
        return self.out((h + fh) - fh)  # type: ignore[no-any-return]


def test_a_blocks_output_that_cancels_is_named(tmp_path: Path) -> None:
    """The cancelling output is the ReLU's at the end of ``f`` (module ``f.1``), the dead
    parameters its Linear's (``f.0``): named all the same (QA 49d: the plain dead-branch text)."""
    torch.manual_seed(0)
    model = _Block()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchscope.watch(model, opt, server=None, record=tmp_path / "block.tscope") as w:
        for _ in range(6):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
    (f,) = [dict(f) for f in diagnose(iter_events(w.path)) if f["code"] == "P2"]
    assert f["params"] == ["f.0.weight", "f.0.bias"] and "The output of 'f.1' cancels out of the loss" in f["message"], f
