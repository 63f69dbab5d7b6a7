"""Graph events checked without building them.

A 5000-op ``GraphEvent`` is about 1 MB of JSON.  Validating it with pydantic builds ~65,000
Python objects that the server throws away at once: it serves a graph from its raw frame and
keeps only its step, micro and op/node counts.  That was half of ingest time.

So graph lines first meet one regular expression, derived here from the TypedDicts of
``torchscope.schema`` (no second copy of the schema), that accepts only JSON texts which
pydantic's strict validation accepts too: every known field with a value of its annotated
type, compact (no whitespace), no unknown keys, plain integers and numbers, strings without
brackets, braces or surrogate escapes.  What it does not accept (rare: a newer minor version's
extra field, a NaN duration, a bracket in a module name, anything hostile) takes the pydantic
path, which decides and words the error.  The regex only ever says "valid" or "ask pydantic".

Python's ``re`` runs it without building anything; atomic groups and possessive repeats keep
it linear (JSON never needs backtracking).  Counting items then works on the brackets alone,
which are all structural because accepted strings hold none.
"""

from __future__ import annotations

import json
import re
import sys
import types
import typing
from typing import Any, Union

from torchscope import schema

# Integers that fit in 64 bits and JSON numbers of up to 20 significant digits: the writer's
# ``json.dumps`` never writes longer ones (``repr`` of a float); longer ones go to pydantic.
_INT = rb"-?(?:0|[1-9][0-9]{0,17})"
_NUMBER = rb"-?(?:0|[1-9][0-9]{0,19})(?:\.[0-9]{1,20})?(?:[eE][+-]?[0-9]{1,3})?"
# No brackets or braces inside strings (so that every bracket is structure: see _count_items),
# no control characters, no \u escape of a surrogate (whether a lone one is accepted is
# pydantic's business).  Bytes >= 0x80 are checked as UTF-8 once per line.
_PLAIN = rb'[^"\\\x00-\x1f\[\]{}]*+'
_ESCAPE = rb'\\(?:["\\/bfnrt]|u(?![dD][89abAB])[0-9a-fA-F]{4})'
_STRING = rb'"' + _PLAIN + rb"(?:" + _ESCAPE + _PLAIN + rb')*+"'  # "unrolled": plain runs between escapes
_SCALARS: dict[Any, bytes] = {
    int: _INT,
    float: _NUMBER,
    str: _STRING,
    bool: rb"(?:true|false)",
    type(None): rb"null",
}


def _json_literal(value: Any) -> bytes:
    return re.escape(json.dumps(value).encode())


def _object(fields: dict[str, bytes], capture: frozenset[str] = frozenset()) -> bytes:
    """A JSON object whose members are any of ``fields`` (key -> value pattern), in any order;
    the members named in ``capture`` become named groups."""
    # the opening quote is shared, so that re skips a member whose key's first letter differs
    member = (
        rb"\x22(?>"
        + b"|".join(
            _json_literal(k)[1:] + b":" + (b"(?P<%s>%s)" % (k.encode(), v) if k in capture else v)
            for k, v in fields.items()
        )
        + b")"
    )
    if capture:  # a group may appear once in a pattern: each member is followed by "," or "}"
        return rb"\{(?:" + member + rb"(?:,(?=\x22)|(?=\})))*+\}"
    return _sequence(b"{", member, b"}")


def _sequence(open_: bytes, item: bytes, close: bytes) -> bytes:
    return re.escape(open_) + b"(?:" + item + b"(?:," + item + b")*+)?" + re.escape(close)


def _value(tp: Any) -> bytes | None:
    """The pattern of the JSON values of annotation ``tp`` that pydantic (strict) accepts, or None
    where there is none (``object``): such fields are left out, so records holding them take the
    pydantic path."""
    if tp in _SCALARS:
        return _SCALARS[tp]
    if typing.is_typeddict(tp):
        return _object(_fields(tp))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal and all(type(a) in (str, int, bool) for a in args):
        return rb"(?:" + b"|".join(_json_literal(a) for a in args) + rb")"
    if origin in (Union, types.UnionType):
        parts = [_value(a) for a in args]
        return None if None in parts else rb"(?>" + b"|".join(p for p in parts if p is not None) + rb")"
    if origin is list and args and (item := _value(args[0])) is not None:
        return _sequence(b"[", item, b"]")
    if origin is dict and len(args) == 2 and args[0] is str and (val := _value(args[1])) is not None:
        return _sequence(b"{", _STRING + b":" + val, b"}")
    return None


def _fields(td: Any) -> dict[str, bytes]:
    return {k: v for k, tp in typing.get_type_hints(td).items() if (v := _value(tp)) is not None}


# The graph event, with the parts the summary needs captured (a repeated key captures its last
# occurrence, which is also the one JSON readers keep).
_SUMMARY_KEYS = ("step", "micro")
# Atomic groups and possessive repeats arrived in Python 3.11's ``re``; on 3.10 there is no
# fast path and every graph event takes the pydantic path (slower ingest, same answers).
_GRAPH = (
    re.compile(_object(_fields(schema.GraphEvent), frozenset({"kind", *_SUMMARY_KEYS, "ops", "nodes"})))
    if sys.version_info >= (3, 11)
    else None
)

_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_FOLDED_LIST = re.compile(rb"\[o+\]")
_FOLDED_OBJECT = re.compile(rb"\{o+\}")  # an object holding objects (NodeRecord.attrs inside a node)


def _count_items(array: bytes | None) -> int | None:
    """The number of items of an accepted JSON array: keep its brackets only, then fold what is
    nested (a list of folded items vanishes, an object of folded members becomes ``o``) until
    only the top items are left, one ``o`` each."""
    if array is None:
        return 0
    skeleton = array[1:-1].translate(None, _NOT_BRACKETS)
    for _ in range(32):  # a nesting deeper than the schema's cannot have been accepted
        folded = skeleton.replace(b"[]", b"").replace(b"{}", b"o")
        if b"[o" in folded:
            folded = _FOLDED_LIST.sub(b"", folded)
        if b"{o" in folded:
            folded = _FOLDED_OBJECT.sub(b"o", folded)
        if folded == skeleton:
            return len(skeleton) if skeleton.count(b"o") == len(skeleton) else None
        skeleton = folded
    return None


def summary(ev: dict[str, Any]) -> dict[str, Any]:
    """What the server keeps of a validated graph event: kind, step, micro, op and node counts."""
    out: dict[str, Any] = {"kind": "graph", **{k: ev[k] for k in _SUMMARY_KEYS if k in ev}}
    out["n_ops"] = len(ev.get("ops") or ())
    out["n_nodes"] = len(ev.get("nodes") or ())
    return out


def fast_summary(line: bytes) -> dict[str, Any] | None:
    """The ``summary`` of a graph event line the regex accepts, else None (ask pydantic)."""
    if _GRAPH is None:
        return None
    m = _GRAPH.fullmatch(line)
    if m is None or m["kind"] is None:
        return None
    if not line.isascii():
        try:
            line.decode()
        except UnicodeDecodeError:
            return None
    n_ops, n_nodes = _count_items(m["ops"]), _count_items(m["nodes"])
    if n_ops is None or n_nodes is None:
        return None
    out: dict[str, Any] = {"kind": "graph", **{k: int(m[k]) for k in _SUMMARY_KEYS if m[k] is not None}}
    out["n_ops"] = n_ops
    out["n_nodes"] = n_nodes
    return out
