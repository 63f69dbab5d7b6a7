"""P7: `total_loss += loss` keeps every step's autograd graph alive.

`loss` is a tensor with a grad_fn; adding it to a running total builds a chain of graphs
across steps, and nothing of them can be freed until the total is dropped.
The fix: accumulate a number: `total_loss += loss.item()`.
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


def main() -> None:
    args = parse_args(__doc__)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    total_loss: float | torch.Tensor = 0.0
    for _ in range(args.steps):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        total_loss += loss.item() if args.fixed else loss  # the tensor keeps its graph alive
    print(f"mean loss {float(total_loss) / args.steps:.4f}")


if __name__ == "__main__":
    main()
