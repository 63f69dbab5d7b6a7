"""Forward (and, in full mode, backward) ops of a captured step, at the aten level.

A ``TorchDispatchMode`` sees every op after autograd, with real tensors.  For each op it
records the module it ran in, tensor metadata, the user's source line, its duration and a
storage ledger: a storage first seen as an op output is an allocation; its free is noticed
by a weakref callback on the tensors that share it.  Autograd attaches ``grad_fn`` only after
the op returns, so the link op -> node is made lazily at the next op (and at the end) by
stamping the node's ``metadata``; the graph walk reads the stamp back.  No tensor is held
strongly: the tensor table keeps weak references only.
"""

from __future__ import annotations

import bisect
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.autograd.function import BackwardCFunction
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from ._memory import _PLAIN, storage_parts
from ._overlap import Region, itemsize, region, writes_saved
from ._profiled import labelled
from ._srcloc import op_src, user_src
from .schema import NAN_SOURCE_OPS, UNINITIALISED_OPS

if TYPE_CHECKING:
    from ._autograd import AutogradWalk

_op_names: dict[Any, tuple[str, bool, bool]] = {}
# Not the user's computation: ``record_function`` markers (optimizer.zero_grad/step wrap
# themselves in one) would show up as ops with no tensors
_SKIP_PREFIXES = ("profiler::",)


def _op_info(func: Any) -> tuple[str, bool, bool]:
    """('aten::addmm', is_inplace, skip) for an OpOverload, cached."""
    info = _op_names.get(func)
    if info is None:
        schema = func._schema
        mutates = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        info = (schema.name, mutates, schema.name.startswith(_SKIP_PREFIXES))
        _op_names[func] = info
    return info


_clock_ns = time.perf_counter_ns
# An ``OpRecord`` / ``TensorMeta`` of the schema, holding tuples where the schema has lists:
# the same JSON arrays once written (see OpRecorder.__init__ for why tuples)
Record = dict[str, Any]


