"""P11: model.eval() for validation, and model.train() forgotten afterwards.

From the first validation on, training runs in eval mode: dropout is off and batch-norm uses
(and no longer updates) its running statistics: the model trains differently than intended.
The fix: call model.train() after evaluating (best: at the top of every training step).
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


def main() -> None:
    args = parse_args(__doc__)
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    x_val, y_val = torch.randn(64, 16), torch.randn(64, 1)
    for step in range(args.steps):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if step == 1:  # validate once early on
            model.eval()
            with torch.no_grad():
                val = nn.functional.mse_loss(model(x_val), y_val)
            print(f"val loss {val.item():.4f}")
            if args.fixed:
                model.train()


if __name__ == "__main__":
    main()
