"""Which Python container of the user's keeps an old loss -- and so its graph -- alive (P7).

``history.append(loss)`` is no torch call, so the function mode that sees ``total += loss``
never sees it.  The garbage collector knows who refers to an object: the container holding
the loss, then the module globals, instance ``__dict__`` or frame that names that container.
``gc.get_referrers`` walks every tracked object of the process (tens of milliseconds in a
process with torch loaded), so it runs once per run, only after several steps' losses were
found kept alive and the function mode saw no call keep them.
"""

from __future__ import annotations

import gc
import sys
import types
from collections import deque
from typing import Any

import torch

from ._srcloc import _is_internal, locals_of

_CONTAINERS = (list, dict, tuple, set)


def container_of(obj: Any) -> str:
    """What of the user's holds ``obj``: ``'history' (a list)``, ``'.losses' (a list)`` (an
    instance's attribute), ``'best' (a variable)``, ``'.best' (an attribute)``; "" when nothing
    named does."""
    name = _name_of(obj)
    if name:
        kind = "an attribute" if "." in name else "a variable"
        return f"{name} ({kind})"
    referrers = gc.get_referrers(obj)
    try:
        for holder in referrers:
            if holder is not referrers and isinstance(holder, _CONTAINERS) and not _is_globals(holder):
                name = _name_of(holder)
                if name:
                    return f"{name} (a {type(holder).__name__})"
        return ""
    finally:
        del referrers  # a list of the process's objects: not kept past this call


def _is_globals(d: Any) -> bool:
    return isinstance(d, dict) and "__name__" in d and "__builtins__" in d


def _name_of(x: Any) -> str:
    """How the user names ``x``: ``'name'``, a local variable of a running frame or a module's
    global; ``'.name'``, an object's attribute; "" for none.  (Running frames are no referrers
    to the garbage collector: their locals are walked.)"""
    found = _running_name(x)
    return f"'{found}'" if found else _owner_name(x)


def _running_name(x: Any) -> str:
    """The name of ``x`` among the user's running frames' locals, innermost first, then their
    modules' globals (a module-level object a function of an imported module uses; QA 47c);
    "" for none."""
    f: types.FrameType | None = sys._getframe(2)
    frames = []
    while f is not None:
        if not _is_internal(f.f_code.co_filename):  # not torch's, not ours
            found = _key_of(locals_of(f), x)
            if found:
                return found
            frames.append(f)
        f = f.f_back
    return next((found for f in frames if (found := _key_of(f.f_globals, x))), "")


def _key_of(mapping: dict[str, Any], value: Any) -> str:
    return next((k for k, v in mapping.items() if v is value and isinstance(k, str)), "")


def graph_lists(before: dict[int, int]) -> tuple[dict[int, int], str]:
    """The lengths, by id, of the lists (and deques) whose last two items hold tensors with a
    grad_fn -- an epoch's outputs kept for its metric, ``all_probs.append(torch.sigmoid(out))``
    (P7) -- and what the first one longer than in ``before`` (the boundary before) is:
    ``'.outputs' (a list)`` (an attribute), ``'preds' (a list)`` (a module's global), else
    ``'all_probs' (a list)`` (a running function's local), else ``a list of the loop's (9 of
    them, one more each step)``.  Found by the garbage collector's walk (~40 ms, a few times in
    a run that keeps outputs)."""
    lengths: dict[int, int] = {}
    grown: list[Any] | deque[Any] | None = None
    objs = gc.get_objects()
    try:
        for o in objs:
            if type(o) in (list, deque) and o is not objs and len(o) >= 2 and _holds_graphs(o):
                lengths[id(o)] = len(o)
                if grown is None and len(o) > before.get(id(o), len(o)):
                    grown = o
    finally:
        del objs
    if grown is None:
        return lengths, ""
    kind = type(grown).__name__
    name = _name_of(grown)
    return lengths, f"{name} (a {kind})" if name else f"a {kind} of the loop's ({len(grown)} of them, one more each step)"


def _instance_of(d: dict[str, Any]) -> Any:
    """The object whose ``__dict__`` ``d`` is, or None (a plain dict)."""
    owners = gc.get_referrers(d)
    try:
        return next((o for o in owners if o is not owners and getattr(o, "__dict__", None) is d), None)
    finally:
        del owners


def _owner_name(x: Any, outer: bool = True) -> str:
    """``'tracker.name'`` for an attribute of an object the user's running code names
    (``'.name'`` when it names none, or when the attribute is in a ``__dict__`` already made),
    ``'name'`` for a module's global; "" otherwise."""
    owners = gc.get_referrers(x)
    try:
        for owner in owners:
            if owner is owners or isinstance(owner, (types.FrameType, type, types.ModuleType)):
                continue
            # a module's globals name it by itself; an instance's __dict__ (or, not made into
            # a dict object yet, the instance itself) by an attribute
            attrs = owner if isinstance(owner, dict) else getattr(owner, "__dict__", None)
            found = _key_of(attrs, x) if isinstance(attrs, dict) else ""
            if found:
                if _is_globals(owner):
                    return f"'{found}'"
                inst = _instance_of(owner) if isinstance(owner, dict) else owner
                if inst is None:  # a value of a plain dict: by the dict's name (self.history["loss"])
                    base = (_running_name(owner) or _owner_name(owner, False).strip("'")) if outer else ""
                    return f"'{base}[\"{found}\"]'" if base else f"'.{found}'"
                return f"'{_running_name(inst)}.{found}'"
        return ""
    finally:
        del owners


def _holds_graphs(value: list[Any] | deque[Any]) -> bool:
    """Whether the last two items are (or hold, as tuples or dicts do: ``outputs.append({"probs":
    p})``) tensors with a grad_fn."""
    items = [value[-2], value[-1]]
    for item in items:
        inner = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else (item,)
        if not any(isinstance(t, torch.Tensor) and t.grad_fn is not None for t in list(inner)[:8]):
            return False
    return True
