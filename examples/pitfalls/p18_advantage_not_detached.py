"""P18: an actor-critic whose policy loss keeps the critic's gradient in its advantage.

A2C on a two-armed bandit: the policy and value heads share a body; the policy loss weighs the
sampled actions' log-probabilities by the advantage `returns - value`. Without `.detach()` the
policy loss also trains the value head, with gradient log π(a|s) < 0 -- every step pushes the
value up, whatever the returns say. The fix: `advantage = (returns - value).detach()`.
"""

import torch
from _common import parse_args
from torch import distributions, nn

import torchscope


class ActorCritic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 32), nn.Tanh())
        self.policy = nn.Linear(32, 2)
        self.value = nn.Linear(32, 1)

    def forward(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(state)
        return self.policy(h), self.value(h).squeeze(-1)


def main() -> None:
    args = parse_args(__doc__)
    model = ActorCritic()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    for _ in range(args.steps):
        state = torch.randn(32, 4)
        logits, value = model(state)
        dist = distributions.Categorical(logits=logits)
        action = dist.sample()
        returns = (action == (state[:, 0] > 0).long()).float()  # arm 1 pays when the first feature is positive
        advantage = returns - value
        if args.fixed:
            advantage = advantage.detach()
        policy_loss = -(dist.log_prob(action) * advantage).mean()
        value_loss = (returns - value).pow(2).mean()
        loss = policy_loss + 0.5 * value_loss - 0.01 * dist.entropy().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.4f}, mean value {value.mean().item():.3f}")


if __name__ == "__main__":
    main()
