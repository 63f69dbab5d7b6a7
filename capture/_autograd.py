"""The autograd graph of a backward root: structural signature, node records, backward hooks.

The walk follows ``grad_fn.next_functions`` from each root, as PyTorch's engine will.  Node
objects are held only for the duration of the walk (and, on captured steps, until the
backward returns and its hooks are removed); nothing outlives the step.
"""

from __future__ import annotations

import hashlib
import time
import weakref
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import torch

from . import _native
from ._memory import held_parts, union_bytes
from ._profiled import labelled
from .schema import NodeRecord, SavedTensor

_saved_attrs: dict[type, tuple[tuple[str, str], ...]] = {}
# Under a Python dispatch mode (our op recorder) eager ``reshape`` records a ViewBackward0
# where it otherwise records ReshapeAliasBackward0: the same structure, so one signature.
_SAME = {"ReshapeAliasBackward0": "ViewBackward0"}
_names: dict[type, str] = {}
_ACCUMULATE = torch._C._functions.AccumulateGrad  # type: ignore[attr-defined]
# (node classes, flat edges) -> signature; class objects compare by identity, digests use names
_sig_cache: dict[tuple[tuple[type, ...], tuple[int, ...]], str] = {}


def _name_of(cls: type) -> str:
    name = _names[cls] = _SAME.get(cls.__name__, cls.__name__)
    return name


def _saved_names(node: Any) -> tuple[tuple[str, str], ...]:
    """The tensor fields a node class saves for backward, each with its ``_raw_`` twin:
    ``_saved_self``... of built-in nodes (those with a ``_raw_saved_`` twin: the others --
    sizes, dims, scalars -- hold no tensor and cost a conversion to read), and
    ``saved_tensors`` of a custom ``autograd.Function``'s (what ``ctx.save_for_backward`` got)."""
    cls = type(node)
    names = _saved_attrs.get(cls)
    if names is None:
        attrs = set(dir(node))
        names = tuple((a, "_raw" + a) for a in sorted(attrs) if a.startswith("_saved_") and "_raw" + a in attrs)
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            names += (("saved_tensors", "_raw_saved_tensors"),)
        _saved_attrs[cls] = names
    return names


def _held(node: Any, attr: str, raw_attr: str) -> list[torch.Tensor]:
    """The tensors ``node`` holds for its saved field ``attr`` (``_saved_self``...).

    A value saved under ``saved_tensors_hooks`` is read as packed, never unpacked: unpacking
    runs the hook, and activation checkpointing's hook recomputes its whole segment (once per
    read outside a backward) -- compute and memory the training did not ask for, and tensors
    that are not held.  What is held is the packed value: nothing for a checkpoint, the CPU
    copy for ``save_on_cpu``.  A plain saved tensor is read as usual, so one freed by a
    backward or modified in place still raises (P8/P10)."""
    # the SavedTensor(s) themselves (``_raw_saved_self``, ``_raw_saved_tensors``): reading them unpacks nothing
    raw = getattr(node, raw_attr, None)
    # the usual case, one SavedTensor no hook packed, without _packed's general walk
    maybe_packed = raw is not None and (type(raw) is not _SavedTensor or getattr(raw, "unpack_hook", None) is not None)
    if maybe_packed:
        packed = _packed(raw)
        if packed is not None:
            return packed
    v = getattr(node, attr)
    if type(v) is _TENSOR or isinstance(v, torch.Tensor):
        return [v]
    return [t for t in (v if isinstance(v, (tuple, list)) else (v,)) if isinstance(t, torch.Tensor)]


_SavedTensor = torch._C._autograd.SavedTensor
_TENSOR = torch.Tensor

