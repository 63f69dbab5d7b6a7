"""Check a decoded record against ``schema.py`` with the standard library only.

The server validates with pydantic over the same TypedDicts; a reader inside a notebook or
the training process cannot import pydantic, so this walks the TypedDict annotations
themselves (no second copy of the schema): known kinds only, a few required fields, every
known field of the right basic type, ``Literal`` values in range.  Unknown extra fields are
accepted (a newer minor version may add optional ones).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from .schema import EVENT_TYPES

Check = Callable[[Any], bool]

# The few fields a reader cannot do without; everything else in the schema is optional.
REQUIRED: dict[str, dict[str, Check]] = {
    "session": {"session_id": lambda v: isinstance(v, str) and 0 < len(v) <= 200},
    "step": {"step": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0},
    "graph": {"step": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0},
}


class RecordError(ValueError):
    """A record that does not match the schema; the message is one line."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_float(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_SCALARS: dict[Any, Check] = {
    int: _is_int,
    float: _is_float,
    str: lambda v: isinstance(v, str),
    bool: lambda v: isinstance(v, bool),
    type(None): lambda v: v is None,
    object: lambda v: True,
}


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__total__")


@cache
def _fields(td: type) -> dict[str, Check]:
    return {name: _checker(tp) for name, tp in typing.get_type_hints(td).items()}


def _checker(tp: Any) -> Check:
    if tp in _SCALARS:
        return _SCALARS[tp]
    if _is_typeddict(tp):
        return lambda v: isinstance(v, dict) and _fields_ok(tp, v)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        allowed = set(args)
        return lambda v: isinstance(v, (str, int)) and v in allowed
    if origin in (typing.Union, types.UnionType):
        parts = [_checker(a) for a in args]
        return lambda v: any(p(v) for p in parts)
    if origin is list:
        item = _checker(args[0]) if args else _SCALARS[object]
        return lambda v: isinstance(v, list) and all(item(x) for x in v)
    if origin is dict:
        val = _checker(args[1]) if len(args) == 2 else _SCALARS[object]
        return lambda v: isinstance(v, dict) and all(isinstance(k, str) and val(x) for k, x in v.items())
    return _SCALARS[object]  # an annotation this walker does not know: accept rather than guess


def _fields_ok(td: type, value: Mapping[str, Any]) -> bool:
    fields = _fields(td)
    return all(name not in fields or fields[name](v) for name, v in value.items())


def validate_event(ev: Any) -> dict[str, Any]:
    """Return ``ev`` if it is a valid record, else raise ``RecordError`` naming the field."""
    if not isinstance(ev, dict):
        raise RecordError("record is not a JSON object")
    kind = ev.get("kind")
    td = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if td is None:
        raise RecordError(f"unknown record kind {str(kind)[:40]!r}")
    for name, ok in REQUIRED.get(kind, {}).items():  # type: ignore[arg-type]
        if not ok(ev.get(name)):
            raise RecordError(f"{kind} record lacks a valid {name!r}")
    fields = _fields(td)
    for name, value in ev.items():
        check = fields.get(name)
        if check is not None and not check(value):
            where = f" of step {ev['step']}" if _is_int(ev.get("step")) else ""
            raise RecordError(f"{kind} record{where}: field {name!r} has the wrong type")
    return ev
