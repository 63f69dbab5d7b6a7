"""A small real training run that blows up, for the charts' outlier tests: a ReLU MLP learns a
teacher network's outputs with Adam (the loss falls to about 0.02); at step ``--spike`` one
batch comes corrupted (its inputs times 1e14, as a broken record in a data set would) and the
learning rate is raised tenfold.  The loss of that step is huge but finite (about 5e27); the
update it makes fills Adam's second moments with its gradients' squares and pushes the weights
off their fit, so the loss never recovers: it stays 30-50 times what it was before (about
0.8).  With ``--nan`` the corrupted inputs are times 1e30: the loss overflows to Inf, the
weights become NaN, and every later loss is NaN.

    python dashboard_train_spike.py --record PATH [--server URL] [--name NAME] [--steps N] [--spike K] [--nan]

Prints the losses it got, one JSON line: {"losses": [...]} (what the tests check the charts
against).
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn

import torchscope


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=None)
    ap.add_argument("--record", required=True)
    ap.add_argument("--name", default="spike")
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--spike", type=int, default=80, help="the step whose batch is corrupted (and the lr raised)")
    ap.add_argument("--nan", action="store_true", help="corrupt it so far that the loss overflows and turns NaN")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    teacher = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    data = torch.randn(512, 8)
    with torch.no_grad():
        target = teacher(data)
        target = (target - target.mean()) / target.std()
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    w = torchscope.watch(model, opt, server=args.server, record=args.record, name=args.name, mode="light")
    losses = []
    for s in range(args.steps):
        idx = torch.arange(s * 32, s * 32 + 32) % len(data)
        x, y = data[idx], target[idx]
        if s == args.spike:
            x = x * (1e30 if args.nan else 1e14)
            for g in opt.param_groups:
                g["lr"] = 0.2
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    w.close()
    print(json.dumps({"losses": losses}))


if __name__ == "__main__":
    main()