# Each built-in node class's saved fields that hold no tensor (those without a ``_raw_`` twin:
# ``_saved_stride``, ``_saved_dim``, ``_saved_alpha``...), each with its NodeRecord.attrs name.
# Read from the class, so a custom Function's ctx attributes (instance ones) are not among them.
_attr_names: dict[type, tuple[tuple[str, str], ...]] = {}
_MAX_ATTRS = 16  # per node
_MAX_ITEMS = 16  # per list attribute (its first ones)
_MAX_CHARS = 80  # per string
_U64, _I64 = 2**64, 2**63
_INTS = frozenset({int})
# what is written by its name: torch.float32 -> "float32", as TensorMeta.dtype; torch.channels_last -> "channels_last"
_BY_NAME = (torch.dtype, torch.device, torch.layout, torch.memory_format)


def _attrs_of(node: Any) -> dict[str, int | float | bool | str | list[int | float | bool | str]] | None:
    """What ``node`` saved for backward besides tensors -- a convolution's stride and padding, a
    reduction's dim and keepdim, a view's sizes -- as torchviz's ``show_attrs`` lists them; None
    when nothing.  Values JSON can hold only (see ``_attr_value``); one that cannot be read or
    written is left out, so nothing here raises into the loop, and no tensor is kept."""
    cls = type(node)
    names = _attr_names.get(cls)
    if names is None:
        attrs = set(dir(cls))
        names = _attr_names[cls] = tuple(
            (a, a.removeprefix("_saved_")) for a in sorted(attrs) if a.startswith("_saved_") and "_raw" + a not in attrs
        )
    if not names:
        return None
    out: dict[str, int | float | bool | str | list[int | float | bool | str]] = {}
    for attr, key in names:
        try:
            v = getattr(node, attr)
            t = type(v)
            # the usual kinds first, each without a call: a size, stride or dim tuple of plain
            # ints, one int (int64 fields PyTorch reads back unsigned: see _attr_scalar), a bool
            if t is tuple and len(v) <= _MAX_ITEMS and _INTS.issuperset(map(type, v)) and (not v or max(v) < _I64):
                v = list(v)
            elif not ((t is int and v < _I64) or t is bool):
                v = _attr_value(v)
        except Exception:  # a field this torch cannot read back: left out
            continue
        if v is None:
            continue
        out[key] = v
        if len(out) == _MAX_ATTRS:
            break
    return out or None


def _attr_value(v: Any) -> int | float | bool | str | list[int | float | bool | str] | None:
    """``v`` as JSON holds it (a tuple or list as a list of its first ``_MAX_ITEMS``), or None
    when it is none of the kinds a saved attribute holds (None itself, a tensor, a generator...)."""
    if type(v) is tuple or type(v) is list:
        items = [_attr_scalar(x) for x in v[:_MAX_ITEMS]]
        return None if any(x is None for x in items) else items  # type: ignore[return-value]
    return _attr_scalar(v)


def _attr_scalar(v: Any) -> int | float | bool | str | None:
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        # an int64 field (a dim of -1, ignore_index=-100) reads back as its unsigned 64-bit
        # value (18446744073709551516): what it is, as the C++ node holds it
        v = int(v)
        return v - _U64 if _I64 <= v < _U64 else v
    if isinstance(v, float):
        return float(v)  # NaN and ±inf as the schema's other floats: written as NaN / Infinity
    if isinstance(v, str):
        return str(v)[:_MAX_CHARS]
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        # a value known without guarding on it (int() of a symbol under tracing would add a guard)
        return _attr_scalar(v.node.maybe_as_int() if isinstance(v, torch.SymInt) else None)
    if isinstance(v, _BY_NAME):
        return str(v).removeprefix("torch.")[:_MAX_CHARS]
    return None


# a saved field: its name and (tensor, its storage parts) of each strided tensor it holds, or
# the exception reading it raised; a part is (storage pointer, bytes held, their first byte's
# offset in the storage)
_Field = tuple[str, "list[tuple[torch.Tensor, list[tuple[int, int, int]]]] | Exception"]


