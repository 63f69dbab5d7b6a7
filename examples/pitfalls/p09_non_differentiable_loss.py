"""P9: a non-differentiable op on the loss path: the "is it positive?" head is thresholded.

The second head predicts a yes/no label; the loss compares `(logit > 0).float()` with it.
A comparison has no gradient, so that head's loss contributes nothing and the head never
learns, without any error.
The fix: a differentiable surrogate: binary cross-entropy on the logit.
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.value = nn.Linear(32, 1)
        self.positive = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return self.value(h), self.positive(h)


def main() -> None:
    args = parse_args(__doc__)
    model = TwoHeads()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    for _ in range(args.steps):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        label = (y > 0).float()
        optimizer.zero_grad()
        value, logit = model(x)
        if args.fixed:
            label_loss = nn.functional.binary_cross_entropy_with_logits(logit, label)
        else:
            label_loss = nn.functional.mse_loss((logit > 0).float(), label)  # "predicted label vs label"
        loss = nn.functional.mse_loss(value, y) + label_loss
        loss.backward()
        optimizer.step()
    print(f"positive head grad: {model.positive.weight.grad}")


if __name__ == "__main__":
    main()