class StorageIds:
    """Small integer ids for storages (by data pointer), stable within one graph event."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}

    def __call__(self, ptr: int) -> int:
        i = self.ids.get(ptr)
        if i is None:
            i = self.ids[ptr] = len(self.ids)
        return i


_peek_seq: Callable[[], int] = torch._C._autograd._get_sequence_nr  # the next node's number, this thread


class OpRecorder(TorchDispatchMode):
    """Records ops while entered.  Fields follow ``schema.OpRecord`` / ``schema.TensorMeta``."""

    def __init__(
        self,
        module_of: Callable[[], tuple[str, int, bool, str]],
        param_names: dict[int, str],
        baseline_live: int,
        check_nan: bool,
        max_ops: int,
        sid: StorageIds,
    ) -> None:
        super().__init__()
        self.module_of = module_of
        self.param_names = param_names
        self.check_nan = check_nan
        self.max_ops = max_ops
        self.sid = sid
        self.ops: list[Record] = []  # schema.OpRecord each
        self.tensors: list[Record] = []  # schema.TensorMeta each
        self.timeline: list[tuple[int, int]] = []  # built by finish() from _timeline_ops/_live
        # Every container made per op is garbage-collector work for the whole process (a
        # captured transformer step makes thousands): the hot path below keeps parallel
        # lists/dicts of ints instead of a tuple, closure or small list per tensor, and the
        # records hold tuples where the schema has lists (the same JSON arrays): a tuple of
        # ints leaves the collector's tracking at its first pass, a list never does, and the
        # records outlive the step, so every tracked one would end up in the costly full
        # collections (~100 ms each on a transformer's process, every 10-20 captured steps).
        self._timeline_ops: list[int] = []
        self._timeline_live: list[int] = []
        self.shed = 0
        self.phase = "forward"
        self.micro = 0
        self.live = baseline_live
        self.baseline = baseline_live  # parameters, gradients, optimizer state and inputs when recording began
        self._tid: dict[int, int] = {}  # id(tensor) -> tensor table index, while _tref[id] is it
        self._tref: dict[int, weakref.ref[torch.Tensor]] = {}
        self._storage_refs: dict[int, int] = {}  # data ptr -> live tensors we know share it
        self._storage_bytes: dict[int, int] = {}
        self._weak: list[weakref.ref[torch.Tensor]] = []  # keeps the ledger's weakrefs (and callbacks) alive
        self._weak_ptr: dict[int, int] = {}  # id(weakref) -> storage data ptr
        self._on_free = self._freed_ref  # one bound method for every ledger weakref
        self._freed = 0
        self._freed_ids: list[int] = []  # their storage ids (OpRecord.freed)
        self._pending_ops: list[int] = []  # (op id, output) pairs whose grad_fn is not set yet
        self._pending_refs: list[weakref.ref[torch.Tensor]] = []
        self.nan_seen = False
        self.paused = False  # the capture's own ops (activation-grad stats) are not the user's
        # > 0 while the user's own cast (``.to()``, ``.half()``...) runs: its ``_to_copy`` is
        # theirs; one made with this at 0 inside an autocast region is autocast's (M7)
        self.explicit_casts = 0
        # whether an autocast region is on, as the function mode saw it at the torch-level call
        # this op came from: under dispatch, an autocast kernel has switched it off for the ops
        # it redispatches (its casts among them), so it cannot be asked here
        self.autocast = False
        self.autocast_seen = False
        self.failed: str | None = None
        # (the thread's autograd sequence counter as it ran, op id) of the forward ops: below
        # autograd, an op runs before the nodes it makes (node_links)
        self._seqs: list[tuple[int, int]] = []
        self.near: dict[int, int] = {}  # node index -> an op of the module it was made in (node_links)

    # ------------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        info = _op_names.get(func) or _op_info(func)
        if self.failed is not None or self.paused or info[2]:
            return func(*args, **kwargs)  # torchscope runs your call unchanged
        t0 = _clock_ns()
        out = func(*args, **kwargs)  # torchscope runs your call unchanged
        dur = (_clock_ns() - t0) / 1000  # microseconds, at most 3 decimals: no round() per op
        try:
            self._record(info, args, kwargs, out, dur)
        except Exception as exc:  # capture must never break the user's op
            self.failed = repr(exc)
        return out

    def _record(self, info: tuple[str, bool, bool], args: Any, kwargs: Any, out: Any, dur: float) -> None:
        if self._pending_ops:
            self._link_pending()
        if len(self.ops) >= self.max_ops:
            self.shed += 1
            return
        name, inplace, _ = info
        in_t = _tensors(args, kwargs.values() if kwargs else ())
        if name == "aten::detach" and self._saving_output(in_t):
            # not an op, but its alias keeps the storage alive: the ledger watches it too
            # (AccumulateGrad's ``.grad`` is such a detach of the backward's result: watched by
            # the result alone, a step's gradients read as freed as the backward ended)
            if isinstance(out, torch.Tensor) and has_storage(out):
                self._ledger(out, out.untyped_storage(), in_t)
            return
        module, call, inside, module_src = self.module_of()
        out_t = [out] if isinstance(out, torch.Tensor) else _tensors(out if isinstance(out, (tuple, list)) else (), ())
        op_id = len(self.ops)
        inputs = tuple(map(self._tensor, in_t))
        alloc = 0
        outputs = []
        for t in out_t:
            # one storage object per output serves the ledger and the tensor table
            st = t.untyped_storage() if has_storage(t) else None
            alloc += self._ledger(t, st, in_t)
            outputs.append(self._tensor(t, st))
        freed, self._freed = self._freed, 0
        freed_ids, self._freed_ids = self._freed_ids, []
        self.live += alloc - freed
        flags: list[str] = []
        grad_mode = torch.is_grad_enabled()
        if not inside:
            flags.append("outside_model")
        if inplace:
            flags.append("inplace")  # "inplace_saved" is added once the graph is read (flag_inplace_saved)
        # autograd attaches a grad_fn to the outputs only if an input requires grad
        differentiable = grad_mode and any(t.requires_grad for t in in_t)
        if differentiable and out_t and not any(t.is_floating_point() or t.is_complex() for t in out_t):
            flags.append("non_differentiable")
        if self.autocast and self.phase == "forward":  # autocast does not apply to backward
            flags.append("autocast")
            self.autocast_seen = True
            if (
                name == "aten::_to_copy"
                and not self.explicit_casts
                and out_t
                and out_t[0].dtype != in_t[0].dtype
            ):
                flags.append("autocast_cast")
        source = self.phase == "forward" and name in NAN_SOURCE_OPS
        if (self.check_nan or source) and name not in UNINITIALISED_OPS:
            for t in out_t:
                # a wrapper subclass's outputs are checked as its plain inner ops' (a DTensor's
                # check of its own could need a collective)
                if type(t) not in _PLAIN or t.is_meta:  # a meta tensor (tracing) holds no values
                    continue
                if (t.is_floating_point() or t.is_complex()) and t.numel() and not _finite(t):
                    self.nan_seen = True
                    # a NaN source checked for itself (check_nan off) made the NaN/Inf only if it
                    # came in through none of its inputs: `loss / accum_steps` of a NaN loss did not
                    if self.check_nan or not _nonfinite_input(in_t, out_t, _has_nan(t)):
                        flags.append("nan")
                    break
        rec: Record = {
            "id": op_id,
            "name": name,
            "module": module,
            "call": call,
            "phase": self.phase,
            "micro": self.micro,
            "inputs": inputs,
            "outputs": tuple(outputs),
            "grad_mode": grad_mode,
            "inference_mode": torch.is_inference_mode_enabled(),
            "inplace": inplace,
            "src": op_src(module_src),
            "dur_us": dur,
            "alloc": alloc,
            "free": freed,
            "live": self.live,
        }
        if freed_ids:
            rec["freed"] = freed_ids
        if flags:
            rec["flags"] = tuple(flags)
        self.ops.append(rec)
        self._timeline_ops.append(op_id)
        self._timeline_live.append(self.live)
        if self.phase == "forward":
            self._seqs.append((_peek_seq(), op_id))
        if differentiable and self.phase == "forward":
            for t in out_t:
                self._pending_ops.append(op_id)
                self._pending_refs.append(weakref.ref(t))  # the same object as _tref's: no new one

    def _saving_output(self, in_t: list[torch.Tensor]) -> bool:
        """An ``aten::detach`` of an output the op just recorded made: autograd saving that result
        for backward (ReLU, Tanh, softmax, exp save their own output), which a Python dispatch mode
        sees as an op of its own and the C++ recorder does not.  Recorded, it read as a cut of the
        graph: P1 blamed a ``.detach()`` the user never wrote (QA 40a).  A ``.detach()`` of the
        user's comes after the function mode's marker (``torch::Tensor.detach``), never right
        after the op."""
        last = self.ops[-1] if self.ops else None
        if last is None or len(in_t) != 1 or last["name"].startswith("torch::"):
            return False
        t = in_t[0]
        ref = self._tref.get(id(t))
        return ref is not None and ref() is t and self._tid[id(t)] in last["outputs"]

    def add_marker(self, name: str, t: torch.Tensor, flags: list[str]) -> None:
        """A torch-level event seen by the function mode (``.item()``, ``detach()``...) as an op."""
        if len(self.ops) >= self.max_ops:
            self.shed += 1
            return
        module, call, inside, _ = self.module_of()
        rec: Record = {
            "id": len(self.ops),
            "name": name,
            "module": module,
            "call": call,
            "phase": self.phase,
            "micro": self.micro,
            "inputs": (self._tensor(t),),
            "outputs": (),
            "grad_mode": torch.is_grad_enabled(),
            "inplace": False,
            "src": user_src(2),
            "dur_us": 0.0,
            "alloc": 0,
            "free": 0,
            "live": self.live,
            "flags": tuple(flags) if inside else (*flags, "outside_model"),
        }
        self.ops.append(rec)

    # ------------------------------------------------------------------ tensors and storages
    def _tensor(self, t: torch.Tensor, st: Any = None) -> int:
        key = id(t)
        ref = self._tref.get(key)
        if ref is not None and ref() is t:
            return self._tid[key]
        tid = len(self.tensors)
        meta: Record = {
            "id": tid,
            # torch.Size is a tuple subclass, which the collector keeps tracking
            "shape": tuple(t.shape) if t.layout == _STRIDED else _loose_shape(t),
            "dtype": _dtype_names.get(t.dtype) or _dtype_name(t.dtype),
            "device": _device_names.get(t.device) or _device_name(t.device),
            "requires_grad": t.requires_grad,
            "is_leaf": t.is_leaf,
        }
        if st is not None or has_storage(t):
            st = st if st is not None else t.untyped_storage()
            meta["stride"] = t.stride()
            meta["storage"] = self.sid(st.data_ptr())
            meta["offset"] = int(t.storage_offset())
            meta["nbytes"] = st.nbytes()
        try:  # noqa: SIM105 -- free when nothing is raised, unlike contextlib.suppress (hot path)
            meta["version"] = int(t._version)
        except Exception:  # tensors without a version counter (inference)
            pass
        pname = self.param_names.get(id(t))
        if pname is not None:
            meta["param"] = pname
        self.tensors.append(meta)
        self._tid[key] = tid
        self._tref[key] = weakref.ref(t)
        return tid

    def _ledger(self, t: torch.Tensor, st: Any, inputs: list[torch.Tensor]) -> int:
        """Bytes newly allocated if ``t``'s storage ``st`` is new (None: not strided, no
        storage); track its lifetime by weakref.  An output in an input's storage that the
        ledger does not watch (a view of a parameter, of a flat buffer's slice, an in-place
        add into a gradient bucket) is that input's memory, allocated before: not new."""
        if st is None:
            return 0
        ptr = st.data_ptr()
        n = self._storage_refs.get(ptr)
        new = 0
        if n is None:
            if any(has_storage(x) and x.untyped_storage().data_ptr() == ptr for x in inputs):
                return 0
            nbytes = st.nbytes()
            self._storage_bytes[ptr] = nbytes
            self._storage_refs[ptr] = 0
            new = nbytes
        else:
            ref = self._tref.get(id(t))
            if ref is not None and ref() is t:
                return 0  # an in-place op returns its input: nothing new
        self._storage_refs[ptr] += 1
        wr = weakref.ref(t, self._on_free)
        self._weak.append(wr)
        self._weak_ptr[id(wr)] = ptr
        return new

    def untracked_free(self, nbytes: int) -> None:
        """Bytes of the baseline freed outside any op (a ``.grad`` that ``zero_grad()`` dropped):
        a free of the next op, with no storage id of the step's."""
        self._freed += nbytes

    def follow(self, t: torch.Tensor, nbytes: int, counted: bool) -> bool:
        """The ledger follows ``t``'s storage from now on, as if an op had made it: freed when
        ``t`` dies.  A tensor made outside any op -- a forward's input batch, made by the data
        loader -- of ``nbytes`` (a slice of a dataset: the part it spans); ``counted``: its bytes
        are in the baseline already, else live from the next op on (no op's allocation).
        False where the ledger follows that storage already (an op's output) or ``t`` has none."""
        if not has_storage(t):
            return False
        ptr = t.untyped_storage().data_ptr()
        if ptr in self._storage_refs:
            return False
        self._storage_bytes[ptr] = nbytes
        self._storage_refs[ptr] = 1
        wr = weakref.ref(t, self._on_free)
        self._weak.append(wr)
        self._weak_ptr[id(wr)] = ptr
        if not counted:
            self.live += nbytes
        return True

    def _freed_ref(self, wr: Any) -> None:
        """A tensor the ledger watched died: its storage is freed with the last of them."""
        ptr = self._weak_ptr.pop(id(wr), None)
        if ptr is None:
            return
        n = self._storage_refs.get(ptr, 0) - 1
        if n <= 0:
            self._storage_refs.pop(ptr, None)
            self._freed += self._storage_bytes.pop(ptr, 0)
            self._freed_ids.append(self.sid(ptr))
        else:
            self._storage_refs[ptr] = n

    def _link_pending(self) -> None:
        """Stamp each earlier op's output grad_fn with the op id (autograd has set it by now),
        and the output's ``requires_grad`` and ``is_leaf`` in the tensor table: a dispatch mode
        sees the output before autograd attaches its grad_fn, so every output read
        ``requires_grad`` false and ``is_leaf`` true -- and the rules that follow the gradient
        through the table (P18) found nothing without the C++ recorder (QA 49d)."""
        if not self._pending_ops:
            return
        ops, refs = self._pending_ops, self._pending_refs
        self._pending_ops, self._pending_refs = [], []
        for op_id, ref in zip(ops, refs, strict=True):
            t = ref()
            if t is None:
                continue
            fn = t.grad_fn
            if fn is not None:
                meta: dict[str, Any] = fn.metadata  # type: ignore[assignment]
                if "torchscope_op" not in meta:
                    meta["torchscope_op"] = op_id
                tid = self._tid.get(id(t))
                if tid is not None:
                    meta.setdefault("torchscope_tensors", []).append(tid)
                    self.tensors[tid]["requires_grad"] = t.requires_grad
                    self.tensors[tid]["is_leaf"] = False

    # the records as the watch reads them during the step (the native recorder's interface)
    @property
    def n_ops(self) -> int:
        return len(self.ops)

    def op_module(self, op: int) -> str:
        return str(self.ops[op].get("module", "")) if 0 <= op < len(self.ops) else ""

    def cast_ops(self) -> set[int]:
        """Ids of the casts autocast made (``autocast_cast``)."""
        return {o["id"] for o in self.ops if "autocast_cast" in o.get("flags", ())}

    def set_grad_fn(self, tid: int, node: int) -> None:
        """Tensor ``tid`` is an output of graph node ``node``."""
        if 0 <= tid < len(self.tensors):
            self.tensors[tid]["grad_fn"] = node

    def flag_inplace_saved(self, saved: dict[int, list[tuple[int, Region]]]) -> int:
        """P8's silent form: flags "inplace_saved" on each forward in-place op (an aten op named
        "..._": it writes its first argument) that ran after the graph node which saved a
        tensor of the bytes it writes -- a ``.data`` write, which the saved tensor's version
        counter does not see (``_overlap``: the same storage is not enough).  ``saved``:
        storage id -> (the op whose node saved it, the region saved) of each saved tensor."""
        n = 0
        for op in self.ops:
            # forward ops only: the backward's own in-place accumulations write buffers whose
            # storage may reuse a freed saved tensor's address
            inputs = op.get("inputs") if op.get("inplace") and op.get("phase") == "forward" else None
            if not inputs or not str(op["name"]).endswith("_"):
                continue
            t = self.tensors[inputs[0]]
            regions = saved.get(t["storage"]) if "storage" in t else None
            if not regions or "offset" not in t or "stride" not in t:
                continue
            target = region(t["offset"], t["shape"], t["stride"], itemsize(t["dtype"]))
            if writes_saved(regions, op["id"], target):
                op["flags"] = (*op.get("flags", ()), "inplace_saved")
                n += 1
        return n

    def peak_live(self, since: int = 0, until: int | None = None) -> int:
        """The ledger's highest live bytes over the recorded ops (those of ids ``since`` to
        ``until``; 0 when none is)."""
        ops = self.ops[since:until]
        return max(o["live"] for o in ops) if ops else 0

    def payload(self) -> tuple[Any, Any]:
        """The graph event's ``ops`` and ``tensors`` (call after ``finish``)."""
        return self.ops, self.tensors

    def node_links(self, walk: AutogradWalk) -> tuple[dict[int, int], dict[int, list[int]]]:
        """For each graph node (by index) the op that made it and that op's output tensors,
        from the stamps ``_link_pending`` left in the nodes' metadata; a node no output links,
        by the sequence counter (``_made_by``)."""
        ops: dict[int, int] = {}
        tensors: dict[int, list[int]] = {}
        unlinked: list[int] = []
        for i, n in enumerate(walk.nodes):
            meta = n.metadata
            op = meta.get("torchscope_op")
            if op is not None:
                ops[i] = op
            elif self._seqs:
                unlinked.append(i)
            tids = meta.get("torchscope_tensors")
            if tids:
                tensors[i] = tids
        self.near = {}
        if unlinked:
            self._made_by(walk, unlinked, ops)
        return ops, tensors

    def _made_by(self, walk: AutogradWalk, unlinked: list[int], ops: dict[int, int]) -> None:
        """As the native recorder's ``made_by``, from below autograd, where an op runs before
        the nodes it makes: a custom ``autograd.Function``'s node (made by ``apply``, before the
        ops of its forward) takes the module of the op the counter shows right after it; another
        (an in-place op on a view makes its ``CopySlices``) was made by the last op before it,
        when an op follows."""
        seqs = walk.seqs()
        firsts = [seq for seq, _ in self._seqs]
        for i in unlinked:
            s = seqs[i]
            k = bisect.bisect_right(firsts, s)  # ops [0, k) ran before the counter passed s
            if s < 0 or k == 0:
                continue
            if isinstance(walk.nodes[i], BackwardCFunction):
                if k < len(firsts) and firsts[k] == s + 1:
                    self.near[i] = self._seqs[k][1]
            elif k < len(firsts):
                ops[i] = self._seqs[k - 1][1]

    def finish(self) -> None:
        """Link the last ops and stop watching frees (later frees are not this step's)."""
        self._link_pending()
        self._weak.clear()
        self._weak_ptr.clear()
        self._tid.clear()
        self._tref.clear()
        self.timeline = list(zip(self._timeline_ops, self._timeline_live, strict=True))



