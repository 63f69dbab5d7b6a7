"""P6: validation without torch.no_grad(): every evaluation builds a graph nobody uses.

`model.eval()` changes dropout/batch-norm behaviour, not autograd: the validation forward
still records a graph and keeps its activations until the output is dropped.
The fix: `with torch.no_grad():` (or `torch.inference_mode()`) around evaluation.
"""

import contextlib

import torch
from _common import parse_args
from torch import nn

import torchscope


def main() -> None:
    args = parse_args(__doc__)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    x_val, y_val = torch.randn(128, 16), torch.randn(128, 1)
    for step in range(args.steps):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 2 == 0:  # validate every other step
            model.eval()
            with torch.no_grad() if args.fixed else contextlib.nullcontext():
                val_loss = nn.functional.mse_loss(model(x_val), y_val)
            model.train()
            print(f"step {step} val {val_loss.item():.4f}")


if __name__ == "__main__":
    main()