def _saved_of(node: Any) -> list[_Field]:
    """Each saved field of ``node`` with its tensors that have a storage (and those storages,
    read once), or the exception reading it raised (freed by a backward, modified in place).
    A list, not a generator: run for every node of a captured graph, most with no field."""
    names = _saved_attrs.get(type(node))
    if names is None:
        names = _saved_names(node)
    if not names:
        return _NO_FIELDS
    out: list[_Field] = []
    for attr, raw_attr in names:
        try:
            held = _held(node, attr, raw_attr)
        except Exception as exc:
            # its message only: the exception's traceback (and any it chains) holds frames that
            # hold this walk and its nodes, and the walk holds the fields -- a cycle that would
            # keep the graph alive until a collection, after the loop moved on (a false P7)
            out.append((attr, RuntimeError(str(exc))))
            continue
        # strided, with storage_parts() to read (a DTensor's is its local shard's)
        out.append((attr, [(t, held_parts(t)) for t in held if t.layout == _STRIDED]))
    return out


_NO_FIELDS: list[_Field] = []  # shared, never appended to


def _checkpointed(node: Any) -> bool:
    """Whether ``node``'s saved tensors were packed by ``torch.utils.checkpoint``'s non-reentrant
    hooks: its forward op runs again inside the backward (the recompute), side effects and all --
    a BatchNorm's running statistics are updated a second time.  Its first saved field's hook is
    read, never called (calling it recomputes the segment)."""
    names = _saved_attrs.get(type(node))
    if not names:
        return False
    raw = getattr(node, names[0][1], None)
    first = raw[0] if isinstance(raw, (tuple, list)) and raw else raw
    hook = getattr(first, "unpack_hook", None)
    return hook is not None and getattr(hook, "__qualname__", "").startswith("_checkpoint_hook.")


def _packed(raw: Any) -> list[torch.Tensor] | None:
    """Tensors inside the packed values of ``raw`` (a SavedTensor or a list of them) when a
    saved_tensors_hooks pair packed them; None when none did (or torch cannot tell)."""
    saved = raw if isinstance(raw, (tuple, list)) else (raw,)
    if not any(getattr(s, "unpack_hook", None) is not None for s in saved):
        return None
    out: list[torch.Tensor] = []
    for s in saved:
        data = s.data
        for x in data if isinstance(data, (tuple, list)) else (data,):
            if isinstance(x, torch.Tensor):
                out.append(x)
    return out


_STRIDED = torch.strided
_higher_order_marked = False  # whether any node was ever marked by stamp_new


_NO_SEQ = 2**64 - 1  # AccumulateGrad's (and other nodes' made outside a forward op)


def _seq(node: Any) -> int:
    """A node's sequence number, -1 where it has none (the extension's int64 view of the same)."""
    try:
        seq = int(node._sequence_nr())
    except (AttributeError, RuntimeError):
        return -1
    return -1 if seq == _NO_SEQ else seq


