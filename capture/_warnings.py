"""Warnings point at the user's line while a watch is open, as they do without one.

A Python warning names the frame ``stacklevel`` up from its caller, a C++ one
(``TORCH_WARN``) the innermost Python frame.  With the capture's torch-function mode on the
stack, a torch call made by the user runs inside the mode's ``__torch_function__``, so
``F.mse_loss``'s broadcasting warning, ``torch.tensor(t)``'s copy warning or a non-leaf
``.grad`` read would all name ``torchscope/_interpose.py``: the mode's frame, reached after
the frames its dispatch inserted (the mode, ``handle_torch_function``, and the function's
outer call that dispatched to the mode).

While a watch is open, one filter lets every warning named after torchscope's capture
modules through to the display (a user's filters added later come first and still apply),
and the display names, instead, the frame the warning would have named with those inserted
frames left out.  The warning then goes through ``warnings.warn_explicit`` again with that
frame's file, line, module and ``__warningregistry__``: the user's filters and the
once-per-line default apply as they would without torchscope.  Nothing runs per op: only a
warning that is shown pays.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import types
import warnings
from typing import Any, cast

import torch

from ._evalprobe import EvalDropoutProbe
from ._interpose import Interposer

_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# the dispatch frames between a Python-level torch function and a mode (handle_torch_function)
_DISPATCH_FILE = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "overrides.py")
# the capture's private modules (torchscope._interpose, torchscope._watch, ...); module names
# this filter does not match are where a warning with no user frame is shown once (_show)
_FILTER = ("always", None, Warning, re.compile(r"torchscope\._"), 0)
# torch warns at a compiled module's call while any global module hook is registered; the only
# ones then may be the fast-path guard's (_fastpath.py), which the capture puts there itself and
# which change nothing a compiled module does: its warning would be a false one, and under
# ``-W error::UserWarning`` an exception in the user's forward.  Ignored while a watch is open
# -- unless the user has global module hooks of their own when it opens (theirs it is about).
_COMPILE_HOOKS = (
    "ignore",
    re.compile(r"Using `torch\.compile\(module\)` when there are global hooks on modules"),
    UserWarning,
    None,
    0,
)
_OWN_MODULE = "torchscope"
_own_registry: dict[Any, Any] = {}
_lock = threading.Lock()
_users = 0
_shown: Any = None  # warnings._showwarnmsg as found at install
_reentry = threading.local()
# the modes' frames through which a user's torch call passes (``func(*args, **kwargs)``)
_PASSING = frozenset({Interposer.__torch_function__.__code__, EvalDropoutProbe.__torch_function__.__code__})


def _ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_OWN_DIR)


def install() -> None:
    """At a watch's start: the filter first in ``warnings.filters``, the display wrapped."""
    global _users, _shown
    with _lock:
        _users += 1
        if _users > 1:
            return
        _shown = warnings._showwarnmsg  # type: ignore[attr-defined]
        warnings._showwarnmsg = _show  # type: ignore[attr-defined]
        _filters().insert(0, _FILTER)
        if not getattr(torch.nn.modules.module, "_has_any_global_hook", lambda: True)():
            _filters().insert(0, _COMPILE_HOOKS)
        warnings._filters_mutated()  # type: ignore[attr-defined]


def uninstall() -> None:
    """At a watch's close: both undone when no other watch is open.  Left as they are when
    somebody replaced them since (their replacement would be undone with ours)."""
    global _users
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users > 0:
            return
        if warnings._showwarnmsg is _show:  # type: ignore[attr-defined]
            warnings._showwarnmsg = _shown  # type: ignore[attr-defined]
        mutated = False
        for f in (_FILTER, _COMPILE_HOOKS):
            if f in _filters():
                _filters().remove(f)
                mutated = True
        if mutated:
            warnings._filters_mutated()  # type: ignore[attr-defined]


def _filters() -> list[Any]:
    return cast("list[Any]", warnings.filters)


def _show(msg: warnings.WarningMessage) -> None:
    """``warnings._showwarnmsg``: a warning named after a capture module is warned again,
    named after the user's frame (or, with none, once per line as the default would)."""
    shown = _shown
    if getattr(_reentry, "on", False) or not _ours(msg.filename):
        shown(msg)
        return
    frames = _frames(msg.filename, msg.lineno, sys._getframe(1))
    frame = None
    if frames is not None:
        named, frame = frames
        _forget(msg, named)
    _reentry.on = True
    try:
        if frame is None:
            # torchscope's own warning: the module name lets the filters past ours decide
            warnings.warn_explicit(
                msg.message, msg.category, msg.filename, msg.lineno, _OWN_MODULE, _own_registry
            )
        else:
            g = frame.f_globals
            warnings.warn_explicit(
                msg.message,
                msg.category,
                frame.f_code.co_filename,
                frame.f_lineno,
                g.get("__name__", "<string>"),
                g.setdefault("__warningregistry__", {}),
                module_globals=g,
                source=msg.source,
            )
    finally:
        _reentry.on = False
        # under -W error the warning raised is msg.message, whose traceback holds this frame:
        # its locals would make a cycle keeping the user's frame (a step's loss, its graph)
        # alive until the cyclic collector runs
        del msg, frames, frame


def _forget(msg: warnings.WarningMessage, named: types.FrameType) -> None:
    """Out of the registry of the module the warning named (the mode's): a filter put before
    ours (``simplefilter("default")`` after ``watch()``) showed it once for the mode's line,
    which would hide it from every other line of the user's that warns the same."""
    registry = named.f_globals.get("__warningregistry__")
    if registry:
        text = str(msg.message)
        registry.pop((text, msg.category, msg.lineno), None)
        registry.pop((text, msg.category, 0), None)


def _frames(
    filename: str, lineno: int, top: types.FrameType | None
) -> tuple[types.FrameType, types.FrameType | None] | None:
    """The frame a warning named (``filename:lineno``), and the one it would have named without
    the capture's frames: as many frames up from the same innermost one, with those left out.
    None when the warning did not pass through the mode on its way (torchscope's own)."""
    stack: list[types.FrameType] = []
    f = top
    while f is not None:
        stack.append(f)
        f = f.f_back
    level = next(
        (i for i, fr in enumerate(stack) if fr.f_code.co_filename == filename and fr.f_lineno == lineno),
        None,
    )
    if level is None or not any(fr.f_code in _PASSING for fr in stack[: level + 1]):
        return None
    plain: list[types.FrameType] = []
    i = 0
    while i < len(stack):
        if not _ours(stack[i].f_code.co_filename):
            plain.append(stack[i])
            i += 1
            continue
        inner = plain[-1].f_code if plain else None
        while i < len(stack) and (
            _ours(stack[i].f_code.co_filename) or stack[i].f_code.co_filename == _DISPATCH_FILE
        ):
            i += 1
        # a Python-level function (F.mse_loss) that dispatched to the mode through
        # handle_torch_function runs twice: its outer call is a frame the plain stack lacks
        if i < len(stack) and inner is not None and stack[i].f_code is inner:
            i += 1
    return stack[level], plain[level] if level < len(plain) else None

