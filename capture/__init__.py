"""torchscope: see a PyTorch training run live — graph, gradients, memory — with one line.

    import torchscope
    torchscope.watch(model, optimizer)

``import torchscope`` stays light: torch is imported only when ``watch`` is first touched, so
the server, the CLI and the doctor (which import ``torchscope.schema`` and friends) never pay
for torch, and the training process never pays for the web stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._watch import Watch, watch

__version__ = "0.1.0"
__all__ = ["Watch", "__version__", "load", "log", "watch"]


def __getattr__(name: str) -> Any:
    if name in ("watch", "Watch"):
        from . import _watch

        globals().update(watch=_watch.watch, Watch=_watch.Watch)  # later lookups skip __getattr__
        return globals()[name]
    raise AttributeError(f"module 'torchscope' has no attribute {name!r}")


def log(step: int | None = None, **values: Any) -> None:
    """Record numbers of your own with a step (``torchscope.log(acc=0.91, val_loss=0.3)``),
    plotted beside the loss: ``Watch.log`` of every running watch of this process.  Without
    ``step``, the step running now (called after ``optimizer.step()`` and before the next
    training forward -- an evaluation between is none --: the step that just ended).  Does nothing when no watch runs."""
    import sys

    mod = sys.modules.get(f"{__name__}._watch")  # never imports torch for a process that watches nothing
    if mod is not None:
        for w in list(mod._every):
            w.log(step, **values)


def load(path: str) -> Any:
    """Open a ``.tscope`` session file read-only (``.steps``, ``.graph(step)``, ``.memory()``, ``.grads()``)."""
    from .session import load as _load

    return _load(path)
