"""The hooks torchscope registers on a user's modules, made safe to copy and to pickle.

A module's hooks travel with it: ``copy.deepcopy(model)`` (an EMA model, a best-model
snapshot) deep-copies every hook, and ``torch.save(model)`` / ``pickle`` pickles them.  A bound
method of the watch would drag the watch along -- its writer thread and open file raise
``TypeError`` in the user's loop.  Each hook is therefore wrapped in ``ModuleHook``, whose copy
and pickle are an inert callable instead: ``(0).__init__`` takes any arguments and returns
None, and pickles as ``getattr(0, "__init__")``, so a model saved while watched loads where
torchscope is not installed, and a copy of a watched model is not watched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

INERT: Callable[..., None] = (0).__init__  # type: ignore[misc]  # an int's object.__init__ ignores arguments


class ModuleHook(functools.partial):  # type: ignore[type-arg]
    """``ModuleHook(fn)`` calls ``fn`` (a ``partial`` without arguments: the call stays in C,
    ~60 ns, where a Python ``__call__`` adds ~250 ns to every hook call)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Callable[..., None]:
        return INERT

    def __reduce__(self) -> tuple[Any, ...]:
        return (getattr, (0, "__init__"))

    @property
    def __name__(self) -> str:  # read by torch.jit.script as the hook's name
        # TorchScript compiles a module's hooks and cannot compile ours: say what to do
        # (an AttributeError, so getattr(hook, "__name__", default) still works)
        raise AttributeError(
            "this module is watched by torchscope: close the watch (watch.close(), or leave "
            "its with-block) before torch.jit.script(model), which compiles a module's hooks"
        )
