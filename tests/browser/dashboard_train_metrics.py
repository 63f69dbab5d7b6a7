"""A small MLP that logs numbers of its own each step, as a W&B user does: ``acc`` and
``val_loss`` after every ``optimizer.step()``, a NaN ``val_loss`` at one step, and ``lr_x10``
only every 3rd step (a metric with gaps).  ``--many N``: N more names (``m00``...), a run with
more metrics than the view shows at once.  ``--no-log``: the same run without any log().

    python dashboard_train_metrics.py --record PATH [--server URL] [--steps N] [--sleep S]
                                      [--nan-step K] [--many N] [--no-log] [--name NAME]
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

import torchscope


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    ap.add_argument("--server", default=None)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds per step (a live test watches it grow)")
    ap.add_argument("--nan-step", type=int, default=5, help="the step whose val_loss is NaN")
    ap.add_argument("--many", type=int, default=0, help="this many more metric names")
    ap.add_argument("--no-log", action="store_true", help="no torchscope.log() at all")
    ap.add_argument("--name", default="metrics")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    first, last = nn.Linear(8, 32), nn.Linear(32, 3)
    model = nn.Sequential(first, nn.ReLU(), last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = torchscope.watch(model, opt, server=args.server, record=args.record, name=args.name)
    xv, yv = torch.randn(32, 8), torch.randint(0, 3, (32,))
    for step in range(args.steps):
        x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
        opt.zero_grad()
        out = model(x)
        nn.functional.cross_entropy(out, y).backward()
        opt.step()
        if not args.no_log:
            with torch.no_grad():
                acc = (out.argmax(1) == y).float().mean().item()
                # the validation loss from the weights, not by calling the model: a forward of the
                # watched model here opens the next step, and log() would count it there
                hidden = nn.functional.relu(nn.functional.linear(xv, first.weight, first.bias))
                val = nn.functional.cross_entropy(nn.functional.linear(hidden, last.weight, last.bias), yv)
            torchscope.log(acc=acc, val_loss=math.nan if step == args.nan_step else val)
            if step % 3 == 0:
                torchscope.log(lr_x10=10 * opt.param_groups[0]["lr"] * (1 + step))
            if args.many:
                torchscope.log(**{f"m{k:02d}": k + step / 100 for k in range(args.many)})
        if args.sleep:
            time.sleep(args.sleep)
    w.close()


if __name__ == "__main__":
    main()
