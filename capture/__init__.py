"""torchscope: see a PyTorch training run live — graph, gradients, memory — with one line.

    import torchscope
    torchscope.watch(model, optimizer)

``import torchscope`` stays light (torch + standard library; no web stack).
"""

from __future__ import annotations

from typing import Any

from .watch import Watch, watch

__version__ = "0.1.0"
__all__ = ["Watch", "__version__", "load", "watch"]


def load(path: str) -> Any:
    """Open a ``.tscope`` session file read-only (``.steps``, ``.graph(step)``, ``.memory()``, ``.grads()``)."""
    from .session import load as _load

    return _load(path)
