"""P12: redundant device copies every step: the model and the whole dataset are moved each step.

The loop calls `model.to(device)` "to be sure", converts the whole float64 dataset to a
float32 tensor on the device every step, and only then picks the batch. On a GPU each of
these is a host->device copy; on a CPU (this example's default) `.to(device)` returns the
same tensor and only the dtype conversion really copies: what torchscope can show here is
that the same source tensor is converted again every step, and the bytes it costs.
The fix: move the model and convert the data once, before the loop.
"""

import numpy as np
import torch
from _common import parse_args
from torch import nn

import torchscope


def main() -> None:
    args = parse_args(__doc__)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    rng = np.random.default_rng(0)
    # The dataset, loaded once as float64 (what numpy/pandas hand over).
    features = torch.from_numpy(rng.standard_normal((2048, 16)))
    targets = torch.from_numpy(rng.standard_normal((2048, 1)))
    if args.fixed:
        all_x, all_y = features.to(device, torch.float32), targets.to(device, torch.float32)
    for step in range(args.steps):
        rows = slice(32 * step, 32 * (step + 1))
        if args.fixed:
            x, y = all_x[rows], all_y[rows]
        else:
            model.to(device)  # "make sure the model is on the device"
            all_x = features.to(device, torch.float32)  # the whole dataset, every step
            all_y = targets.to(device, torch.float32)
            x, y = all_x[rows].to(device), all_y[rows].to(device)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
