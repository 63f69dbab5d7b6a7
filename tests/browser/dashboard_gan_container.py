"""A GAN watched through a container with no forward of its own, ``watch(gan, opt_d)``, whose
loop calls ``gan.G`` and ``gan.D`` directly (the dashboard QA of the forty-eighth session): the
capture learns of those calls on the first step, so it records no op there, and each later
step holds four forward calls (the generator's update through the discriminator, then the
generator and the discriminator on real and on detached fakes) and two backward passes.

    python dashboard_gan_container.py --record PATH [--steps N] [--mode MODE]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import torchscope


class GAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
        self.D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--mode", default="default")
    args = ap.parse_args()
    torch.manual_seed(0)
    gan = GAN()
    opt_g, opt_d = torch.optim.Adam(gan.G.parameters(), lr=2e-4), torch.optim.Adam(gan.D.parameters(), lr=2e-4)
    bce = nn.functional.binary_cross_entropy_with_logits
    with torchscope.watch(gan, opt_d, server=None, record=args.record, mode=args.mode, sample_every=1):
        for _ in range(args.steps):
            fake = gan.G(torch.randn(16, 8))
            d_loss = bce(gan.D(torch.randn(16, 2) + 2), torch.ones(16, 1)) + bce(gan.D(fake.detach()), torch.zeros(16, 1))
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            g_loss = bce(gan.D(fake), torch.ones(16, 1))
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()


if __name__ == "__main__":
    main()
