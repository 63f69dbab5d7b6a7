"""An actor-critic with an optimizer each, the critic's value loss backpropagated after the
actor's ``optimizer.step()`` (the watched one) ended the step: that backward goes through the
forward of the step before, its graph retained.  The capture took it for a backward of a model
called past its hooks -- it told the user "a backward through AC's parameters came without a call
of the model itself (model.forward(x) or its submodules called directly ...)" and switched to
recording the submodules' calls as forwards.  It is the earlier forward's graph: nothing to
tell, and every step keeps its one forward and its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


class _AC(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
        self.critic = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor(x), self.critic(x).squeeze(-1)


def _train(path: Path | None, mode: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = _AC()
    actor_opt = torch.optim.Adam(model.actor.parameters(), lr=1e-2)
    critic_opt = torch.optim.Adam(model.critic.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses = []
    w = torchscope.watch(model, actor_opt, server=None, record=path, mode=mode) if path is not None else None
    for _ in range(8):
        x, returns = torch.randn(16, 4, generator=g), torch.randn(16, generator=g)
        logits, value = model(x)
        dist = torch.distributions.Categorical(logits=logits)
        action = torch.multinomial(logits.softmax(-1).detach(), 1, generator=g).squeeze(-1)
        advantage = returns - value
        actor_opt.zero_grad()
        policy_loss = -(dist.log_prob(action) * advantage.detach()).mean()
        policy_loss.backward(retain_graph=True)
        actor_opt.step()
        critic_opt.zero_grad()
        value_loss = advantage.pow(2).mean()
        value_loss.backward()
        critic_opt.step()
        losses.append(policy_loss.item())
    if w is not None:
        w.close()
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_backward_through_the_step_before_is_no_call_past_the_hooks(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "ac.tscope"
    plain_losses, plain_state = _train(None, mode)
    losses, state = _train(path, mode)
    assert losses == plain_losses
    for k, v in plain_state.items():
        assert torch.equal(state[k], v), k
    events = list(iter_events(path))
    logs = [e["message"] for e in events if e["kind"] == "log"]
    assert not [m for m in logs if "without a call of the model" in m], logs
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 8
    assert all(len(st["forwards"]) == 1 and st["forwards"][0]["backward"] for st in steps)
    # each step: the critic's value loss of the step before (none at step 0), then the policy loss
    assert [st["micro_batches"] for st in steps] == [1] + [2] * 7


def test_a_call_past_the_hooks_beside_a_retained_graph_is_still_told(tmp_path: Path) -> None:
    """A loss made by ``model.forward(x)`` (no hook runs) plus a term of the step before's
    retained output: the backward reaches the parameters through the direct call too, which the
    capture tells and from then on records by the submodules' calls (QA 47c: the retained output
    alone was taken for the whole backward, the direct call never told)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "direct.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for i in range(6):
            x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
            if i % 2 == 0:
                out = model(x)  # kept: the next step's loss adds a term of it
                loss = nn.functional.cross_entropy(out, y)
            else:
                loss = nn.functional.cross_entropy(model.forward(x), y) + 0.0 * out.sum()
            opt.zero_grad()
            loss.backward(retain_graph=True)
            opt.step()
    logs = [e["message"] for e in iter_events(path) if e["kind"] == "log"]
    assert [m for m in logs if "came without a call of the model itself" in m], logs
