"""A small MLP whose data loading takes a while (a sleep per batch, as a slow loader or disk
does): where its step time goes is in "the rest", not in forward or backward.

    python dashboard_train_steptime.py --record PATH [--steps N] [--load-ms MS]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

import torch
from torch import nn

import torchscope


def batches(n: int, load_s: float) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for _ in range(n):
        time.sleep(load_s)  # the loader: reading and decoding a batch
        yield torch.randn(16, 8), torch.randn(16, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--load-ms", type=float, default=40.0)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torchscope.watch(model, opt, server=None, record=args.record, name="slow loader")
    for x, y in batches(args.steps, args.load_ms / 1000):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


if __name__ == "__main__":
    main()
