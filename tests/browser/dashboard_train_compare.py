"""The same small MLP on the same data, twice, with two learning rates: the two runs the
"compare runs" page sets side by side (tests/browser/test_dashboard_compare.py).

    python dashboard_train_compare.py --record PATH [--server URL] [--name NAME] [--lr LR] [--steps N] [--sleep S]
                                      [--log NAME,...]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import torchscope


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    ap.add_argument("--server", default=None)
    ap.add_argument("--name", default="compare")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds to wait after each step (a live run)")
    ap.add_argument("--log", default="", help="comma-separated names to torchscope.log() each step: (step + 1) * lr")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    torchscope.watch(model, opt, server=args.server, record=args.record, name=args.name)
    names = [n for n in args.log.split(",") if n]
    for step in range(args.steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if names:
            torchscope.log(**{n: (step + 1) * args.lr for n in names})
        time.sleep(args.sleep)


if __name__ == "__main__":
    main()
