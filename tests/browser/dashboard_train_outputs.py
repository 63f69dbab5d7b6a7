"""A real training run whose module outputs (the capture's ``StepEvent.activations``) have a
known shape, for the dashboard's table of each module's output beside the gradient reaching it.

    python dashboard_train_outputs.py --record PATH --ref REF.json [--mode full|default] [--steps N]

- ``frozen``: the first ``nn.Linear``, its parameters frozen (``requires_grad_(False)``) and its
  input a plain tensor: its output needs no gradient, so it has output values and no gradient;
- ``dead``: a ``nn.Linear`` whose bias is -100, so the ``nn.ReLU`` after it (``relu``) never
  fires: ``relu``'s output is all zeros (dead forward) and the gradient reaching ``dead``'s
  output is all zeros (dead backward), while the residual ``x + relu(dead(x))`` keeps the rest
  of the model trained;
- ``wide`` -> ``tanh``: weights scaled up 100 times, so the ``nn.Tanh`` sits at -1 / +1
  (saturated: its mean slope 1 - y² is near 0);
- ``big`` -> ``sig``: a bias of +8 into an ``nn.Sigmoid``: every output near 1 (saturated: its
  slope s (1 - s) about 3e-4, the gradient through it cut ~700 times);
- ``calm``: an ``nn.Tanh`` of small inputs (not saturated), called twice (its row gathers two calls).

Before watching, the same forward of the model on the batch of step ``--ref-step`` (the
learning rate is 0, so the parameters never change) with ``register_forward_hook`` on every
module writes the reference to ``--ref``: per module, its output's norm, rms, min, max, share of
zeros and element count (every call together), and for a Tanh / Sigmoid its mean slope.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import torch
from torch import nn

import torchscope


class OutputsMLP(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.frozen = nn.Linear(8, d)
        self.inp = nn.Linear(d, d)
        self.dead = nn.Linear(d, d)
        self.relu = nn.ReLU()
        self.wide = nn.Linear(d, d)
        self.tanh = nn.Tanh()
        self.big = nn.Linear(d, d)
        self.sig = nn.Sigmoid()
        self.calm = nn.Tanh()
        self.head = nn.Linear(3 * d, 1)
        self.frozen.requires_grad_(False)
        with torch.no_grad():
            self.dead.weight.mul_(0.01)
            self.dead.bias.fill_(-100.0)
            self.wide.weight.mul_(100.0)
            self.big.bias.fill_(8.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(self.frozen(x))
        x = x + self.relu(self.dead(x))
        t = self.tanh(self.wide(x))
        s = self.sig(self.big(x))
        c = self.calm(self.calm(0.01 * x))
        return self.head(torch.cat([t, s, c], dim=1))


class TinyLM(nn.Module):
    """``--model transformer``: a six-layer pre-norm transformer language model (59 modules
    with outputs: a long table)."""

    def __init__(self, vocab: int = 64, d: int = 32, ctx: int = 16) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.tok(idx), mask=self.mask, is_causal=True)
        return self.head(self.norm(h)).logsumexp(-1)


def reference(model: nn.Module, x: torch.Tensor) -> dict[str, dict[str, Any]]:
    """Each module's output on ``x`` (every call together), read by plain forward hooks."""
    outs: dict[str, list[torch.Tensor]] = {}

    def keep(name: str) -> Any:
        def hook(_m: nn.Module, _a: Any, out: torch.Tensor) -> None:
            outs.setdefault(name, []).append(out.detach().double().flatten())

        return hook

    handles = [m.register_forward_hook(keep(name)) for name, m in model.named_modules()]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hd in handles:
            hd.remove()
    ref: dict[str, dict[str, Any]] = {}
    for name, parts in outs.items():
        v = torch.cat(parts)
        norm = float(torch.linalg.vector_norm(v))
        row = {"norm": norm, "rms": norm / math.sqrt(v.numel()), "min": float(v.min()), "max": float(v.max()),
               "zero_frac": float((v == 0).double().mean()), "numel": v.numel(), "calls": len(parts)}
        m = model.get_submodule(name)
        if isinstance(m, nn.Tanh):
            row["slope"] = float((1 - v * v).mean())  # tanh'(x) = 1 - tanh(x)²
        elif isinstance(m, nn.Sigmoid):
            row["slope"] = float((v * (1 - v)).mean())  # sigmoid'(x) = s (1 - s)
        ref[name] = row
    return ref


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    ap.add_argument("--server", default=None)
    ap.add_argument("--ref", default=None)
    ap.add_argument("--ref-step", type=int, default=1)
    ap.add_argument("--mode", default="full")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--name", default=None)
    ap.add_argument("--model", default="mlp", choices=["mlp", "transformer"])
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model: nn.Module = OutputsMLP() if args.model == "mlp" else TinyLM()
    batches = [torch.randn(4, 8) if args.model == "mlp" else torch.randint(0, 64, (2, 16)) for _ in range(args.steps)]
    if args.ref:
        with open(args.ref, "w") as f:
            json.dump(reference(model, batches[args.ref_step]), f)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    server = None if args.server in (None, "none") else args.server
    w = torchscope.watch(model, opt, server=server, record=args.record, name=args.name or f"outputs-{args.mode}", mode=args.mode)
    for x in batches:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    w.close()


if __name__ == "__main__":
    main()
