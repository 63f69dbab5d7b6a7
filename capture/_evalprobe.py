"""Functional dropout left on in eval mode (P11).

``F.dropout(x, 0.5)`` in a module's ``forward`` drops activations whatever the module's mode:
the function's ``training`` argument defaults to True, and nothing ties it to the model's
eval mode unless the call passes ``training=self.training``.  An evaluation of such a
model is randomised, and no module of it says so -- nn.Dropout modules follow the mode, the
function does not.

The capture's function mode is off during most forwards (it costs every torch call there);
this small mode is put on the stack for the first eval-mode forward from each call site of
the loop only, and looks at the dropout functions alone.
"""

from __future__ import annotations

import linecache
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch.overrides import TorchFunctionMode

from ._srcloc import _is_internal, _user_base, locals_of

# the dropout functions whose ``training`` defaults to True (alpha_dropout's defaults to False),
# their third argument: ``F.dropout(input, p, training, inplace)``, as nn.Dropout calls it
_DROPOUTS = {f: f.__code__ for f in (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d)}
_compiling = torch.compiler.is_compiling


class EvalDropoutProbe(TorchFunctionMode):
    """Calls ``note(module, src, name)``, through ``safe``, for a dropout function called from user code in an
    eval-mode module (or, from a helper function, while the watched model evaluates) with
    ``training`` left at its default."""

    def __init__(self, safe: Callable[..., Any], note: Callable[[nn.Module | None, str, str], None]) -> None:
        super().__init__()
        self.safe = safe  # the watch's guard: an error is logged once and turns this part off
        self.note = note

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        code = _DROPOUTS.get(func)
        # ``_compiling()``: Dynamo traces the forward of a watched torch.compile'd model through
        # this mode; looking at frames there is a graph break (fullgraph=True: an error)
        if code is not None and kwargs.get("training", args[2] if len(args) > 2 else True) is True and not _compiling():
            self.safe("modes", self._look, code, func.__name__)
        return func(*args, **kwargs)  # torchscope runs your call unchanged

    def _look(self, code: Any, name: str) -> None:
        # the dropout function's own frame: the outermost of a few (the capture's function
        # mode, above this one on captured steps, calls it again from its handler)
        f: Any = sys._getframe(2)
        own = None
        for _ in range(12):
            if f is None:
                break
            if f.f_code is code:
                own = f
            f = f.f_back
        caller = own.f_back if own is not None else None
        if caller is None or _is_internal(caller.f_code.co_filename):
            return  # nn.Dropout's forward passes its own mode: only the user's own calls
        call = _call_text(caller)
        if "training" in call or call.count("(") != call.count(")"):
            return  # training= passed (Monte Carlo dropout on purpose), or a call this text does not show whole
        owner = locals_of(caller).get("self")
        module = owner if isinstance(owner, nn.Module) else None
        if module is not None and module.training:
            return
        self.note(module, f"{_user_base(caller.f_code.co_filename)}:{caller.f_lineno}", name)


def _call_text(frame: Any) -> str:
    """The source of the call ``frame`` is making: the span its instruction's positions give
    (Python 3.11+), so of ``F.dropout(x, 0.5, training=self.training) if ok else F.dropout(x, 0.5)``
    the branch that ran (QA 44b: "training" anywhere on the line hid the second); else the line."""
    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno)
    positions = getattr(code, "co_positions", None)
    if positions is None:
        return line
    try:
        start, end, col, end_col = list(positions())[frame.f_lasti // 2]
    except (IndexError, ValueError):
        return line
    if start is None or end is None or col is None or end_col is None:
        return line
    lines = [linecache.getline(code.co_filename, n) for n in range(start, end + 1)]
    if len(lines) == 1:
        return lines[0].encode()[col:end_col].decode(errors="replace")  # (offsets count UTF-8 bytes)
    return lines[0].encode()[col:].decode(errors="replace") + "".join(lines[1:-1]) + lines[-1].encode()[:end_col].decode(errors="replace")

