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
_base: dict[str, str | None] = {}  # filename -> basename for user files, None for internal ones


def _user_base(filename: str) -> str | None:
    b = _base.get(filename, "")
    if b == "":
        internal = os.path.abspath(filename).startswith(_SKIP_DIRS) or filename.startswith("<frozen")
        b = _base[filename] = None if internal else os.path.basename(filename)
    return b


def _is_internal(filename: str) -> bool:
    return _user_base(filename) is None


def op_src(module_src: str, depth: int = 3) -> str:
    """``user_src`` for an aten op, without the stack walk where it is not needed.

    The op's direct Python caller (``depth`` frames up) is user code: its line.  Otherwise,
    inside a torch module, ``module_src`` -- the first user frame above that module's call,
    taken once per module call -- is what the walk would find, since only torch frames lie
    in between.  Otherwise (``module_src`` empty) the walk."""
    try:
        f = sys._getframe(depth)
    except ValueError:
        return ""
    fn = f.f_code.co_filename
    b = _base.get(fn, "")
    if b == "":
        b = _user_base(fn)
    if b is not None:
        return f"{b}:{f.f_lineno}"
    return module_src or user_src(depth + 1)


def user_src(depth: int = 1) -> str:
    """``basename:line`` of the innermost frame that is neither torch nor torchscope."""
    f = sys._getframe(depth)
    base = _base
    while f is not None:
        # inlined cache lookup: a captured op walks ~15 torch frames, once per op
        fn = f.f_code.co_filename
        b = base.get(fn, "")
        if b == "":
            b = _user_base(fn)
        if b is not None:
            return f"{b}:{f.f_lineno}"
        f = f.f_back  # type: ignore[assignment]
    return ""
