"""Reinforcement-learning loops, real captures.  P1 where a parameter's gradient is lost in a
loop that also runs the model under no_grad (an RL rollout choosing actions, a TD target) and
detaches on purpose (the advantage): the cut is the training path's, not the no_grad block's
(the doctor blamed the rollout's first op and told the user to remove its no_grad: QA).  P10
where REINFORCE's saved log-probabilities are never cleared: the fix names that list."""

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


class _ActorCritic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 32), nn.Tanh())
        self.pi = nn.Linear(32, 2)
        self.v = nn.Linear(32, 1)

    def forward(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(s)
        return self.pi(h), self.v(h).squeeze(-1)


def _run(tmp_path: Path, mode: str, bug: bool) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = _ActorCritic()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / f"{mode}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(6):
            s, s2 = torch.randn(16, 4), torch.randn(16, 4)
            with torch.no_grad():  # the rollout: actions from the current policy
                actions = torch.distributions.Categorical(logits=model(s)[0]).sample()
            reward = torch.randn(16)
            logits, v = model(s)
            with torch.no_grad():  # the TD target
                target = reward + 0.9 * model(s2)[1]
            adv = (target - v).detach()  # the advantage: a coefficient, detached on purpose
            logp = torch.distributions.Categorical(logits=logits).log_prob(actions)
            value = v.detach() if bug else v  # VALUE
            loss = -(logp * adv).mean() + 0.5 * F.mse_loss(value, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(f) for f in diagnose(iter_events(path))]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_the_critics_detach_is_the_cut_not_the_rollouts_no_grad(tmp_path: Path, mode: str) -> None:
    (p1,) = [f for f in _run(tmp_path, mode, bug=True) if f["code"] == "P1"]
    line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if "# VALUE" in t)
    assert p1["params"] == ["v.weight", "v.bias"], p1
    assert p1["src"] == f"{Path(__file__).name}:{line}" and "to the loss break" in p1["message"] and "at Tensor.detach()" in p1["message"], p1
    assert "no_grad" not in p1["message"]


def test_the_correct_loop_is_clean(tmp_path: Path) -> None:
    assert [f for f in _run(tmp_path, "default", bug=False) if f["severity"] in ("error", "warning")] == []


def test_saved_log_probs_never_cleared_are_p10_with_that_fix(tmp_path: Path) -> None:
    """The PyTorch REINFORCE example without its ``del policy.saved_log_probs[:]``: the second
    episode's backward goes through the first one's freed graph."""
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    saved: list[torch.Tensor] = []
    path = tmp_path / "reinforce.tscope"
    failed = 0
    with torchscope.watch(policy, opt, server=None, record=path, mode="default"):
        for _ in range(3):
            for _ in range(5):  # an episode
                dist = torch.distributions.Categorical(logits=policy(torch.randn(1, 4)))
                saved.append(dist.log_prob(dist.sample()))
            loss = -(torch.cat(saved) * torch.randn(len(saved))).sum()
            opt.zero_grad()
            try:
                loss.backward()
            except RuntimeError as exc:  # the user's loop would stop here
                assert "backward through the graph a second time" in str(exc)
                failed += 1
            opt.step()
    assert failed == 2
    (p10,) = [f for f in diagnose(iter_events(path)) if f["code"] == "P10"]
    assert "del saved_log_probs[:]" in p10["fix"], p10["fix"]


def test_a_run_stopped_by_that_backward_is_p10_alone(tmp_path: Path) -> None:
    """The same loop uncaught, as in PyTorch's example (whose ``zip(saved_log_probs, returns)``
    pairs an episode's returns with the first episode's log-probabilities): the run stops at the
    second episode's backward.  Its episode's forwards are no batches the loop skipped, as P6's
    "Batches skipped before backward" info said (QA 44b): the backward failed."""
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    saved: list[torch.Tensor] = []
    path = tmp_path / "reinforce.tscope"
    with pytest.raises(RuntimeError, match="a second time"), \
            torchscope.watch(policy, opt, server=None, record=path, mode="default"):
        for _ in range(3):
            for _ in range(5):
                dist = torch.distributions.Categorical(logits=policy(torch.randn(1, 4)))
                saved.append(dist.log_prob(dist.sample()))
            returns = torch.randn(5)  # this episode's: zip() pairs them with the first log-probs kept
            opt.zero_grad()
            torch.cat([-lp * r for lp, r in zip(saved, returns, strict=False)]).sum().backward()
            opt.step()
    assert [f["code"] for f in diagnose(iter_events(path))] == ["P10"]
