"""The user's call site ("file.py:123"): the first frame outside torch and torchscope -- and
outside the training frameworks that call torch for the user (Lightning's ``manual_backward``,
accelerate's ``backward``, the HF Trainer), whose own frame is named only when the stack holds
no frame of the user's.

Walking ``sys._getframe`` is much cheaper than ``traceback``/``inspect``; the per-file
verdict is cached so a deep stack costs one dict lookup per frame.
"""

from __future__ import annotations

import inspect
import os
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

_SKIP_DIRS = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
)
# installed packages (site-packages/<name>/...) that run the user's training loop for them
_FRAMEWORKS = frozenset({"lightning", "pytorch_lightning", "lightning_fabric", "accelerate", "transformers",
                         "deepspeed"})
_base: dict[str, str | None] = {}  # filename -> basename for user files, None for internal ones


def _framework(path: str) -> bool:
    parts = path.split(os.sep)
    for i, part in enumerate(parts[:-2]):
        if part in ("site-packages", "dist-packages"):
            return parts[i + 1] in _FRAMEWORKS
    return False


def _user_base(filename: str) -> str | None:
    b = _base.get(filename, "")
    if b == "":
        path = os.path.abspath(filename)
        internal = path.startswith(_SKIP_DIRS) or filename.startswith("<frozen") or _framework(path)
        b = _base[filename] = None if internal else (_cell_name(filename) or os.path.basename(filename))
    return b


def _cell_name(filename: str) -> str | None:
    """A notebook cell's name as IPython's tracebacks give it ("Cell In[8]"), for the file a
    Jupyter kernel compiled it to (``/tmp/ipykernel_<pid>/<hash>.py``, whose name says nothing
    to the user) or the terminal's ``<ipython-input-8-...>``; None for any other file."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        shell = ipython.get_ipython()
        count = shell.compile._filename_map.get(filename) if shell is not None else None
    except Exception:  # another IPython's internals: the file's own name, as elsewhere
        return None
    return f"Cell In[{count}]" if isinstance(count, int) else None


def _is_internal(filename: str) -> bool:
    return _user_base(filename) is None


_packaged: dict[str, bool] = {}  # filename -> whether an installed package's


def in_package(filename: str) -> bool:
    """Whether ``filename`` is torch's, ours or an installed package's (under site-packages or
    dist-packages): code the user did not write and cannot change, whose habits (Opacus's
    clipping calling ``.to()`` on tensors already there) are no finding of theirs."""
    known = _packaged.get(filename)
    if known is None:
        parts = os.path.abspath(filename).split(os.sep)
        known = _packaged[filename] = _is_internal(filename) or "site-packages" in parts or "dist-packages" in parts
    return known


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
    """``basename:line`` of the innermost frame that is neither torch nor torchscope nor a
    training framework's -- or, with none, of the innermost framework frame."""
    f = _user_frame(depth)
    if f is not None:
        return f"{_base[f.f_code.co_filename]}:{f.f_lineno}"
    g: types.FrameType | None = sys._getframe(depth)
    while g is not None and not _framework(os.path.abspath(g.f_code.co_filename)):
        g = g.f_back
    return f"{os.path.basename(g.f_code.co_filename)}:{g.f_lineno}" if g is not None else ""


def user_site(depth: int = 1) -> tuple[types.CodeType, int] | None:
    """The code object and line of the innermost user frame (``user_src``'s), or None: where
    a call was made in the user's function, for comparing the order of two calls in it."""
    f = _user_frame(depth)
    return (f.f_code, f.f_lineno) if f is not None else None


def site_src(site: tuple[types.CodeType, int]) -> str:
    """``user_src``'s ``basename:line`` of a ``user_site``."""
    return f"{_base[site[0].co_filename]}:{site[1]}"


def same_function(src: str, code: types.CodeType) -> int | None:
    """The line of ``src`` (``basename:line``, as ``user_src`` writes it) when it lies in the
    function ``code`` (its file, within its lines); None otherwise."""
    base, _, line = src.rpartition(":")
    if not line.isdigit() or base != _base.get(code.co_filename):
        return None
    n = int(line)
    lines = [ln for _, _, ln in code.co_lines() if ln is not None]
    return n if lines and min(lines) <= n <= max(lines) else None


def _user_frame(depth: int) -> types.FrameType | None:
    f: types.FrameType | None = sys._getframe(depth + 1)
    base = _base
    while f is not None:
        # the cache read inline: a captured op walks ~15 torch frames, once per op, and a
        # call per frame cost more than the lookup
        fn = f.f_code.co_filename
        b = base.get(fn, "")
        if b == "":
            b = _user_base(fn)
        if b is not None:
            return f
        f = f.f_back
    return f


