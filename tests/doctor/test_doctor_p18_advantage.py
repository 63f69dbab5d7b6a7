"""P18: an actor-critic's policy loss weighing the log-probabilities by an advantage whose value
is not detached (QA 43b: no rule), told on real captures -- and not for what multiplies
log-probabilities by design: a detached advantage, a learned baseline detached, an entropy
bonus, a gate's ``(1 - g)`` weight, PPO's ratio times stored advantages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import distributions, nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class _AC(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Tanh())
        self.pi, self.v, self.gate = nn.Linear(16, 3), nn.Linear(16, 1), nn.Linear(16, 1)

    def forward(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.body(s)
        return self.pi(h), self.v(h).squeeze(-1), torch.sigmoid(self.gate(h)).squeeze(-1)


def _loss(kind: str, logits: torch.Tensor, value: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    dist = distributions.Categorical(logits=logits)
    a = dist.sample()
    returns = (a == 1).float()
    critic = (returns - value).pow(2).mean() + 0 * gate.sum()
    if kind in ("attached", "detached"):
        adv = returns - value if kind == "attached" else (returns - value).detach()
        return -(dist.log_prob(a) * adv).mean() + critic
    if kind in ("normalised", "normalised_detached"):  # A2C/PPO's normalised advantage (QA 46a: missed)
        adv = returns - value if kind == "normalised" else (returns - value).detach()
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        return -(dist.log_prob(a) * adv).mean() + critic
    if kind in ("ppo_attached", "ppo_stored"):  # PPO's clipped loss, its advantage made in the update (QA 49d)
        old = dist.log_prob(a).detach()
        ratio = torch.exp(dist.log_prob(a) - old)
        adv = returns - value if kind == "ppo_attached" else (returns - value).detach()
        return -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean() + critic
    if kind in ("probs", "probs_detached"):  # Categorical(probs=softmax(...)): PyTorch's actor_critic.py (QA 49a: missed)
        pd = distributions.Categorical(probs=logits.softmax(-1))
        taken = pd.sample()
        rets = (taken == 1).float()
        adv = rets - value if kind == "probs" else (rets - value).detach()
        return -(pd.log_prob(taken) * adv).mean() + critic
    if kind in ("per_step", "per_step_item"):  # that example's loop: a time step at a time, R a 0-d return
        pd = distributions.Categorical(probs=logits.softmax(-1))
        taken = pd.sample()
        rets = (taken == 1).float()
        terms = [-pd.log_prob(taken)[t] * (rets[t] - value[t:t + 1] if kind == "per_step" else rets[t] - value[t].item())
                 for t in range(len(taken))]
        return torch.stack(terms).sum() + critic
    if kind == "log_softmax":  # the same bug written by hand
        logp = logits.log_softmax(-1).gather(1, a[:, None]).squeeze(1)
        return -(logp * (returns - value)).mean() + critic
    if kind == "entropy":
        probs = logits.softmax(-1)
        return -(dist.log_prob(a) * (returns - value.detach())).mean() + critic + (probs * logits.log_softmax(-1)).sum(-1).mean()
    if kind == "gate":  # a mixture's weight on a log-likelihood: (1 - g) is no advantage
        return -((1 - gate) * dist.log_prob(a)).mean() + critic
    # PPO: the ratio to the rollout's log-probabilities, times advantages stored with it
    old, stored = dist.log_prob(a).detach(), (returns - value).detach()
    ratio = torch.exp(dist.log_prob(a) - old)
    return -torch.min(ratio * stored, ratio.clamp(0.8, 1.2) * stored).mean() + critic


def _p18(tmp_path: Path, kind: str, mode: str = "default") -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = _AC()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / f"{kind}-{mode}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            loss = _loss(kind, *model(torch.randn(8, 4)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P18"]


@pytest.mark.parametrize(("kind", "mode"), [("attached", "default"), ("attached", "full"), ("log_softmax", "default"),
                                           ("normalised", "default"), ("normalised", "full"), ("probs", "default"),
                                           ("probs", "full"), ("per_step", "default"), ("ppo_attached", "default")])
def test_an_attached_advantage_is_p18(tmp_path: Path, kind: str, mode: str) -> None:
    (f,) = _p18(tmp_path, kind, mode)
    assert f["severity"] == "warning" and f["modules"] == ["v"] and "'v' (Linear)" in f["message"], f
    assert f["src"].startswith(Path(__file__).name + ":") and ".detach()" in f["fix"], f
    assert f["steps"] == ([0] if mode == "default" else [0, 1, 2]), f


@pytest.mark.parametrize("kind", ["detached", "normalised_detached", "entropy", "gate", "ppo", "probs_detached",
                                  "per_step_item", "ppo_stored"])
def test_log_probabilities_weighed_by_design_are_no_p18(tmp_path: Path, kind: str) -> None:
    assert _p18(tmp_path, kind) == []


def _dqn(tmp_path: Path, kind: str, mode: str = "default") -> list[dict[str, Any]]:
    """A DQN's update on a replay batch, its target as ``kind`` computes it."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    target_net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    target_net.load_state_dict(net.state_dict())
    value_head = nn.Linear(16, 1)  # (a dueling head's V, beside the network's A: its own module)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    path = tmp_path / f"dqn-{kind}-{mode}.tscope"
    with torchscope.watch(net, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            s, s2 = torch.randn(8, 4), torch.randn(8, 4)
            a, r, done = torch.randint(0, 3, (8, 1)), torch.rand(8), (torch.rand(8) < 0.2).float()
            q = net(s).gather(1, a).squeeze(1)
            if kind == "attached":  # the bug: the network's own next-state value, with its gradient
                target = r + 0.99 * net(s2).max(1).values
            elif kind == "attached_done":  # the same, masked at episode ends, under a Huber loss
                target = r + 0.99 * (1 - done) * net(s2).amax(1)
            elif kind == "double_attached":  # Double DQN with the online net, its pick not detached
                target = r + 0.99 * net(s2).gather(1, net(s2).argmax(1, keepdim=True)).squeeze(1)
            elif kind == "double_no_grad":
                with torch.no_grad():
                    target = r + 0.99 * target_net(s2).gather(1, net(s2).argmax(1, keepdim=True)).squeeze(1)
            elif kind == "dueling_attached":  # the max of V + A - mean(A) from the network itself
                h = net[1](net[0](s2))
                target = r + 0.99 * (value_head(h) + net[2](h) - net[2](h).mean(1, keepdim=True)).max(1).values
            elif kind == "no_grad":
                with torch.no_grad():
                    target = r + 0.99 * (1 - done) * net(s2).max(1).values
            elif kind == "detached":
                target = r + 0.99 * net(s2).max(1).values.detach()
            elif kind == "target_net":
                with torch.no_grad():
                    target = r + 0.99 * target_net(s2).max(1).values
            else:  # "consistency": two views of one batch pulled together (the Pi-model), no TD target
                target = net(s + 0.1 * torch.randn_like(s)).max(1).values
            loss = (nn.functional.huber_loss if kind == "attached_done" else nn.functional.mse_loss)(q, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P18"]


@pytest.mark.parametrize(("kind", "mode"), [("attached", "default"), ("attached", "full"), ("attached_done", "default"),
                                           ("double_attached", "default"), ("dueling_attached", "default")])
def test_a_td_target_left_attached_is_p18(tmp_path: Path, kind: str, mode: str) -> None:
    """``target = r + gamma * net(s2).max(1).values`` with neither ``no_grad`` nor ``.detach()``:
    the loss trains the next state's value toward this one's (QA 49a: no finding)."""
    (f,) = _dqn(tmp_path, kind, mode)
    assert f["severity"] == "warning" and f["title"] == "TD target not detached" and f["modules"] == ["2"], f
    assert "reward + gamma * max Q(s', .) from '2' (Linear)" in f["message"] and "torch.no_grad()" in f["fix"], f
    assert f["src"].startswith(Path(__file__).name + ":") and f["steps"] == ([0] if mode == "default" else [0, 1, 2]), f


@pytest.mark.parametrize("kind", ["no_grad", "detached", "target_net", "consistency", "double_no_grad"])
def test_a_constant_td_target_is_no_p18(tmp_path: Path, kind: str) -> None:
    assert _dqn(tmp_path, kind) == []


@pytest.mark.parametrize("case", ["advantage", "td"])
def test_p18_without_the_cpp_recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """The Python recorder (a first run, before any full-mode build; ``TORCHSCOPE_NATIVE=0``) saw
    each op's outputs before autograd gave them a grad_fn: its tensor table said every one
    ``requires_grad`` false, and P18, which follows the gradient through it, found nothing (QA
    49d).  Its table now says what PyTorch does, and P18 finds both mistakes."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "0")
    found = _p18(tmp_path, "attached") if case == "advantage" else _dqn(tmp_path, "attached")
    assert [f["severity"] for f in found] == ["warning"], found
    graph = next(e for e in iter_events(next(tmp_path.glob("*.tscope"))) if e["kind"] == "graph")
    assert graph["recorder"] == "python"
    tensors = {t["id"]: t for t in graph["tensors"]}
    layer_outputs = [tensors[o["outputs"][0]] for o in graph["ops"] if o["name"] == "aten::addmm"]
    # a layer's output in the forward: made by autograd's graph, requiring grad, no leaf
    assert layer_outputs and all(t["requires_grad"] and not t["is_leaf"] for t in layer_outputs), layer_outputs
