"""P4: NaN: a hand-written normalisation without eps meets an all-zero (padding) row.

`(x - mean) / std` is 0/0 = NaN for a constant row; the NaN spreads to the loss and every
gradient, and the weights become NaN after the first step.
The fix: add an eps to the denominator (or use nn.LayerNorm, which does).
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


class RowNorm(nn.Module):
    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.eps = 1e-5 if fixed else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + self.eps)


def main() -> None:
    args = parse_args(__doc__)
    model = nn.Sequential(RowNorm(args.fixed), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    for _ in range(args.steps):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        x[-1] = 0.0  # a padding row: constant, so its std is 0
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item()}")


if __name__ == "__main__":
    main()
