"""P5: zero_grad() is missing: gradients of every step pile up on top of the previous ones.

PyTorch accumulates into `.grad`; without `optimizer.zero_grad()` step N uses the sum of the
gradients of steps 0..N, so updates grow and training drifts.
The fix: `optimizer.zero_grad()` once per step, before backward.
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


def main() -> None:
    args = parse_args(__doc__)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    for _ in range(args.steps):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        if args.fixed:
            optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
