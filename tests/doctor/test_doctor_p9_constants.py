"""P9 on real captures: a constant computed from a non-differentiable op (a sample, an argmax,
a comparison) that weighs what carries the gradient is by design -- REINFORCE's
``-(dist.log_prob(a) * reward)``, a padding mask -- and was reported as an error (exit 1)
whenever it went through ``.float()``; one added to the loss trains nothing and is reported."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import distributions, nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _findings(tmp_path: Path, loss_of: Loss, mode: str) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode, sample_every=2):
        for _ in range(4):
            x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
            opt.zero_grad()
            loss_of(model(x), y).backward()
            opt.step()
    return [dict(f) for f in diagnose(iter_events(path))]


def _reinforce(reward_of: Callable[[torch.Tensor], torch.Tensor]) -> Loss:
    def loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        dist = distributions.Categorical(logits=logits)
        a = dist.sample()
        return -(dist.log_prob(a) * reward_of(a)).mean()

    return loss


def _masked(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    mask = (y != 0).float()  # padding tokens weigh nothing
    per_token = nn.functional.cross_entropy(logits, y, reduction="none")
    return (per_token * mask).sum() / mask.sum()


CORRECT: dict[str, Loss] = {
    "reward_eq": _reinforce(lambda a: (a == 1).float()),
    "reward_float": _reinforce(lambda a: a.float()),
    "advantage": _reinforce(lambda a: (r := (a == 1).float()) - r.mean()),  # a baseline subtracted
    "masked_tokens": _masked,
    # an argmax that picks from what carries the gradient (the top logit's margin): a selector
    "pick_by_argmax": lambda out, y: nn.functional.cross_entropy(out, y)
    - 0.1 * out.gather(1, out.argmax(-1, keepdim=True)).mean(),
    # a target a step function made from data alone, inline in the loss call: no gradient to stop
    # (QA 48a: an error with exit 1, silent when the same target was rounded before the forward)
    "rounded_target": lambda out, y: nn.functional.mse_loss(out, torch.round(y.float()[:, None] * 1.7).expand(-1, 3)),
    "sign_target": lambda out, y: nn.functional.soft_margin_loss(out[:, 0], torch.sign(y.float() - 1)),
    "ranking_sign": lambda out, y: nn.functional.margin_ranking_loss(out[:, 0], out[:, 1], torch.sign(y.float() - 0.5)),
}

BINS = torch.linspace(-2.0, 2.0, 3)  # a value per class, no gradient


@pytest.mark.parametrize("mode", ["default", "full"])
@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_constant_that_weighs_the_loss_is_no_p9(name: str, mode: str, tmp_path: Path) -> None:
    found = _findings(tmp_path, CORRECT[name], mode)
    assert [f for f in found if f["code"] == "P9"] == []
    assert [f["code"] for f in found if f["severity"] == "error"] == []


BUGS: dict[str, tuple[Loss, str]] = {
    # an accuracy "regularizer": a constant added to the loss
    "accuracy_term": (lambda out, y: nn.functional.cross_entropy(out, y)
                      + 0.5 * (out.argmax(-1) != y).float().mean(), "aten::argmax"),  # fmt: skip
    # a thresholded prediction regressed: the mse term has no gradient at all
    "threshold": (lambda out, y: nn.functional.cross_entropy(out, y)
                  + nn.functional.mse_loss((out[:, 0] > 0).float(), (y == 0).float()), "aten::gt"),  # fmt: skip
    # a table looked up by the argmax (QA 38a, the seed's "loss that uses argmax"): a constant
    "lookup": (lambda out, y: nn.functional.cross_entropy(out, y)
               + nn.functional.mse_loss(BINS[out.argmax(-1)], BINS[y]), "aten::argmax"),  # fmt: skip
    # the prediction rounded, not the target: its gradient is zero everywhere
    "rounded_prediction": (lambda out, y: nn.functional.mse_loss(torch.round(out[:, 0]), y.float()), "aten::round"),
}


@pytest.mark.parametrize("mode", ["default", "full"])
@pytest.mark.parametrize("name", sorted(BUGS))
def test_a_constant_added_to_the_loss_is_p9(name: str, mode: str, tmp_path: Path) -> None:
    loss_of, op = BUGS[name]
    p9 = [f for f in _findings(tmp_path, loss_of, mode) if f["code"] == "P9"]
    assert len(p9) == 1 and p9[0]["severity"] == "error" and p9[0]["data"]["op"] == op
    assert p9[0]["src"].startswith(Path(__file__).name + ":")


@pytest.mark.parametrize("use", ["next_observation", "critic_target"])
def test_a_rollout_whose_next_observation_or_target_is_made_from_the_sample_is_no_finding(tmp_path: Path, use: str) -> None:
    """An actor-critic rollout: the environment's next state, or the critic's regression target,
    is computed from the sampled action -- data, not a path gradient should have taken."""
    torch.manual_seed(0)
    policy, critic = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)), nn.Linear(4, 1)
    model = nn.ModuleDict({"policy": policy, "critic": critic})
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / f"{use}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(4):
            s, terms = torch.randn(8, 4), []
            for _ in range(3):
                dist = distributions.Categorical(logits=policy(s))
                a = dist.sample()
                reward = (a == 1).float()
                target = reward + 0.1 * a.float() if use == "critic_target" else reward
                value = critic(s).squeeze(-1)
                terms.append(-(dist.log_prob(a) * (target - value.detach())).mean() + (value - target).pow(2).mean())
                if use == "next_observation":
                    s = s + 0.1 * (a.float() - 0.5)[:, None]
            opt.zero_grad()
            torch.stack(terms).sum().backward()
            opt.step()
    assert all(p.grad is not None for p in model.parameters())  # plain PyTorch: every parameter trains
    assert [f for f in diagnose(iter_events(path)) if f["severity"] != "info"] == []


@pytest.mark.parametrize("how", ["mask", "positions"])
def test_tokens_routed_to_experts_by_mask_or_by_positions_are_no_p9(tmp_path: Path, how: str) -> None:
    """A mixture of experts picks each expert's tokens by the gate's argmax, as a mask
    (``x[route == k]``) or as positions (``x[(route == k).nonzero()]``, ``x[order]`` sorted by
    expert): the data looked up goes through the expert's layer -- routing, by design."""

    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(8, 2)
            self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
            self.head = nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scores = self.gate(x)
            route = scores.argmax(-1)
            weight = torch.softmax(scores, -1)
            if how == "positions":  # tokens sorted by expert, each expert's run of them
                order = torch.argsort(route, stable=True)
                counts = torch.bincount(route, minlength=2).tolist()
                parts, start = [], 0
                for k, (expert, n) in enumerate(zip(self.experts, counts, strict=True)):
                    idx = order[start:start + n]
                    parts.append(expert(x[idx]) * weight[idx, k:k + 1])
                    start += n
                y = torch.zeros_like(x).index_add(0, order, torch.cat(parts))
            else:
                y = torch.zeros_like(x)
                for k, expert in enumerate(self.experts):
                    sel = route == k
                    y[sel] = expert(x[sel]) * weight[sel, k:k + 1]
            return self.head(y)

    torch.manual_seed(0)
    model = Experts()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / f"{how}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(3):
            x, target = torch.randn(16, 8), torch.randn(16, 1)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), target).backward()
            opt.step()
    assert [(f["code"], f["message"]) for f in diagnose(iter_events(path)) if f["code"] == "P9"] == []


@pytest.mark.parametrize("mode", ["default", "full"])
@pytest.mark.parametrize("pick", ["gather", "index"])
def test_a_double_dqn_target_is_no_p9(tmp_path: Path, pick: str, mode: str) -> None:
    """Double DQN's target picks the target network's value of the online network's argmax
    action, outside ``no_grad`` as in many implementations: a regression target, no gradient
    through it by design (QA 44e: P9, an error, for the lookup of a constant table)."""
    torch.manual_seed(0)
    q = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    target_net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)).requires_grad_(False)
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    path = tmp_path / "ddqn.tscope"
    with torchscope.watch(q, opt, server=None, record=path, mode=mode):
        for _ in range(4):
            s, a, r, s2 = torch.randn(8, 4), torch.randint(0, 3, (8, 1)), torch.randn(8), torch.randn(8, 4)
            q_sa = q(s).gather(1, a).squeeze(1)
            best = q(s2).argmax(1)
            values = target_net(s2)
            next_q = values.gather(1, best[:, None]).squeeze(1) if pick == "gather" else values[torch.arange(8), best]
            loss = nn.functional.smooth_l1_loss(q_sa, r + 0.99 * next_q)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert [f for f in diagnose(iter_events(path)) if f["code"] == "P9"] == []
