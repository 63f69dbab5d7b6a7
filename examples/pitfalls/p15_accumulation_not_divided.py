"""P15: gradient accumulation over 4 micro-batches without dividing the loss by 4.

Each backward adds its gradient to `.grad`; with a mean loss per micro-batch the sum of 4 is
4x the gradient of the large batch it stands for, so the effective learning rate is 4x.
The fix: `(loss / accum_steps).backward()`.
"""

import torch
from _common import parse_args
from torch import nn

import torchscope

ACCUM_STEPS = 4


def main() -> None:
    args = parse_args(__doc__)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    for i in range(args.steps * ACCUM_STEPS):
        x, y = torch.randn(8, 16), torch.randn(8, 1)
        loss = nn.functional.mse_loss(model(x), y)
        if args.fixed:
            loss = loss / ACCUM_STEPS
        loss.backward()
        if (i + 1) % ACCUM_STEPS == 0:
            optimizer.step()
            optimizer.zero_grad()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