def _autocast_on_fast() -> bool:
    """Whether an autocast region is on for the CPU or CUDA (at the torch-function level)."""
    return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")


def _autocast_on_old() -> bool:
    """The same on torch 2.3, which has no per-device query: CUDA's region and the CPU's."""
    return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()


def autocast_dtype() -> str | None:
    """The dtype an autocast region that is on casts to ("float16", "bfloat16"), CUDA's first;
    None when none is on or this torch cannot tell.  Asked once per step, at the forward that
    finds a region on (P14: float16 without a GradScaler)."""
    try:
        for device in ("cuda", "cpu"):
            if torch.is_autocast_enabled(device):
                return str(torch.get_autocast_dtype(device)).removeprefix("torch.")
    except (TypeError, RuntimeError, AttributeError):  # torch 2.3: no per-device query
        return None
    return None


# asked at every torch-level call of a recorded pass: one function chosen once, no loop, no try
try:
    _autocast_on_fast()
    autocast_on = _autocast_on_fast
except (TypeError, RuntimeError):
    autocast_on = _autocast_on_old


_STRIDED = torch.strided


def _loose_shape(t: torch.Tensor) -> tuple[int, ...]:
    """The shape of a sparse or nested tensor, its ragged dimensions (a jagged nested tensor's
    symbolic sequence lengths, which JSON cannot hold) as -1."""
    return tuple(d if type(d) is int else -1 for d in t.shape)


