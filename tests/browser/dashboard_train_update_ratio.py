"""An MLP trained with AdamW whose middle layer learns 1000x faster than the rest, for the
update-to-weight ratio browser tests (test_dashboard_update_ratio.py).

    python dashboard_train_update_ratio.py --record PATH [--mode MODE] [--steps N] [--name NAME]

Three ``nn.Linear`` layers in an ``nn.Sequential`` (``0``, ``2``, ``4``, ReLUs between), two
AdamW param groups: ``2`` (weight and bias) at lr 1e-2, the others at 1e-5.  AdamW moves each
element by about the lr per step, so ``2``'s update is about 1000x the others' for weights of
the same size: its ratio |update| / |weight| stands out by two to three decades.
``mode="default"`` reads the ratio on step 0, every 10th step and the captured ones;
``mode="light"`` reads none.  The last layer's bias starts at zero (as a norm layer's does: it
has no ratio of its own, yet moves its module).  ``--truth PATH`` writes, per step, each
parameter's ‖Δw‖ and ‖w‖ before the step as plain PyTorch computes them (float64, from copies
taken around ``opt.step()``), for the tests to check the dashboard against.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn

import torchscope

SLOW_LR, FAST_LR = 1e-5, 1e-2
FAST = "2"  # the module path of the fast layer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    ap.add_argument("--mode", default="default")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--name", default="update-ratio")
    ap.add_argument("--truth", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    with torch.no_grad():
        model[4].bias.zero_()
    truth: list[dict[str, list[float]]] = []
    fast = [p for n, p in model.named_parameters() if n.startswith(FAST + ".")]
    slow = [p for n, p in model.named_parameters() if not n.startswith(FAST + ".")]
    opt = torch.optim.AdamW([{"params": slow, "lr": SLOW_LR}, {"params": fast, "lr": FAST_LR}])
    w = torchscope.watch(model, opt, server=None, record=args.record, name=args.name, mode=args.mode)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    for _ in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        before = [p.detach().double().clone() for p in model.parameters()]
        opt.step()
        with torch.no_grad():
            truth.append({"update": [(p.double() - b).norm().item() for p, b in zip(model.parameters(), before, strict=True)],
                          "before": [b.norm().item() for b in before]})
    w.close()
    if args.truth:
        with open(args.truth, "w") as f:
            json.dump(truth, f)


if __name__ == "__main__":
    main()
