"""P1: the encoder never learns: its output is detached before the head ("to save memory").

`.detach()` (like `.data`, `.item()`/`.numpy()` round trips or a forward under `torch.no_grad()`)
cuts the autograd path: the encoder's parameters get `.grad is None` every step, silently.
The fix: keep the path differentiable (freeze on purpose with `requires_grad_(False)` instead).
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


class Net(nn.Module):
    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.fixed = fixed
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if not self.fixed:
            h = h.detach()  # "we don't need the encoder's graph, save some memory"
        return self.head(h)


def main() -> None:
    args = parse_args(__doc__)
    model = Net(args.fixed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    for _ in range(args.steps):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"encoder grad is None: {model.encoder[0].weight.grad is None}")


if __name__ == "__main__":
    main()