def has_storage(t: torch.Tensor) -> bool:
    """Strided with a real storage of its own: not sparse, not one of forward-mode AD's
    ZeroTensors (``torch.func.jvp``'s zero tangents) and not a wrapper subclass (a DTensor),
    whose storages raise when their address is read."""
    if t.layout != torch.strided or t._is_zerotensor():
        return False
    return type(t) in _PLAIN or bool(storage_parts(t)) and not is_traceable_wrapper_subclass(t)


def _nonfinite_input(ins: list[torch.Tensor], outs: list[torch.Tensor], nan_out: bool = False) -> bool:
    """Whether a floating input of an op whose output is non-finite already held NaN/Inf: the op
    passed it on, it did not make it -- for a NaN out (``nan_out``), a NaN in: an op that turns
    infinities into NaN made it (a softmax over a row masked wholly with -inf, inf / inf).  An
    input sharing an output's storage (an in-place op's ``self``, an ``out=``) holds the result,
    not what came in, and is not read.  Called only once an output was found non-finite: the
    common path reads no input."""
    held = {t.untyped_storage().data_ptr() for t in outs if has_storage(t)}
    for t in ins:
        if type(t) not in _PLAIN or t.is_meta or t.layout != torch.strided:
            continue
        if not (t.is_floating_point() or t.is_complex()) or not t.numel():
            continue
        if has_storage(t) and t.untyped_storage().data_ptr() in held:
            continue
        if _has_nan(t) if nan_out else not _finite(t):
            return True
    return False


