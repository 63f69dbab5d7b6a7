"""A small MLP for the QA 37b browser tests, and what plain PyTorch says it saves for backward.

    python dashboard_train_qa37.py --record PATH --ref REF.json [--steps N] [--mode MODE] [--name NAME]

``inp`` (an ``nn.Linear`` not in a Sequential), ``net`` (an ``nn.Sequential`` of Linear / ReLU:
a ReLU's output is saved by its ReluBackward0 and by the next AddmmBackward0, and each
AddmmBackward0 saves ``weight.t()``, a view of a parameter) and ``shrink`` (scales by 1e-3, so
the gradient reaching the modules before it is a thousandth of the one after it: the
activation-gradient table spans 1e-5 to 1e-1).  Adam: the gradients' bytes equal the
parameters' at every step boundary.

Before watching, one forward of the same model under ``torch.autograd.graph.saved_tensors_hooks``
with the module that ran each save (forward hooks) writes the reference to ``--ref``: per module
path, the bytes of each distinct storage saved for backward in it, parameters and buffers left
out (the shapes are the same at every step, so the figures are too).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from torch import nn

import torchscope


class Shrink(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # a tensor, not a Python number: ``x * 1e-3`` saves the number as a wrapped 0-dim
        # float64 tensor, which saved_tensors_hooks never see (the reference would miss 8 B)
        self.scale = torch.tensor(1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(20, 32)
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
        self.shrink = Shrink()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shrink(self.net(self.inp(x)))


def reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, dict[str, int]]:
    """Module path ("" outside the model) -> {storage pointer: bytes} of what autograd saved
    there, parameters and buffers left out."""
    not_acts = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    stack: list[str] = []
    handles = []
    def enter(name: str) -> Any:
        return lambda _m, _a: stack.append(name)

    def leave(_m: nn.Module, _a: Any, _o: Any) -> None:
        stack.pop()

    for name, m in model.named_modules():
        handles.append(m.register_forward_pre_hook(enter(name)))
        handles.append(m.register_forward_hook(leave))
    saved: dict[str, dict[str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in not_acts:
            saved.setdefault(stack[-1] if stack else "", {})[str(s.data_ptr())] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = nn.functional.cross_entropy(model(x), y)
    del loss
    for h in handles:
        h.remove()
    return saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=None)
    ap.add_argument("--record", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--mode", default="full")
    ap.add_argument("--name", default="qa37")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 20), torch.randint(0, 5, (32,))
    with open(args.ref, "w") as f:
        json.dump(reference(model, x, y), f)
    w = torchscope.watch(model, opt, server=args.server, record=args.record, name=args.name, mode=args.mode)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    w.close()


if __name__ == "__main__":
    main()
