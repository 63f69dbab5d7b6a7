"""Real training runs for the dashboard QA tests of the eighteenth session.

    python dashboard_train_shapes.py --server URL --record PATH --model residual|long [--steps N] [--mode MODE]

``residual``: eight ``x = x + layer(x)`` blocks in an ``nn.ModuleList`` (the blocks are linked
only through the parent's adds), then three parallel branches in another ``ModuleList`` whose
outputs are summed (truly side by side), then a head.
``long``: twelve ``nn.Linear`` in an ``nn.Sequential`` trained for many steps (a heat map wider
than the window).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import torchscope


class Residual(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(d, d), nn.ReLU()) for _ in range(8))
        self.branches = nn.ModuleList(nn.Linear(d, d) for _ in range(3))
        self.head = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        x = sum((b(x) for b in self.branches), torch.zeros_like(x))
        return self.head(x)


class Long(nn.Module):
    """Twelve layers under a module path too long for the heat map's name column: the names
    must be cut in the middle, keeping the ``.0`` … ``.11`` that tells the rows apart."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder_stack_with_an_extremely_long_attribute_name = nn.Sequential(*[nn.Linear(16, 16) for _ in range(12)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder_stack_with_an_extremely_long_attribute_name(x)


def build(name: str) -> tuple[nn.Module, int]:
    """The model and its input width."""
    if name == "residual":
        return Residual(), 32
    return Long(), 16


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=None)
    ap.add_argument("--record", required=True)
    ap.add_argument("--model", choices=["residual", "long"], required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--mode", default="default", help="torchscope.watch's mode; the session is named <model>-<mode> unless default")
    ap.add_argument("--spike", type=int, default=-1, help="a step whose loss is 1e6 times larger (not applied: lr 0)")
    ap.add_argument("--name", default=None, help="the session's name (default: from --model and --mode)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, d = build(args.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # a long run captures few graphs: the heat map needs every step's gradient norms only
    name = args.name or (args.model if args.mode == "default" else f"{args.model}-{args.mode}")
    w = torchscope.watch(model, opt, server=args.server, record=args.record, name=name, mode=args.mode,
                         sample_every=1 if args.model == "residual" else 100)
    for step in range(args.steps):
        opt.zero_grad()
        (model(torch.randn(4, d)).pow(2).mean() * (1e6 if step == args.spike else 1.0)).backward()
        opt.param_groups[0]["lr"] = 0.0 if step == args.spike else 0.01
        opt.step()
    w.close()


if __name__ == "__main__":
    main()
