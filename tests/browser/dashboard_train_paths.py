"""A small real training run for test_dashboard_graph_paths_full.py: a Conv2d 3 -> 16, 3x3 (448
parameters in two tensors), a two-layer ``nn.TransformerEncoder`` (``self_attn`` a
MultiheadAttention with its own ``out_proj``: module paths that share all but their last
names) and a forward op whose output feeds nothing (a statistic kept aside, never in the loss).

    python dashboard_train_paths.py --record PATH [--server URL] [--mode MODE] [--steps N] [--accum K] [--facts JSON]

``--accum K``: gradient accumulation, K micro-batches a step (one loss op each).
``--facts JSON``: the model as PyTorch sees it, written for the test to check the dashboard
against: each parameter's name, shape and ``numel()``, each module's path and type.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn

import torchscope


class Net(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        layer = nn.TransformerEncoderLayer(d, 2, 2 * d, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 10)
        self.kept: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)  # [B, 16, 4, 4]
        tokens = h.flatten(2).transpose(1, 2)  # [B, 16 tokens, 16 channels]
        self.kept = tokens.abs().amax()  # computed from the forward, read by nothing in the loss
        return self.head(self.blocks(tokens).mean(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=None)
    ap.add_argument("--record", required=True)
    ap.add_argument("--mode", default="full")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--name", default=None)
    ap.add_argument("--facts", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.facts:
        with open(args.facts, "w") as f:
            json.dump({"params": [{"name": n, "shape": list(p.shape), "numel": p.numel()} for n, p in model.named_parameters()],
                       "modules": {n: type(m).__name__ for n, m in model.named_modules()}}, f)
    name = args.name or f"paths-{args.mode}" + (f"-accum{args.accum}" if args.accum > 1 else "")
    w = torchscope.watch(model, opt, server=args.server, record=args.record, name=name, mode=args.mode)
    for _ in range(args.steps):
        opt.zero_grad()
        for _ in range(args.accum):
            x, y = torch.randn(2, 3, 4, 4), torch.randint(0, 10, (2,))
            loss = nn.functional.cross_entropy(model(x), y) / args.accum
            loss.backward()
        opt.step()
    w.close()


if __name__ == "__main__":
    main()
