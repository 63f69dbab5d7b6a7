"""P3: vanishing gradients: a deep stack of sigmoid layers; the first layers barely learn.

Each sigmoid scales the gradient by at most 0.25 on the way back, so after a dozen layers the
first layer's gradient is orders of magnitude smaller than the last's.
The fix: ReLU/GELU with kaiming init, normalisation or residual connections.
"""

import torch
from _common import parse_args
from torch import nn

import torchscope

DEPTH = 12


def build(fixed: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        lin = nn.Linear(32, 32)
        if fixed:
            nn.init.kaiming_normal_(lin.weight, nonlinearity="relu")
            nn.init.zeros_(lin.bias)
        layers += [lin, nn.ReLU() if fixed else nn.Sigmoid()]
    return nn.Sequential(*layers, nn.Linear(32, 1))


def main() -> None:
    args = parse_args(__doc__)
    model = build(args.fixed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    for _ in range(args.steps):
        x, y = torch.randn(32, 32), torch.randn(32, 1)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    weights = [p.grad for p in model.parameters() if p.dim() == 2 and p.grad is not None]
    print(f"first layer grad {weights[0].norm().item():.3g}, last layer grad {weights[-1].norm().item():.3g}")


if __name__ == "__main__":
    main()
