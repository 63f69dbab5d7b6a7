"""P2: a dead branch: the gate's ReLU never fires, so its layers get all-zero gradients.

The gate's first layer was initialised with a large negative bias ("start with the gate
closed"); every pre-activation is negative, ReLU outputs 0 and passes back 0. Its parameters
have a `.grad`, so nothing looks wrong, but it is all zeros, every step.
The fix: a bias near 0 (or LeakyReLU/GELU), so the gate can open.
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


class GatedNet(nn.Module):
    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        gate_in = nn.Linear(16, 16)
        if not fixed:
            nn.init.constant_(gate_in.bias, -20.0)  # "keep the gate closed at the start"
        self.gate = nn.Sequential(gate_in, nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.gate(x)


def main() -> None:
    args = parse_args(__doc__)
    model = GatedNet(args.fixed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    for _ in range(args.steps):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    gate_weight = next(model.gate.parameters())
    print(f"gate grad norm: {gate_weight.grad.norm().item() if gate_weight.grad is not None else None}")


if __name__ == "__main__":
    main()
