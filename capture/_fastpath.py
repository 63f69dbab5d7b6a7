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

Under ``torch.compile`` a compiled forward guards on the global hooks' ids, so the hooks come
back under the ids they had (new ones each step made Dynamo recompile every captured step
until its recompile limit, then run the model uncompiled: other numbers); and once a compiled
forward has run, the guard stays off -- torch warns at every compiled module's call while any
global module hook is there (a model compiled after watch() meets them at its first call: that
warning is filtered while a watch is open, see ``_warnings._COMPILE_HOOKS``).  An eager
transformer beside a compiled model then takes its slow path while the capture's mode is on
(documented in docs/capture.md).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.nn.modules import module as _module
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode

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
        self.taken = _Taken()
        self.compiled = False  # a compiled forward ran: off for good (see the module's docstring)
        self.hooked = False
        # a call the next module call makes first, outside any function mode's handler (where
        # a mode cannot be taken off the stack: torch pushes it back after): see Watch._idle
        self.pending: Callable[[nn.Module], None] | None = None
        # one id each for the whole watch, taken once from torch's own registration, and one
        # function object each (a bound method is a new object at every attribute read)
        pre_fn, post_fn = self._pre, self._post
        pre = register_module_forward_pre_hook(pre_fn)
        post = register_module_forward_hook(post_fn, always_call=True)
        self.entries: tuple[tuple[dict[int, Any], int, Any], ...] = (
            (_module._global_forward_pre_hooks, pre.id, pre_fn),
            (_module._global_forward_hooks, post.id, post_fn),
        )
        self.always = post.id
        pre.remove()
        post.remove()

    def on(self) -> None:
        if not self.hooked and not self.compiled:
            for hooks, key, fn in self.entries:
                hooks[key] = fn
            _module._global_forward_hooks_always_called[self.always] = True
            self.hooked = True

    def off(self) -> None:
        if self.hooked:
            for hooks, key, _ in self.entries:
                hooks.pop(key, None)
            _module._global_forward_hooks_always_called.pop(self.always, None)
            self.hooked = False

    def compiled_forward(self) -> None:
        """A compiled forward of the watched model ran (its hooks were traced): off for good."""
        self.compiled = True
        self.off()

    # Global hooks run in every module call of the process, the user's own code's included: they
    # must never raise into it (at worst a fast path is not taken, as before this guard).
    def _pre(self, module: nn.Module, args: Any) -> None:
        if self.pending is not None:
            call, self.pending = self.pending, None
            with contextlib.suppress(Exception):
                call(module)
        if isinstance(module, FAST_PATHS):
            with contextlib.suppress(Exception):
                # an inner one (a layer of a taken encoder) finds none of them on the stack
                self.taken.stack.append([m for m in self.modes() if remove_mode(m)])

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if isinstance(module, FAST_PATHS) and self.taken.stack:
            with contextlib.suppress(Exception):
                for m in reversed(self.taken.stack.pop()):
                    insert_mode(m)
