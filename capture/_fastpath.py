"""PyTorch's fast paths taken as they are unwatched.

``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder``, in
eval mode or under ``no_grad``, run one fused kernel -- unless ``has_torch_function`` is true
of their tensors, which it is for every tensor while any torch-function mode is on the stack.
The slow path they take then computes the same function with other roundings: a frozen
transformer teacher run between the student's forward and ``optimizer.step()`` (where the
capture's function mode is on) would hand the student other targets, and the training would
not be the unwatched one.

While one of the watch's modes is on the stack, a global module forward pre-hook takes them
off the stack for the call of such a module, and a forward hook (``always_call``) puts them
back.  Registered only then (a handful of dict operations a step): every module call pays
the hooks while they are there, and the watched model's own forward runs with the mode off on
all but captured steps.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from ._interpose import insert_mode, remove_mode

# the modules whose forward branches on has_torch_function (their fast path)
FAST_PATHS = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)


class _Taken(threading.local):
    stack: list[list[TorchFunctionMode]]

    def __init__(self) -> None:
        self.stack = []


class FastPathGuard:
    """``on()`` / ``off()`` around the times ``modes()`` (the watch's function modes) may be on
    a thread's stack."""

    def __init__(self, modes: Callable[[], tuple[TorchFunctionMode, ...]]) -> None:
        self.modes = modes
        self.handles: list[RemovableHandle] = []
        self.taken = _Taken()

    def on(self) -> None:
        if not self.handles:
            self.handles = [register_module_forward_pre_hook(self._pre),
                            register_module_forward_hook(self._post, always_call=True)]

    def off(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    # Global hooks run in every module call of the process, the user's own code's included: they
    # must never raise into it (at worst a fast path is not taken, as before this guard).
    def _pre(self, module: nn.Module, args: Any) -> None:
        if isinstance(module, FAST_PATHS):
            with contextlib.suppress(Exception):
                # an inner one (a layer of a taken encoder) finds none of them on the stack
                self.taken.stack.append([m for m in self.modes() if remove_mode(m)])

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if isinstance(module, FAST_PATHS) and self.taken.stack:
            with contextlib.suppress(Exception):
                for m in reversed(self.taken.stack.pop()):
                    insert_mode(m)
