"""P13: a forward hook appends every activation to a list: memory grows every step.

The hook stores `output.detach()`: no graph, but the activation's storage stays alive in the
list forever, one more per forward.
The fix: keep only what you need (a statistic, or just the latest activation), and remove
the hook when done.
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


def main() -> None:
    args = parse_args(__doc__)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    activations: list[torch.Tensor] = []
    latest: dict[str, torch.Tensor] = {}

    def keep_all(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        activations.append(output.detach())  # every forward's activation stays alive

    def keep_latest(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        latest["relu"] = output.detach()  # replaced each forward: constant memory

    model[1].register_forward_hook(keep_latest if args.fixed else keep_all)
    for _ in range(args.steps):
        x, y = torch.randn(128, 64), torch.randn(128, 1)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"kept {len(activations)} activations")


if __name__ == "__main__":
    main()
