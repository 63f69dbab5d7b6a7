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


# JSON decodes to exact types, so a set of types checks a scalar (or a whole list of them,
# with one C-level ``map``) much faster than a chain of isinstance calls; bool is not int here.
_SCALAR_TYPES: dict[Any, frozenset[type]] = {
    int: frozenset({int}),
    float: frozenset({int, float}),
    str: frozenset({str}),
    bool: frozenset({bool}),
    type(None): frozenset({type(None)}),
}


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__total__")


def _scalar_types(tp: Any) -> frozenset[type] | None:
    """The exact JSON types ``tp`` allows, when it is a scalar or a union of scalars."""
    if tp in _SCALAR_TYPES:
        return _SCALAR_TYPES[tp]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        parts = [_scalar_types(a) for a in typing.get_args(tp)]
        if all(p is not None for p in parts):
            return frozenset().union(*parts)  # type: ignore[arg-type]
    return None


@cache
def _fields(td: type) -> dict[str, Check]:
    return {name: _checker(tp) for name, tp in typing.get_type_hints(td).items()}


def _checker(tp: Any) -> Check:
    scalar = _scalar_types(tp)
    if scalar is not None:
        return lambda v: type(v) in scalar
    if tp is object:
        return lambda v: True
    if _is_typeddict(tp):
        return lambda v: type(v) is dict and _fields_ok(tp, v)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        allowed = set(args)
        return lambda v: type(v) in (str, int) and v in allowed
    if origin in (typing.Union, types.UnionType):
        parts = [_checker(a) for a in args]
        return lambda v: any(p(v) for p in parts)
    if origin is list:
        item_types = _scalar_types(args[0]) if args else None
        if item_types is not None:
            return lambda v: type(v) is list and set(map(type, v)) <= item_types
        item = _checker(args[0]) if args else (lambda v: True)
        return lambda v: type(v) is list and all(map(item, v))
    if origin is dict:
        val = _checker(args[1]) if len(args) == 2 else (lambda v: True)
        return lambda v: type(v) is dict and all(type(k) is str and val(x) for k, x in v.items())
    return lambda v: True  # an annotation this walker does not know: accept rather than guess


def _fields_ok(td: type, value: Mapping[str, Any]) -> bool:
    fields = _fields(td)
    for name, v in value.items():
        check = fields.get(name)
        if check is not None and not check(v):
            return False
    return True


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
