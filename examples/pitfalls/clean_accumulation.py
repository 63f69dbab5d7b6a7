"""Clean: gradient accumulation done right, with validation done right. The doctor must stay silent.

zero_grad after each optimizer step, each micro-batch loss divided by the accumulation count,
validation in eval mode under no_grad and back to train mode, gradient clipping.
"""

import torch
from _common import parse_args
from torch import nn

import torchscope

ACCUM_STEPS = 4


def main() -> None:
    args = parse_args(__doc__)
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    x_val, y_val = torch.randn(64, 16), torch.randn(64, 1)
    running = 0.0
    optimizer.zero_grad()
    for i in range(args.steps * ACCUM_STEPS):
        model.train()
        x, y = torch.randn(16, 16), torch.randn(16, 1)
        loss = nn.functional.mse_loss(model(x), y) / ACCUM_STEPS
        loss.backward()
        running += loss.item()
        if (i + 1) % ACCUM_STEPS == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            model.eval()
            with torch.no_grad():
                val = nn.functional.mse_loss(model(x_val), y_val).item()
            print(f"step {(i + 1) // ACCUM_STEPS} train {running:.4f} val {val:.4f}")
            running = 0.0


if __name__ == "__main__":
    main()
