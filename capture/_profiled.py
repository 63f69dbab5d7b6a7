"""The capture's own tensor ops under a label of ours while a profiler the user runs around the
loop is on (``torch.profiler.profile``, ``torch.autograd.profiler.profile``): its
``key_averages()`` then tells them from the user's, as ``torchscope::<part>`` and the ops below
it (QA 49c: ~20 aten kinds -- the gradient statistics' norms, NaN checks, ``item`` -- counted as
the user's).  Without a profiler: one module attribute read, no label made."""

from __future__ import annotations

import contextlib
from typing import Any

import torch.autograd.profiler as _profiler

_NONE = contextlib.nullcontext()  # reusable: made once, not at every use


def profiling() -> bool:
    """Whether a profiler is on (the flag torch's profilers set on entering)."""
    return bool(_profiler._is_profiler_enabled)


def labelled(part: str) -> contextlib.AbstractContextManager[Any]:
    """``record_function("torchscope::<part>")`` while a profiler is on, else nothing."""
    return _profiler.record_function(f"torchscope::{part}") if _profiler._is_profiler_enabled else _NONE
