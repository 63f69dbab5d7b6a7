"""A small MLP whose step runs the same ops several times (four nn.Linear: four aten::addmm,
three ReLUs) and a few once (the loss): the Graph view's "Top ops" table of a captured step.

    python dashboard_train_topops.py --record PATH [--steps N] [--mode default|full]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import torchscope


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--mode", default="default")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torchscope.watch(model, opt, server=None, record=args.record, name="top ops mlp", mode=args.mode, sample_every=2)
    for _ in range(args.steps):
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


if __name__ == "__main__":
    main()
