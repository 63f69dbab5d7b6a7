"""A real training run whose gradients w.r.t. each module's output (the capture's
``StepEvent.activation_grads``) have a known shape, for the activation-gradient panel's tests.

    python dashboard_train_actgrads.py --record PATH [--server URL] [--mode full|default|light] [--steps N]

- ``layers``: six ``nn.Linear`` with their weights scaled down, so the gradient shrinks by
  about twenty times through each on its way back: tiny at ``layers.0``, large at ``layers.5``;
- ``shared``: one ``nn.Linear`` called twice (its row gathers two calls: ``calls`` 2);
- ``dead``: a ``nn.Linear`` whose bias is -100, so the ``nn.ReLU`` after it (``relu``) never
  passes anything: the gradient reaching ``dead``'s output is all zeros (zero_frac 1), while
  the residual ``x + relu(dead(x))`` keeps the rest of the model trained;
- ``head``: the last layer, its output scaled up by 1000 (a large gradient reaching it).

``--poison-last``: the last step takes ``sqrt`` of ``relu``'s output (all zeros): its gradient
there is 1/(2 sqrt(0)), infinite, so the gradient reaching ``relu``'s output is Inf on that step,
while the ReLU's backward still passes zeros to ``dead`` and nothing else changes.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import torchscope


class DeepMLP(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(8, d)
        linears = [nn.Linear(d, d) for _ in range(6)]
        self.layers = nn.Sequential(*linears)
        self.shared = nn.Linear(d, d)
        self.dead = nn.Linear(d, d)
        self.relu = nn.ReLU()
        self.head = nn.Linear(d, 1)
        self.poison = False
        with torch.no_grad():
            for layer in linears:
                layer.weight.mul_(0.1)
            self.dead.weight.mul_(0.01)
            self.dead.bias.fill_(-100.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.inp(x))
        x = self.shared(self.shared(x))
        y = self.relu(self.dead(x))
        x = x + (torch.sqrt(y) if self.poison else y)
        return self.head(x) * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=None)
    ap.add_argument("--record", required=True)
    ap.add_argument("--mode", default="full")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--name", default=None)
    ap.add_argument("--poison-last", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DeepMLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-9)
    server = None if args.server in (None, "none") else args.server
    w = torchscope.watch(model, opt, server=server, record=args.record, name=args.name or f"actgrads-{args.mode}",
                         mode=args.mode)
    for step in range(args.steps):
        model.poison = args.poison_last and step == args.steps - 1
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    w.close()


if __name__ == "__main__":
    main()
