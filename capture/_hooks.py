"""Bytes that user module hooks keep alive (P13), found by looking where a hook can store.

A hook keeps activations (a forward hook) or gradients (a backward hook) by appending them to
something it can reach: a closure cell, a global it names, or the object it is bound to.  We
look there (bounded: a few levels into lists, tuples, dicts and object ``__dict__``s) and sum
the distinct storages of the tensors found; modules whose hooks reach the same storages (one
dict they all append to) count them once, together.  Only modules that have user hooks are
inspected, so the cost is nil otherwise.
"""

from __future__ import annotations

import linecache
import os
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

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


class Retained(NamedTuple):
    """What the user hooks of some modules keep (``retained``)."""

    bytes: dict[str, int]  # module path -> bytes its hooks keep, each storage counted once
    shared: list[list[str]]  # modules whose hooks keep tensors in one container (bytes: the first's)
    src: dict[str, str]  # module path -> ``file:line`` of its first hook that keeps any
    # modules whose hooks keep a module output of this step that an in-place op changed after
    # its forward ended (P13: the hook reads values the forward overwrote)
    changed: list[str] = []


def retained(hooked: list[tuple[str, list[Any]]], outputs: dict[int, int] | None = None) -> Retained:
    """Per module (in ``hooked``'s order), the storages its hooks reach; modules reaching the
    same ones (three hooks appending to one dict) are one group whose bytes count once, under
    its first module -- each alone would read the whole container's.  ``outputs``: storage ->
    version counter of the hooked modules' outputs as their forwards ended this step; a kept
    tensor of one of those storages whose version is higher was changed in place since."""
    changed: list[str] = []
    found: dict[str, dict[int, int]] = {}
    for path, hooks in hooked:
        versions: dict[int, int] = {}
        found[path] = retained_storages(hooks, versions if outputs else None)
        if any(v > outputs[ptr] for ptr, v in versions.items() if outputs and ptr in outputs):
            changed.append(path)
    order = {path: i for i, path in enumerate(found)}
    lead = {path: path for path in found}  # union-find: the earliest module of each group

    def root(p: str) -> str:
        while lead[p] != p:
            p = lead[p]
        return p

    first: dict[int, str] = {}  # storage -> the first module reaching it
    for path, storages in found.items():
        for ptr in storages:
            a, b = root(first.setdefault(ptr, path)), root(path)
            if a != b:
                a, b = sorted((a, b), key=order.__getitem__)
                lead[b] = a
    union: dict[str, dict[int, int]] = {}
    for path, storages in found.items():
        union.setdefault(root(path), {}).update(storages)
    out = {path: sum(union[path].values()) if path in union else 0 for path in found}
    members: dict[str, list[str]] = {}
    for path in found:
        members.setdefault(root(path), []).append(path)
    shared = [m for m in members.values() if len(m) > 1 and out[m[0]]]
    src = {path: where for path, hooks in hooked if found[path] and (where := _src(hooks))}
    return Retained(out, shared, src, changed)


def _src(hooks: list[Any]) -> str:
    """``file:line`` of the first hook that is a plain function: where it stores its output."""
    for h in hooks:
        code = getattr(getattr(h, "__func__", h), "__code__", None)
        if code is not None:
            return f"{os.path.basename(code.co_filename)}:{_storing_line(code)}"
    return ""


def _storing_line(code: Any) -> int:
    """The line of a hook's body that names its last argument -- a forward hook's output, a
    pre-hook's inputs: ``self.features.append(output)``, the line to change (QA 44b: P13 pointed
    at the ``def``) -- else the line it was defined on (a lambda's is its whole body)."""
    if code.co_argcount < 2:
        return int(code.co_firstlineno)
    # (a use that keeps no graph -- ``output.detach()``, ``.shape``, ``.item()`` -- is not it)
    name = re.compile(rf"\b{re.escape(code.co_varnames[code.co_argcount - 1])}\b"
                      r"(?!\s*\.\s*(?:detach|item|numpy|tolist|shape|size|dim|dtype|device)\b)")
    for line in sorted({n for _, _, n in code.co_lines() if n is not None and n > code.co_firstlineno}):
        if name.search(linecache.getline(code.co_filename, line)):
            return line
    return int(code.co_firstlineno)


def retained_storages(hooks: Iterable[Any], versions: dict[int, int] | None = None) -> dict[int, int]:
    """Storages (data pointer -> bytes) of tensors reachable from ``hooks`` (bounded search);
    into ``versions``, where given, each storage's highest version counter among them."""
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
                parts = storage_parts(obj)
                found.update(parts)
                if versions is not None and not obj.is_inference():  # (an inference tensor has no counter)
                    v = obj._version
                    for ptr, _ in parts:
                        versions[ptr] = max(versions.get(ptr, v), v)
            continue
        if depth >= _MAX_DEPTH:
            continue
        if isinstance(obj, dict):
            stack.extend((v, depth + 1) for v in obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend((v, depth + 1) for v in obj)
    return found