class AutogradWalk:
    """One walk of the graph below ``roots`` (in node discovery order, roots first)."""

    def __init__(self, roots: list[Any]) -> None:
        self.index: dict[Any, int] = {}
        self.nodes: list[Any] = []
        # edges flat as (from, to, input_nr) triples: one list extend per edge instead of a
        # small list per edge; ``edges`` builds the nested form only for captured steps
        self.flat: list[int] = []
        # each node's saved fields, read once by saved(keep=True) for records() in one captured
        # backward; never kept past it (the tensors would outlive the backward that frees them)
        self._fields: list[list[_Field]] | None = None
        self._seqs: list[int] | None = None
        for r in roots:
            if r is not None and r not in self.index:
                self.index[r] = len(self.nodes)
                self.nodes.append(r)
        stack = list(enumerate(self.nodes))
        index, nodes, flat = self.index, self.nodes, self.flat
        while stack:
            i, n = stack.pop()
            for child, input_nr in n.next_functions:
                if child is None:
                    continue
                j = index.get(child)
                if j is None:
                    j = index[child] = len(nodes)
                    nodes.append(child)
                    stack.append((j, child))
                flat += (i, j, input_nr)

    def seqs(self) -> list[int]:
        """The nodes' sequence numbers (-1 where a node has none), read once per walk: the
        native recorder links nodes to ops and times them by these."""
        if self._seqs is None:
            self._seqs = [_seq(n) for n in self.nodes]
        return self._seqs

    @property
    def edges(self) -> list[list[int]]:
        f = self.flat
        return [[f[k], f[k + 1], f[k + 2]] for k in range(0, len(f), 3)]

    def saved(self, param_ptrs: set[int], keep: bool = False) -> tuple[dict[int, int], list[str]]:
        """Storages saved for backward (data pointer -> bytes, parameters excluded) and the
        nodes whose saved tensors can no longer be read (freed, or modified in place: P8/P10).
        ``keep``: hold what was read for the ``records()`` call that follows (which drops it)."""
        spans: dict[int, list[tuple[int, int]]] = {}
        broken: list[str] = []
        fields = [_saved_of(n) for n in self.nodes]
        if keep:
            self._fields = fields
        for n, node_fields in zip(self.nodes, fields, strict=True):
            for attr, held in node_fields:
                if isinstance(held, Exception):
                    broken.append(f"{type(n).__name__}.{attr}: {str(held).splitlines()[0][:200]}")
                    continue
                for _, parts in held:
                    for ptr, nbytes, start in parts:
                        if ptr not in param_ptrs:
                            at = spans.get(ptr)
                            if at is None:
                                spans[ptr] = [(start, nbytes)]
                            elif (start, nbytes) not in at:  # (one tensor saved by several nodes: once)
                                at.append((start, nbytes))
        return {ptr: union_bytes(at) for ptr, at in spans.items()}, broken

    def forget_saved(self) -> None:
        self._fields = None

    def touching_node(self, param_ids: dict[int, str], hint: int = -1) -> int:
        """Index of an ``AccumulateGrad`` node of a parameter in ``param_ids``, or -1: whether
        this graph gives that model gradients.  ``hint`` (the answer for an earlier graph of
        the same structure) is checked first, so a steady loop costs one lookup, while a
        same-shaped graph of another model (two copies of one architecture) is still told apart."""
        if 0 <= hint < len(self.nodes) and id(getattr(self.nodes[hint], "variable", None)) in param_ids:
            return hint
        for i, n in enumerate(self.nodes):
            var = getattr(n, "variable", None) if type(n).__name__ == "AccumulateGrad" else None
            if var is not None and id(var) in param_ids:
                return i
        return -1

    def leaves(
        self, param_ids: dict[int, str], held_as: Callable[[torch.Tensor], str | None] | None = None
    ) -> tuple[set[str], list[tuple[NodeRecord, weakref.ref[torch.Tensor]]], dict[str, str]]:
        """What light mode, which writes no node records, tells of this graph's leaves: the names
        of the parameters in ``param_ids`` it reaches; the ``nn.Parameter`` leaves not in it
        (a layer kept in a plain list or dict), each with a bare record marked ``unregistered``,
        as ``records`` gives them (``Watch._owned_elsewhere`` keeps those no optimizer steps);
        and of the reached parameters, those reached through one custom ``autograd.Function``
        node only, with its class name (``through_function``)."""
        reached: set[str] = set()
        outside: list[tuple[NodeRecord, weakref.ref[torch.Tensor]]] = []
        at: dict[int, str] = {}  # node index -> name, of the reached parameters' AccumulateGrad
        for i, n in enumerate(self.nodes):
            var = getattr(n, "variable", None) if type(n) is _ACCUMULATE else None
            if var is None:
                continue
            name = param_ids.get(id(var))
            if name is not None:
                reached.add(name)
                at[i] = name
            elif isinstance(var, torch.nn.Parameter):
                outside.append(({"unregistered": True}, weakref.ref(var)))
            elif held_as is not None and (place := held_as(var)) is not None:
                outside.append(({"unregistered": True, "held_as": place}, weakref.ref(var)))
        return reached, outside, self.through_function(at)

    def through_function(self, at: dict[int, str]) -> dict[str, str]:
        """Of the AccumulateGrad nodes ``at`` (index -> parameter name), the parameters whose every
        incoming edge comes from one custom ``autograd.Function`` node: name -> its class name.
        A None its backward returns is then the only way the parameter's .grad stays None
        while the backward reaches it -- light mode's P1 tells that from a cleared gradient."""
        fed: dict[int, set[str]] = {}
        f, nodes = self.flat, self.nodes
        for k in range(0, len(f), 3):
            j = f[k + 1]
            if j in at:
                parent = nodes[f[k]]
                fed.setdefault(j, set()).add(
                    type(parent).__name__ if isinstance(parent, torch.autograd.function.BackwardCFunction) else "")
        return {at[j]: kinds.pop() for j, kinds in fed.items() if len(kinds) == 1 and "" not in kinds}

    def stamp_new(self, known: set[int]) -> int:
        """Mark every node not in ``known`` (ids of the nodes that existed before a
        ``create_graph=True`` pass) as made by that pass; the mark lives in the node's own
        ``metadata``, so nothing here keeps a node alive.  Returns how many were marked."""
        global _higher_order_marked
        n_new = 0
        for n in self.nodes:
            if id(n) not in known:
                n.metadata["torchscope_higher_order"] = True
                n_new += 1
        _higher_order_marked = _higher_order_marked or n_new > 0
        return n_new

    def interior(self) -> int:
        """Nodes other than AccumulateGrad: what a kept graph holds of its own (a parameter's
        AccumulateGrad is one node shared by every graph that reaches it, P7 counts it no more)."""
        return len(self.nodes) - sum(1 for n in self.nodes if type(n) is _ACCUMULATE)

    def signature(self) -> str:
        """Hash of node classes and edges: changes exactly when the graph's structure does.

        A steady loop builds the same structure every step: the (classes, edges) tuple is
        hashed and compared in C, and the stable digest is computed once per structure."""
        key = (tuple(map(type, self.nodes)), tuple(self.flat))
        sig = _sig_cache.get(key)
        if sig is None:
            h = hashlib.blake2b(digest_size=8)
            h.update("|".join([_names.get(t) or _name_of(t) for t in key[0]]).encode())
            h.update(array("q", self.flat).tobytes())
            sig = h.hexdigest()
            if len(_sig_cache) >= 8:  # a key is as big as its graph: keep few (a loop has few shapes)
                _sig_cache.clear()
            _sig_cache[key] = sig
        return sig

    def records(
        self,
        param_names: dict[int, str],
        op_module: Callable[[int], str],
        micro: int,
        sid: Callable[[int], int],
        ops: dict[int, int],
        held_as: Callable[[torch.Tensor], str | None] | None = None,
        near: dict[int, int] | None = None,
    ) -> list[NodeRecord]:
        """Full node records: class, parameter of AccumulateGrad, saved tensors (bytes only) and
        other saved attributes (stride, dim...), forward op (``ops``: node index -> the op that
        made it, from the op recorder; ``near``: node index -> an op of the module it was made
        in, for a node no op made -- a custom autograd.Function's)."""
        out: list[NodeRecord] = []
        # (record, its Parameter) of AccumulateGrad nodes of Parameters not the model's
        self.unregistered: list[tuple[NodeRecord, weakref.ref[torch.Tensor]]] = []
        fields, self._fields = self._fields, None
        # a node's metadata dict is made on first read: read only once a create_graph pass marked some
        marked = _higher_order_marked
        for i, n in enumerate(self.nodes):
            rec: NodeRecord = {"id": i, "name": type(n).__name__, "micro": micro}
            var = getattr(n, "variable", None)
            if isinstance(var, torch.Tensor):
                name = param_names.get(id(var))
                if name is not None:
                    rec["param"] = name
                    rec["module"] = name.rpartition(".")[0]  # the parameter's owning module
                elif isinstance(var, torch.nn.Parameter):
                    # a Parameter the model does not hold: kept only if no optimizer steps it
                    # either (Watch._owned_elsewhere, at the step's end; weakly until then)
                    rec["unregistered"] = True
                    self.unregistered.append((rec, weakref.ref(var)))
                elif held_as is not None and (at := held_as(var)) is not None:
                    # a tensor a module holds that requires grad, not a Parameter: the same, by its name
                    rec["unregistered"] = True
                    rec["held_as"] = at
                    self.unregistered.append((rec, weakref.ref(var)))
            if marked and n.metadata.get("torchscope_higher_order"):
                rec["higher_order"] = True
            op = ops.get(i)
            if op is not None:
                rec["op"] = op
                rec["module"] = op_module(op)
            elif near and (made_in := near.get(i)) is not None:
                rec["module"] = op_module(made_in)
            _loss_facts(n, rec)
            if _checkpointed(n):
                rec["checkpointed"] = True
            attrs = _attrs_of(n)
            if attrs:
                rec["attrs"] = attrs
            node_fields = fields[i] if fields is not None else _saved_of(n)
            saved = _saved_tensors(node_fields, sid) if node_fields else None
            if saved:
                rec["saved"] = saved
                seen: set[int] = set()
                total = 0
                for s in saved:
                    if s["storage"] not in seen:
                        seen.add(s["storage"])
                        total += s["nbytes"]
                rec["saved_bytes"] = total
            out.append(rec)
        return out


