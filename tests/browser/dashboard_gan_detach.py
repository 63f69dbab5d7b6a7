"""A GAN whose generator loss is made from ``D(fake.detach())``, watched as ``watch(G, optG)``:
no backward reaches the generator, so no step has a graph (the dashboard QA of the forty-fourth
session).

    python dashboard_gan_detach.py --record PATH [--steps N] [--mode MODE]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import torchscope


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--mode", default="default")
    args = ap.parse_args()
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))  # noqa: N806 - a GAN's names
    D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))  # noqa: N806
    opt_g, opt_d = torch.optim.Adam(G.parameters(), lr=1e-3), torch.optim.Adam(D.parameters(), lr=1e-3)
    crit = nn.BCEWithLogitsLoss()
    with torchscope.watch(G, opt_g, server=None, record=args.record, mode=args.mode):
        for _ in range(args.steps):
            fake = G(torch.randn(16, 8))
            opt_d.zero_grad()
            (crit(D(torch.randn(16, 2) + 2), torch.ones(16, 1)) + crit(D(fake.detach()), torch.zeros(16, 1))).backward()
            opt_d.step()
            opt_g.zero_grad()
            crit(D(fake.detach()), torch.ones(16, 1)).backward()  # the slip: D(fake)
            opt_g.step()


if __name__ == "__main__":
    main()
