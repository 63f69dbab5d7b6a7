"""The ops ``torch.compile`` runs while it compiles are the compiler's, not the model's.

A first call that compiles (Dynamo tracing a frame, AOTAutograd lowering a backward lazily)
runs hundreds of real aten ops on the training thread -- inductor's constant folding, fake
tensors lifted from real ones, pattern matching -- inside the step's forward or backward.  A
captured step would record them as the model's.  Dynamo announces each compile to its
callback handler; between its start and end callbacks the recorders pause on the compiling
thread, and resume as they were.

The handler forgets its callbacks on ``torch._dynamo.reset()``: ``follow()`` registers them
again, and is cheap enough for every captured step.  A torch without the handler (older than
2.5) keeps recording compile ops, as before.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

_pause: Callable[[bool], None] | None = None  # set by follow(): pauses this thread's recorders


def follow(pause: Callable[[bool], None]) -> None:
    """Have ``pause(True)`` / ``pause(False)`` called around each compile of this process."""
    global _pause
    _pause = pause
    dynamo = sys.modules.get("torch._dynamo")  # not imported: nothing compiles yet
    handler = getattr(dynamo, "callback_handler", None)
    if handler is None or _started in getattr(handler, "start_callbacks", ()):
        return
    try:
        handler.register_start_callback(_started)
        handler.register_end_callback(_ended)
    except Exception:  # a handler of another shape: compile ops are recorded, nothing breaks
        return


def _started(args: Any) -> None:
    _switch(True)


def _ended(args: Any) -> None:
    _switch(False)


def _switch(on: bool) -> None:
    # runs inside the user's torch.compile: it must never raise
    try:
        if _pause is not None:
            _pause(on)
    except Exception:
        pass
