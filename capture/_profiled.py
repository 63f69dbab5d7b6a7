"""The capture's own tensor ops under a label of ours while a profiler the user runs around the
loop is on (``torch.profiler.profile``, ``torch.autograd.profiler.profile``): in its trace and
its ``events()`` they are the children of ``torchscope::<part>`` ranges, told from the user's
(QA 49c: ~20 aten kinds -- the gradient statistics' norms, NaN checks, ``item`` -- among the
user's, with nothing to tell them apart).  Without a profiler: one module attribute read."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.autograd.profiler as _profiler
from torch.utils._python_dispatch import _disable_current_modes

_NONE = contextlib.nullcontext()  # reusable: made once, not at every use


def profiling() -> bool:
    """Whether a profiler is on (the flag torch's profilers set on entering)."""
    return bool(_profiler._is_profiler_enabled)


class _Label:
    """``record_function(name)`` entered and left unseen by the loop's own function and dispatch
    modes: its enter and exit are dispatched ops (``profiler::_record_function_enter_new``), which
    a user's op-counting mode counted as theirs (QA 50c: 12 ops of six steps became 72)."""

    def __init__(self, name: str) -> None:
        self._range = _profiler.record_function(name)
        self._open = False

    # (a label that cannot be made is left out: nothing of ours may raise into the user's loop)
    def __enter__(self) -> None:
        with contextlib.suppress(Exception), torch._C.DisableTorchFunction(), unseen():
            self._range.__enter__()
            self._open = True

    def __exit__(self, *exc: object) -> None:
        if self._open:
            with contextlib.suppress(Exception), torch._C.DisableTorchFunction(), unseen():
                self._range.__exit__(*exc)


def unseen() -> contextlib.AbstractContextManager[Any]:
    """Where the capture's own reads dispatch ops (a detach, a saved tensor unpacked, a range of
    ours entered) that the loop's own dispatch modes (a FLOP counter) must not see: with those
    modes off (without any, the usual case, no context manager is made)."""
    return _disable_current_modes() if torch._C._len_torch_dispatch_stack() else _NONE


def labelled(part: str) -> contextlib.AbstractContextManager[Any]:
    """``record_function("torchscope::<part>")`` while a profiler is on, else nothing."""
    return _Label(f"torchscope::{part}") if _profiler._is_profiler_enabled else _NONE