# at::Reduction, as loss nodes save it
_REDUCTIONS: dict[int, Literal["none", "mean", "sum"]] = {0: "none", 1: "mean", 2: "sum"}
_BY_NUMBER = frozenset({"DivBackward0", "MulBackward0"})
# by a Scalar argument (``aten::mul.Scalar``): what a composite op multiplies by -- the (1 - e)
# and e / C weights of cross_entropy's label smoothing
_BY_SCALAR = frozenset({"DivBackward1", "MulBackward1"})


def _loss_facts(n: Any, rec: NodeRecord) -> None:
    """How a loss is scaled, which no shape or byte count tells (P15): a loss node's
    reduction, and the number a scalar loss is divided or multiplied by (``loss / k``)."""
    name = rec["name"]
    if name in _BY_NUMBER:
        if getattr(getattr(n, "_raw_saved_other", None), "unpack_hook", None) is not None:
            # packed by a saved_tensors_hooks pair: unpacking runs its hook, and a non-reentrant
            # checkpoint's recomputes its segment -- a BatchNorm in it updated its running
            # statistics once more each captured step (QA 46b).  Not read (see _held).
            return
        try:
            other = getattr(n, "_saved_other", None)
        except RuntimeError:  # modified in place since it was saved: the backward fails on it (P8)
            return
        # a Python number is a 0-dim CPU tensor; a 0-dim CUDA one would cost a host sync
        if isinstance(other, torch.Tensor) and other.dim() == 0 and other.device.type == "cpu":
            rec["scalar"] = float(other.detach())  # a learned scale (spectral_norm's sigma) requires grad
    elif name in _BY_SCALAR:
        other = getattr(n, "_saved_other", None)
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            rec["scalar"] = float(other)
    elif name.endswith("LossBackward0") or name.startswith(("NllLoss", "BinaryCrossEntropy")):
        red = _REDUCTIONS.get(getattr(n, "_saved_reduction", -1))
        if red is not None:
            rec["reduction"] = red


