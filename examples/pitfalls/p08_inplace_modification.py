"""P8: an in-place write into a tensor that backward still needs.

Batches with padding zero the padded features in place after the sigmoid; sigmoid saved its
output for backward, so backward fails ("modified by an inplace operation"). A notebook
catches the error and moves on to the next batch, so those batches silently never train.
The fix: the out-of-place form (`h = h * mask`), or clone before writing.
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


class Net(nn.Module):
    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.fixed = fixed
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, pad: int) -> torch.Tensor:
        h = torch.sigmoid(self.fc1(x))
        if pad:
            if self.fixed:
                mask = torch.ones_like(h)
                mask[:, -pad:] = 0
                h = h * mask
            else:
                h[:, -pad:] = 0  # zero the padded features, in place
        return self.fc2(h)


def main() -> None:
    args = parse_args(__doc__)
    model = Net(args.fixed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    for i in range(args.steps + args.steps // 3 + 1):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        pad = 4 if i % 3 == 2 else 0  # every third batch is padded
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x, pad), y)
        try:
            loss.backward()
        except RuntimeError as exc:
            print(f"batch {i} skipped: {exc}")
            continue
        optimizer.step()


if __name__ == "__main__":
    main()
