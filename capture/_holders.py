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
from typing import Any

from ._srcloc import _is_internal

_CONTAINERS = (list, dict, tuple, set)


def container_of(obj: Any) -> str:
    """What of the user's holds ``obj``: ``'history' (a list)``, ``'.losses' (a list)`` (an
    instance's attribute), ``'best' (a global variable)``, ``'best' (a local variable)``; ""
    when nothing named does."""
    local = _local_name(obj)
    if local:
        return f"'{local}' (a local variable)"
    referrers = gc.get_referrers(obj)
    try:
        for holder in referrers:
            if holder is referrers:
                continue
            if _is_globals(holder):
                found = _key_of(holder, obj)
                if found:
                    return f"'{found}' (a global variable)"
            elif isinstance(holder, _CONTAINERS):
                name = _name_of(holder)
                if name:
                    return f"{name} (a {type(holder).__name__})"
        return ""
    finally:
        del referrers  # a list of the process's objects: not kept past this call


def _is_globals(d: Any) -> bool:
    return isinstance(d, dict) and "__name__" in d and "__builtins__" in d


def _local_name(obj: Any) -> str:
    """The name of a local variable of the user's, in the running frames, that is ``obj``.
    (Running frames are no referrers to the garbage collector: their locals are walked here.)"""
    f: types.FrameType | None = sys._getframe(1)
    while f is not None:
        if not _is_internal(f.f_code.co_filename):  # not torch's, not ours
            found = _key_of(f.f_locals, obj)
            if found:
                return found
        f = f.f_back
    return ""


def _name_of(container: Any) -> str:
    """How the user names ``container``: a local or global variable, or an attribute."""
    local = _local_name(container)
    if local:
        return f"'{local}'"
    owners = gc.get_referrers(container)
    try:
        for owner in owners:
            if owner is owners or isinstance(owner, (types.FrameType, type, types.ModuleType)):
                continue
            if isinstance(owner, dict):
                found = _key_of(owner, container)
                if found:
                    # a module's globals name it by itself; any other dict (an instance's
                    # __dict__) by an attribute
                    return f"'{found}'" if _is_globals(owner) else f"'.{found}'"
            elif isinstance(getattr(owner, "__dict__", None), dict):
                found = _key_of(vars(owner), container)  # an instance whose __dict__ is not an object yet
                if found:
                    return f"'.{found}'"
        return ""
    finally:
        del owners


def _key_of(mapping: dict[str, Any], value: Any) -> str:
    return next((k for k, v in mapping.items() if v is value and isinstance(k, str)), "")
