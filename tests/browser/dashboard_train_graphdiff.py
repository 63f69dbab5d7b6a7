"""A small MLP, as run A (nn.ReLU) or as run B, the changed model (nn.GELU and one more
nn.Linear): the two runs whose graphs the Graph view's diff sets against each other
(tests/browser/test_dashboard_graph_diff_runs.py).

    python dashboard_train_graphdiff.py --record PATH [--server URL] [--name NAME] [--changed] [--steps N]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import torchscope


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    ap.add_argument("--server", default=None)
    ap.add_argument("--name", default="graph diff")
    ap.add_argument("--changed", action="store_true", help="GELU for ReLU, and an extra Linear(32, 32)")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.changed:
        model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.Linear(32, 1))
    else:
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torchscope.watch(model, opt, server=args.server, record=args.record, name=args.name, mode="default", sample_every=2)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    for _ in range(args.steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


if __name__ == "__main__":
    main()
