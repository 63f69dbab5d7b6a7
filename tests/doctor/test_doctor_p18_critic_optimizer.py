"""P18 when the critic has an optimizer of its own.  An A2C loop with an actor's and a critic's
optimizer, whose policy loss leaves the advantage attached, sends the policy loss's gradient
into the critic -- and the critic's ``zero_grad()`` clears it before the value loss's backward:
it never reaches an update.  P18 warned "the policy loss trains the critic too" (QA 46d); it is
an info now.  The same loss with one optimizer over both, or with the critic's ``zero_grad()``
after its step (the policy gradient summed with the value loss's and stepped), stays a warning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class _AC(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
        self.critic = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor(x), self.critic(x).squeeze(-1)


def _p18(path: Path, mode: str, loop: str) -> list[dict]:
    torch.manual_seed(0)
    model = _AC()
    actor_opt = torch.optim.Adam(model.actor.parameters(), lr=1e-3)
    critic_opt = torch.optim.Adam(model.critic.parameters(), lr=1e-3)
    both = torch.optim.Adam(model.parameters(), lr=1e-3)
    with torchscope.watch(model, both if loop == "one_optimizer" else actor_opt, server=None, record=path, mode=mode):
        for _ in range(8):
            x, returns = torch.randn(16, 4), torch.randn(16)
            logits, value = model(x)
            dist = torch.distributions.Categorical(logits=logits)
            advantage = returns - value  # not detached in the policy loss
            policy_loss = -(dist.log_prob(dist.sample()) * advantage).mean()
            value_loss = advantage.pow(2).mean()
            if loop == "one_optimizer":
                both.zero_grad()
                (policy_loss + value_loss).backward()
                both.step()
                continue
            actor_opt.zero_grad()
            policy_loss.backward(retain_graph=True)
            actor_opt.step()
            if loop == "critic_cleared_first":
                critic_opt.zero_grad()
                value_loss.backward()
                critic_opt.step()
            else:  # "critic_cleared_after": its step applies the policy loss's gradient too
                value_loss.backward()
                critic_opt.step()
                critic_opt.zero_grad()
    return [f for f in diagnose(list(iter_events(path))) if f["code"] == "P18"]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_an_advantage_gradient_the_critics_optimizer_clears_first_is_an_info(tmp_path: Path, mode: str) -> None:
    (finding,) = _p18(tmp_path / "a2c.tscope", mode, "critic_cleared_first")
    assert finding["severity"] == "info"
    assert "an optimizer of its own whose zero_grad() clears what the policy loss sends it" in finding["message"]
    assert "critic.2" in finding["modules"]


@pytest.mark.parametrize("mode", ["default", "full"])
@pytest.mark.parametrize("loop", ["one_optimizer", "critic_cleared_after"])
def test_an_advantage_gradient_that_reaches_the_critics_update_stays_a_warning(tmp_path: Path, mode: str, loop: str) -> None:
    (finding,) = _p18(tmp_path / "a2c.tscope", mode, loop)
    assert finding["severity"] == "warning"
    assert "so the policy loss trains the critic too" in finding["message"]
