"""The user's call site ("file.py:123"): the first frame outside torch and torchscope.

Walking ``sys._getframe`` is much cheaper than ``traceback``/``inspect``; the per-file
verdict is cached so a deep stack costs one dict lookup per frame.
"""

from __future__ import annotations

import os
import sys

import torch

_SKIP_DIRS = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
)
_verdict: dict[str, bool] = {}


def _is_internal(filename: str) -> bool:
    v = _verdict.get(filename)
    if v is None:
        absname = os.path.abspath(filename)
        v = absname.startswith(_SKIP_DIRS) or filename.startswith("<frozen")
        _verdict[filename] = v
    return v


def user_src(depth: int = 1) -> str:
    """``basename:line`` of the innermost frame that is neither torch nor torchscope."""
    f = sys._getframe(depth)
    while f is not None:
        code = f.f_code
        if not _is_internal(code.co_filename):
            return f"{os.path.basename(code.co_filename)}:{f.f_lineno}"
        f = f.f_back  # type: ignore[assignment]
    return ""
