"""A small real training run for the dashboard's browser tests: nested modules (so groups can
be expanded), a module with a hostile name, and an optional pause per step (live tests).

    python dashboard_train.py --server URL --record PATH --steps N [--sleep S] [--name NAME] [--autocast] [--probe]
                              [--mode MODE] [--hold S] [--clip MAX] [--backward-nan]

``--probe``: a linear probe -- ``embed`` runs under no_grad and the optimizer leaves it out, so
its parameters get no gradient by design (``not_trained``).
``--clip MAX``: ``clip_grad_norm_(model.parameters(), MAX)`` between backward and the optimizer
step, as a loop that clips does (the Gradients view's clipping note).
``--backward-nan``: the loss adds the norm of a zero vector (finite), whose gradient is not: a
NaN born in the backward, at SqrtBackward0 (P4's node).
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from torch import nn

import torchscope

HOSTILE = "<img src=x onerror=alert(1)><script>alert(2)</script>"


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Net(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(8, d)
        self.blocks = nn.ModuleList([Block(d), Block(d)])
        self.add_module(HOSTILE, nn.Linear(d, d))  # names are data: must render as text
        self.head = nn.Linear(d, 1)
        self.probe = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad() if self.probe else contextlib.nullcontext():
            h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        h = getattr(self, HOSTILE)(h)
        return self.head(h)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=None)
    ap.add_argument("--record", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--name", default="dashboard-test")
    ap.add_argument("--autocast", action="store_true", help="forward under CPU autocast (bfloat16)")
    ap.add_argument("--probe", action="store_true", help="embed frozen by the loop: no_grad, not in the optimizer")
    ap.add_argument("--mode", default="default", help="torchscope.watch's mode")
    ap.add_argument("--clip", type=float, default=None, metavar="MAX", help="clip_grad_norm_'s max_norm (default: no clipping)")
    ap.add_argument("--backward-nan", action="store_true", help="a loss term whose gradient is NaN (sqrt of 0)")
    ap.add_argument("--hold", type=float, default=0.0, help="seconds to wait after the steps (a test kills it meanwhile)")
    ap.add_argument("--schedule", action="store_true",
                    help="two param groups (the head's lr 10x) and a linear warmup over the first 4 steps (LambdaLR)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Net()
    model.probe = args.probe
    trained = [p for n, p in model.named_parameters() if not (args.probe and n.startswith("embed."))]
    if args.schedule:
        head = {id(p) for p in model.head.parameters()}
        groups = [{"params": [p for p in trained if id(p) not in head]},
                  {"params": [p for p in trained if id(p) in head], "lr": 0.1}]
        opt = torch.optim.SGD(groups, lr=0.01)
    else:
        opt = torch.optim.SGD(trained, lr=0.01)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 4)) if args.schedule else None
    w = torchscope.watch(model, opt, server=args.server, record=args.record, name=args.name, sample_every=2,
                         mode=args.mode)
    for _ in range(args.steps):
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            out = model(x)
        loss = nn.functional.mse_loss(out.float(), y)
        if args.backward_nan:
            loss = loss + (out - out).pow(2).sum().sqrt()
        loss.backward()
        if args.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        if warmup is not None:
            warmup.step()
        if args.sleep:
            time.sleep(args.sleep)
    time.sleep(args.hold)
    w.close()


if __name__ == "__main__":
    main()
