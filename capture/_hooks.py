"""Bytes that user forward hooks keep alive (P13), found by looking where a hook can store.

A hook keeps activations by appending them to something it can reach: a closure cell, a
global it names, or the object it is bound to.  We look there (bounded: a few levels into
lists, tuples, dicts and object ``__dict__``s) and sum the distinct storages of the tensors
found.  Only modules that have user hooks are inspected, so the cost is nil otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ._memory import storage_parts

_MAX_ITEMS = 20_000
_MAX_DEPTH = 3


def _roots(fn: Any) -> Iterable[Any]:
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue
    code = getattr(fn, "__code__", None)
    glb = getattr(fn, "__globals__", None)
    if code is not None and glb is not None:
        for name in code.co_names:
            v = glb.get(name)
            if isinstance(v, (list, dict, tuple, set)):
                yield v
    owner = getattr(fn, "__self__", None)
    if owner is not None and not isinstance(owner, torch.nn.Module):
        yield getattr(owner, "__dict__", {})


def retained_bytes(hooks: Iterable[Any]) -> int:
    """Distinct storage bytes of tensors reachable from ``hooks`` (bounded search)."""
    seen: set[int] = set()
    found: dict[int, int] = {}
    budget = _MAX_ITEMS
    stack: list[tuple[Any, int]] = [(r, 0) for h in hooks for r in _roots(h)]
    while stack and budget > 0:
        obj, depth = stack.pop()
        budget -= 1
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.layout == torch.strided:
                found.update(storage_parts(obj))
            continue
        if depth >= _MAX_DEPTH:
            continue
        if isinstance(obj, dict):
            stack.extend((v, depth + 1) for v in obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend((v, depth + 1) for v in obj)
    return sum(found.values())