def _saved_tensors(fields: Iterable[_Field], sid: Callable[[int], int]) -> list[SavedTensor]:
    out: list[SavedTensor] = []
    for attr, held in fields:
        if isinstance(held, Exception):  # freed by an earlier backward, or not readable: bytes unknown
            continue
        for t, parts in held:  # one storage; a DTensor's is its local shard's
            dtype = _dtype_names.get(t.dtype)
            if dtype is None:
                dtype = _dtype_names[t.dtype] = str(t.dtype).removeprefix("torch.")
            out.append(
                {
                    "name": attr,
                    "shape": list(t.shape),
                    "dtype": dtype,
                    "nbytes": parts[0][1] if len(parts) == 1 else sum(p[1] for p in parts),
                    "storage": sid(parts[0][0] if parts else 0),
                    "offset": int(t.storage_offset()),
                    "stride": list(t.stride()),
                }
            )
    return out


_dtype_names: dict[torch.dtype, str] = {}


class BackwardTimer:
    """Order and duration of each node during one backward, from one pre-hook per node.

    The engine runs a device's nodes one after another, so a node's duration is the time
    from its start to the next node's start (the last one's: to the backward's return):
    one hook call per node instead of a pre- and a post-hook."""

    def __init__(
        self,
        nodes: list[Any],
        timed_elsewhere: set[int] | frozenset[int] = frozenset(),
        started: Callable[[int], None] | None = None,
    ) -> None:
        self.started = started  # told each node's index as it starts
        self.order: dict[int, int] = {}
        self.dur_us: dict[int, float] = {}
        self._starts: list[tuple[int, float]] = []  # (node, start) in execution order
        self._handles: list[Any] = []
        for i, n in enumerate(nodes):
            if i in timed_elsewhere:
                continue  # the native recorder times it (see remove)
            try:
                self._handles.append(n.register_prehook(self._pre(i)))
            except Exception:
                continue

    def _pre(self, i: int) -> Any:
        starts = self._starts
        started = self.started

        def hook(grad_outputs: Any) -> None:
            starts.append((i, time.perf_counter()))
            if started is not None:
                started(i)

        return hook

    def remove(self, end: float, timed: Sequence[tuple[int, float, float]] = ()) -> None:
        """Remove the hooks; ``end``: when the backward returned (the last node's end);
        ``timed``: (node, start, end) of the nodes timed elsewhere, on the same clock."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        exact = {i: t1 - t0 for i, t0, t1 in timed}
        starts = self._starts
        if timed:
            starts += [(i, t0) for i, t0, _ in timed]
            starts.sort(key=lambda s: s[1])
        for k, (i, t0) in enumerate(starts):
            if i in self.order:
                continue  # a node runs once per backward; keep its first start all the same
            self.order[i] = len(self.order)
            t1 = starts[k + 1][1] if k + 1 < len(starts) else end
            self.dur_us[i] = exact.get(i, t1 - t0) * 1e6
        starts.clear()


class NonFiniteOrigin:
    """The nodes that turned finite incoming gradients into NaN or Inf during one backward, in
    execution order: where a NaN born in the backward (the gradient of ``sqrt`` or a norm at
    zero, ``log`` at a zero that ``torch.where`` masked in the forward, ...) began.

    One post-hook per node, each reading its tensors on the host: installed only on the steps
    armed for NaN checks (the first captured step, the step after a non-finite one)."""

    def __init__(self, nodes: list[Any]) -> None:
        self.made: list[int] = []
        self._handles: list[Any] = []
        for i, n in enumerate(nodes):
            if type(n).__name__ == "AccumulateGrad":
                continue  # it makes no gradient of its own: its input is a parameter's .grad
            try:
                self._handles.append(n.register_hook(self._post(i)))
            except Exception:
                continue

    def _post(self, i: int) -> Any:
        made = self.made

        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            try:
                with _native.unrecorded(), labelled("nan_origin"):  # full mode records the backward's ops: not these
                    if _finite(grad_outputs) and not _finite(grad_inputs):
                        made.append(i)
            except Exception:  # a tensor subclass without isfinite: that node is not checked
                pass

        return hook

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _finite(grads: Any) -> bool:
    """No NaN/Inf in ``grads``' plain dense tensors.  A subclass (a jagged nested tensor,
    DTensor) or a sparse layout is not read: with the dispatch modes off, as these hooks run
    them, a subclass's op does not reach its own dispatch (an NJT crashed the process)."""
    return all(
        bool(torch.isfinite(t).all())
        for t in grads
        if type(t) is torch.Tensor and t.layout == torch.strided and (t.is_floating_point() or t.is_complex())
    )