# CPython before 3.13 keeps a function frame's ``f_locals`` as a dict snapshot on the frame
_SNAPSHOT_LOCALS = sys.version_info < (3, 13)


def locals_of(frame: types.FrameType) -> dict[str, Any]:
    """A copy of ``frame``'s local variables that leaves nothing behind on the frame.  Before
    Python 3.13, reading a function frame's ``f_locals`` stores a snapshot of its locals on the
    frame until the next read: a training loop's frame would keep that step's loss, outputs
    and batch -- and their graph -- alive after the loop rebinds its variables.  The snapshot's
    tensors (and containers holding tensors) are dropped from it again; anything else stays.
    Not when anything but the frame holds that dict: it is also what ``locals()`` returned, and
    a ``cfg = locals()`` of the user's would lose its entries (QA 46e: a ``KeyError`` in the
    user's code); the snapshot then stays as a debugger's read would leave it.  A module's (or
    class body's) ``f_locals`` is its namespace itself, no snapshot: left alone."""
    loc = frame.f_locals
    copy = dict(loc)
    # (references: the frame's own, ``loc`` here and getrefcount's argument -- no one else's)
    if _SNAPSHOT_LOCALS and frame.f_code.co_flags & inspect.CO_OPTIMIZED and sys.getrefcount(loc) <= 3:
        for k, v in copy.items():
            if _holds_tensor(v):
                del loc[k]
    return copy


def _holds_tensor(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, (list, tuple, dict)):
        items = v.values() if isinstance(v, dict) else v
        return any(isinstance(t, torch.Tensor) for t in list(items)[:64])
    return False


_callers: dict[tuple[str, int, str, int], Callable[..., Any]] = {}
_mirrors: set[types.CodeType] = set()  # the code of _callers' functions


def _caller(f: types.FrameType) -> Callable[..., Any]:
    """A function whose call to ``func(*args, **kwargs)`` happens at ``f``'s file and line, in a
    function of ``f``'s name, with ``f``'s module globals (__name__, __warningregistry__)."""
    code = f.f_code
    key = (code.co_filename, f.f_lineno, code.co_name, id(f.f_globals))
    call = _callers.get(key)
    if call is None:
        # a fixed one-line template (nothing of the user's is compiled), placed at the frame's
        # line number so the call happens on it
        src = "\n" * (max(f.f_lineno, 1) - 1) + "def _call(func, args, kwargs): return func(*args, **kwargs)\n"
        inner = next(c for c in compile(src, code.co_filename, "exec").co_consts if isinstance(c, types.CodeType))
        if len(_callers) >= 256:
            _callers.clear()
            _mirrors.clear()
        call = _callers[key] = types.FunctionType(inner.replace(co_name=code.co_name), f.f_globals)
        _mirrors.add(call.__code__)
    return call


def unlink_own_frames(tb: types.TracebackType | None) -> None:
    """Drop the watch's frames after ``tb`` (the interposer's entry) from a traceback: its
    backward wrapper, and call_as_user's mirrors, which would show the user's lines a second
    time.  An error of the user's backward then reads as it does unwatched, with one line of
    torchscope's (the re-raise) between torch's frames."""
    if tb is None:
        return
    after = tb.tb_next
    while after is not None and (
        after.tb_frame.f_code in _mirrors or os.path.abspath(after.tb_frame.f_code.co_filename).startswith(_SKIP_DIRS[1])
    ):
        after = after.tb_next
    tb.tb_next = after


def call_as_user(func: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)`` below two frames that mirror the user's call site and its
    caller, so the frames just above torch's are what they would be unwatched.  torch warns from
    inside ``backward()`` with a fixed ``stacklevel`` (a full backward hook's warning: 5) that
    counts torch's frames: without this, the watch's own frames take the user's place, which
    moves the warning into torchscope and breaks filters on module or line."""
    try:
        f = _user_frame(1)
        inner = _caller(f) if f is not None else None
        outer = _caller(f.f_back) if f is not None and f.f_back is not None else None
    except Exception:  # a frame without a line number, say: the plain call, nothing raised here
        inner = outer = None
    if inner is None:
        return func(*args, **kwargs)
    if outer is None:
        return inner(func, args, kwargs)
    return outer(inner, (func, args, kwargs), {})
