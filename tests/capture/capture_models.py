"""Small models covering the graph shapes the capture must get right (shared by tests/capture)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Square(torch.autograd.Function):
    """A custom autograd.Function: its node appears as SquareBackward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * g


class Zoo(nn.Module):
    """Branches, a shared (tied) parameter, a custom Function, in-place ops, views, detach,
    a no_grad island and dropout — in one forward."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.left = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.right = nn.Linear(16, 16)
        self.shared = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.2)
        self.unused = nn.Linear(16, 16)  # no gradient: its output is detached
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        a = self.left(h)
        b = self.right(h).relu_()  # in-place
        c = self.shared(self.shared(a + b))  # shared parameters used twice
        v = c.view(-1, 4, 4).transpose(1, 2).reshape(c.shape[0], 16)  # views
        with torch.no_grad():
            scale = v.abs().mean() + 1.0  # no_grad island
        d = Square.apply(v / scale)
        e = self.unused(h).detach()
        return self.out(self.drop(d) + e)


class Looped(nn.Module):
    """Applies one layer a caller-chosen number of times: the graph changes with n."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)
        self.n = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.n):
            x = torch.tanh(self.cell(x))
        return self.head(x)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv1(x)))
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 50, d: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(x)))


def make(kind: str) -> tuple[nn.Module, Any]:
    """(model, batch_fn(step) -> (x, y)) with fixed seeds."""
    torch.manual_seed(0)
    if kind == "zoo":
        return Zoo(), lambda i: (torch.randn(6, 8), torch.randint(0, 3, (6,)))
    if kind == "cnn":
        return SmallCNN(), lambda i: (torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,)))
    if kind == "transformer":
        return TinyTransformer(), lambda i: (torch.randint(0, 50, (2, 6)), torch.randint(0, 50, (2 * 6,)))
    if kind == "mlp":
        mlp = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
        return mlp, lambda i: (torch.randn(5, 8), torch.randint(0, 3, (5,)))
    raise ValueError(kind)


def train(kind: str, steps: int, watch_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train ``kind`` for ``steps``; optionally under torchscope.watch.  Returns everything to compare."""
    import torchscope

    model, batch = make(kind)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(1)
    w = torchscope.watch(model, opt, **watch_kwargs) if watch_kwargs is not None else None
    losses: list[float] = []
    grads: list[list[torch.Tensor | None]] = []
    try:
        for i in range(steps):
            x, y = batch(i)
            out = model(x)
            loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y)
            opt.zero_grad()
            loss.backward()
            grads.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
            opt.step()
            losses.append(loss.item())
    finally:
        if w is not None:
            w.close()
    return {
        "losses": losses,
        "grads": grads,
        "params": [p.detach().clone() for p in model.parameters()],
        "rng": torch.get_rng_state(),
    }


def grad_fn_nodes(roots: list[Any]) -> list[Any]:
    """Every grad_fn node below ``roots``: the tests' own walk of ``next_functions``."""
    seen: dict[int, Any] = {}
    stack = [r for r in roots if r is not None]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen[id(n)] = n
        stack.extend(c for c, _ in n.next_functions if c is not None)
    return list(seen.values())
