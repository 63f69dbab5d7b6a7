"""Bytes by category at a step boundary, from the tensors the capture can name.

Storages are deduplicated by data pointer (views and tied weights count once).  ``live`` is
the union of parameters, gradients and optimizer state — "all live storages the capture
knows of" at a boundary (activations saved for backward are freed by then unless a graph
is kept alive, which ``graphs_alive`` reports); on CUDA the allocator's own figures are
added by ``_cuda``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.nn.parameter import is_lazy  # a LazyModule's parameter before its first forward: no storage
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from . import _native

_PLAIN = (torch.Tensor, torch.nn.Parameter)  # tensor types whose storage is their own


def storage_parts(t: torch.Tensor) -> list[tuple[int, int]]:
    """(data pointer, bytes) of each storage holding ``t``'s data: its own; for a wrapper
    subclass, which has none (a DTensor, a float8 or NF4 tensor: reading its storage raises),
    its inner tensors' (``__tensor_flatten__``: a DTensor's local shard); none when those
    cannot be named either."""
    try:
        st = t.untyped_storage()
        return [(st.data_ptr(), st.nbytes())]
    except (RuntimeError, NotImplementedError):
        pass
    if not is_traceable_wrapper_subclass(t):
        return []
    names, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
    inner = [getattr(t, n, None) for n in names]
    return [part for x in inner if isinstance(x, torch.Tensor) for part in storage_parts(x)]


def storages(tensors: Iterable[Any]) -> dict[int, int]:
    """data pointer -> storage bytes for every strided tensor in ``tensors``."""
    out: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and not is_lazy(t):
            out.update(storage_parts(t))
    return out


def grad_storages(params: Iterable[torch.Tensor]) -> dict[int, int]:
    """``storages()`` of the parameters' ``.grad`` (run every step: a gradient is never a lazy
    parameter, and nothing but a tensor or None is ever a ``.grad``)."""
    native: dict[int, int] | None = _native.ask("grad_storages", params) if isinstance(params, list) else None
    if native is not None:  # every gradient owns its storage
        return native
    out: dict[int, int] = {}
    strided = torch.strided
    for p in params:
        g = p.grad
        if g is not None and g.layout == strided:
            try:  # free when nothing is raised: the usual gradient, read in place
                st = g.untyped_storage()
                out[st.data_ptr()] = st.nbytes()
            except RuntimeError:  # a wrapper subclass (a DTensor's gradient)
                out.update(storage_parts(g))
        elif g is not None and g.layout == torch.sparse_coo:  # an Embedding(sparse=True)'s
            # (its indices view the batch's: of a batch sliced out of a dataset tensor, the
            # part it spans -- the whole dataset read as gradient memory, QA 44a)
            out.update(spanned([g._indices(), g._values()]))
    return out


def held_parts(t: torch.Tensor) -> list[tuple[int, int, int]]:
    """What the graph holds for a saved tensor: its storage, or, for a view of data that
    needs no gradient (``X[i:i + 32]``, a batch sliced out of a dataset kept in memory, or its
    labels), the part of the storage the view spans: the rest is the dataset's, which the loop
    holds anyway.  An activation's view holds its whole storage, which only the graph keeps."""
    parts = storage_parts(t)
    if len(parts) == 1 and not t.requires_grad:
        ptr, nbytes = parts[0]
        span = 1
        for size, stride in zip(t.shape, t.stride(), strict=True):
            if size == 0:
                return [(ptr, 0, 0)]
            span += (size - 1) * abs(stride)
        span *= t.element_size()
        if span < nbytes:
            return [(ptr, span, int(t.storage_offset()) * t.element_size())]
    return [(ptr, nbytes, 0) for ptr, nbytes in parts]


def union_bytes(spans: list[tuple[int, int]]) -> int:
    """Bytes covered by (offset, bytes) spans of one storage: the slices of one batch that
    several nodes saved (an RNN cell unrolled over ``x[t]``, GRU's zero hidden state saved as
    four slices) each hold their own part -- they were counted as the last one read."""
    if len(spans) == 1:
        return spans[0][1]
    total, end = 0, -1
    for start, nbytes in sorted(spans):
        stop = start + nbytes
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def spanned(tensors: list[torch.Tensor]) -> dict[int, int]:
    """Data pointer -> bytes of the storages ``tensors`` hold, as a graph holding them would
    (``held_parts``): a batch sliced out of a dataset kept in one tensor counts the part it
    spans, not the dataset, which the loop holds anyway."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for t in tensors:
        if t.layout == torch.strided:
            for ptr, nbytes, start in held_parts(t):
                spans.setdefault(ptr, []).append((start, nbytes))
    return {ptr: union_bytes(sorted(set(at))) for ptr, at in spans.items()}


def optimizer_tensors(optimizer: Any) -> list[torch.Tensor]:
    """State tensors of ``optimizer`` (a torch optimizer, or a hand-rolled one with a dict of
    dicts ``state``, or none): all of them, a 1-element parameter's momentum and Adam's scalar
    step counters too (before the thirty-fourth session those of one element were skipped, to
    leave out the counters: a 1-element parameter's state went with them), and those in a list
    or tuple (LBFGS's history, ``old_dirs``/``old_stps``: ~200x the parameters at its default
    history size, left out before)."""
    state = getattr(optimizer, "state", None)
    if not isinstance(state, dict):
        return []
    out = []
    for st in state.values():
        for v in st.values() if isinstance(st, dict) else ():
            if isinstance(v, torch.Tensor):
                out.append(v)
            elif isinstance(v, (list, tuple)):
                out += [t for t in v if isinstance(t, torch.Tensor)]
    return out


class StorageSizes:
    """``storages()`` that remembers each tensor's storage: parameters and optimizer state are
    the same objects every step, so a boundary then costs a lookup and a ``data_ptr()`` per
    tensor instead of a storage object.  An entry is reused only while it names the same live
    tensor with the same data pointer (``p.data = ...`` or ``set_()`` is noticed); the
    tensors are held weakly."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[weakref.ref[torch.Tensor], int, int, int]] = {}

    def __call__(self, tensors: Iterable[Any]) -> dict[int, int]:
        native: dict[int, int] | None = _native.ask("storages", tensors) if isinstance(tensors, list) else None
        if native is not None:  # every one a plain tensor
            return native
        out: dict[int, int] = {}
        known = self._known
        for t in tensors:
            e = known.get(id(t))
            if e is not None and e[0]() is t and e[1] == t.data_ptr():  # type: ignore[union-attr]
                out[e[2]] = e[3]
                continue
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and not is_lazy(t):
                parts = storage_parts(t)
                if len(parts) == 1 and type(t) in _PLAIN:  # remembered: its data_ptr() can be read
                    ptr, nbytes = parts[0]
                    known[id(t)] = (weakref.ref(t), t.data_ptr(), ptr, nbytes)
                out.update(parts)
        if len(known) > 8192:  # tensors replaced over a long run: drop dead entries
            self._known = {k: e for k, e in known.items() if e[0]() is not None}
        return out