def _tensors(args: Any, more: Any) -> list[torch.Tensor]:
    """Tensors among op arguments (aten arguments nest at most one list deep): faster than pytree."""
    out: list[torch.Tensor] = []
    tensor = torch.Tensor
    # a LazyModule's parameter being made (``materialize``) has no shape to record yet
    for group in (args, more):
        for a in group:
            if isinstance(a, tensor):
                if not isinstance(a, _LAZY):
                    out.append(a)
            elif type(a) is list or type(a) is tuple:
                for x in a:
                    if isinstance(x, tensor) and not isinstance(x, _LAZY):
                        out.append(x)
    return out


_LAZY = torch.nn.parameter.UninitializedTensorMixin  # type: ignore[attr-defined]
_dtype_names: dict[torch.dtype, str] = {}
_device_names: dict[torch.device, str] = {}


def _dtype_name(d: torch.dtype) -> str:
    n = _dtype_names.get(d)
    if n is None:
        n = _dtype_names[d] = str(d).removeprefix("torch.")
    return n


def _device_name(d: torch.device) -> str:
    n = _device_names.get(d)
    if n is None:
        n = _device_names[d] = str(d)
    return n


def _stored(t: torch.Tensor) -> torch.Tensor:
    """The values a tensor stores: a sparse one's (an ``Embedding(sparse=True)``'s gradient),
    which aminmax does not take -- its error turned the op capture off for the run."""
    if t.layout == torch.strided:
        return t
    return t._values() if t.layout == torch.sparse_coo else t.values()


def _has_nan(t: torch.Tensor) -> bool:
    """Whether ``t`` holds a NaN (its minimum or maximum is NaN: NaN propagates through aminmax)."""
    with torch._C._DisableTorchDispatch(), labelled("nan_check"):
        t = _stored(t)
        if t.is_complex():
            return bool(torch.isnan(t).any())
        lo, hi = torch.aminmax(t)
        return bool(torch.isnan(torch.stack((lo, hi))).any())


def _finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite: its minimum and maximum (NaN propagates through
    aminmax), not ``isfinite(t)``, a bool copy of the whole output on its device.  A plain
    tensor's: read with Python dispatch off, so the loop's own modes under ours (a FLOP
    counter) do not see these reads."""
    with torch._C._DisableTorchDispatch(), labelled("nan_check"):
        t = _stored(t)
        if t.is_complex():
            return bool(torch.isfinite(t).all())
        lo, hi = torch.aminmax(t)
        return bool(torch.isfinite(torch.stack((lo, hi))).all())
