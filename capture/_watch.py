"""``torchscope.watch(model, optimizer)``: the capture's one entry point.

Hooks, all removable, none patching torch:
- the root module's forward pre/post hooks (``always_call``): each forward's facts (P6, P11)
  and, on captured steps, the op recorder and per-module hooks for module paths;
- torch.optim's global step hooks: the watched optimizer's step is the step boundary (see
  ``_any_opt_pre``: without one, the optimizer that steps the model's parameters is followed;
  or ``Watch.step()``).  With a ``GradScaler`` that skips ``optimizer.step()`` the boundary is found
  at the next forward: ``scaler.update()`` changed its scale tensor (version counter, no
  sync) while a backward had run and no optimizer step followed -> the step closes as skipped;
- one ``TorchFunctionMode`` (``_interpose``) for backward calls, device moves and graph breaks.

Every hook body runs through ``_safe``: an exception inside capture is logged once and turns
that part of the capture off; the user's loop never sees it.  Tensors are reached through
weak references; graph nodes are held only during a backward call.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import inspect
import logging
import math
import os
import socket
import sys
import threading
import time
import types
import urllib.parse
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar, Literal, NamedTuple, cast

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.nn.utils import prune
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import _disable_current_modes

from . import _compile, _cuda, _native, _sigterm, _source, _warnings
from ._autograd import AutogradWalk, BackwardTimer, NonFiniteOrigin
from ._console import say
from ._evalprobe import EvalDropoutProbe
from ._fastpath import FAST_PATHS, FastPathGuard
from ._grads import GradRead, PiecewiseRead, StatsRead, count_nonzero, nonzero_grads
from ._holders import container_of, graph_lists
from ._hooks import Retained, retained
from ._interpose import Interposer, insert_mode, remove_mode
from ._memory import StorageSizes, grad_storages, optimizer_tensors, spanned, storage_parts, storages
from ._modhook import ModuleHook, assignment_hooks, hook_forward, hook_module
from ._native import NativeRecorder
from ._ops import OpRecorder, StorageIds, autocast_dtype, autocast_on
from ._overlap import Region, itemsize, region
from ._profiled import labelled, profiling
from ._profiled import unseen as _unseen  # (shared with the profiler ranges)
from ._record import claim_record, default_record
from ._srcloc import _is_internal, call_as_user, op_src, same_function, site_src, user_site, user_src
from .distributed import RankInfo, rank_info, session_id
from .schema import (
    CAPTURE_OFF,
    SCHEMA_VERSION,
    ActivationGrad,
    ActivationStats,
    ForwardInfo,
    GradStats,
    GraphEvent,
    GraphsKept,
    MemoryStats,
    ModuleInfo,
    NodeRecord,
    OpRecord,
    ParamInfo,
    StepEvent,
    TensorMeta,
)

log = logging.getLogger("torchscope")

MODES = ("default", "full", "light")
# parts of the capture that only compute on tensors (no mode pushed or popped: see _safe)
_PURE = frozenset({"grads", "activation_grads", "activations"})
_MAX_OPS = 50_000  # per captured step; the rest is counted as shed
_CALL_IMPL = nn.Module._call_impl.__code__  # the frame a module's call runs its hooks from
_MAX_FORWARDS = 1024  # forwards (or backward passes) one step holds before it is closed anyway
# input shapes whose saved bytes are remembered per structure: dynamic padding makes a shape
# per sequence length, and a shape not remembered costs a walk of the graph
_SAVED_SHAPES = 1024
_STRUCTURE_TRIES = 3  # captured steps spent on catching one new graph structure (_follow_structure)
_FAILURE_TRIES = 4  # captured steps spent on catching a failing backward (_follow_failure)
_MAX_STRUCTURES = 64  # graph structures captured on change; beyond, only the schedule captures
# captures for new structures: this many at first, then one more every this many steps
_CHANGE_CAPTURES_FIRST, _CHANGE_CAPTURES_EVERY = 8, 10
# Full gradient statistics (max |g|, mean, std, zero fraction: three more passes over every
# gradient) every this many steps, on captured steps, every step in full mode, and after a
# non-finite gradient; the other steps record norms, NaN/Inf counts and missing grads only.
GRAD_STATS_EVERY = 10
_FROZEN_CHECKS = frozenset((0, GRAD_STATS_EVERY, 2 * GRAD_STATS_EVERY))  # steps _frozen_moved reads frozen parameters at
_FROZEN_MAX = 4096  # the most frozen parameters it reads (one element each)
# forwards inside torch.func transforms before a run that has ended no step is told that its
# loop records none (a MAML outer step makes tens of them before its first step ends)
_TRANSFORMED_TELL = 100
COPY_STEPS = 4  # steps counted for copies before sampling every GRAD_STATS_EVERY (see _counts_copies)
# a function mode left on with the loop gone idle this long is taken off (Watch._idle)
_IDLE_S = 60.0
_BIG_COPY = 1 << 20  # bytes from which the same tensor cloned every step is P12's (see _on_move)
_PROBE_STEPS = 3  # steps the mode looks for the holder of a kept loss (Watch._probe)
# recurrent layers and attention drop out by an argument of their own, not a Dropout child
# (``LSTM(num_layers=2, dropout=0.25)``, ``MultiheadAttention(dropout=0.1)``): QA 42a's forgotten
# model.train() in such a model went unseen
_OWN_DROPOUT = (nn.RNNBase, nn.MultiheadAttention)
_MODE_SENSITIVE = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm, *_OWN_DROPOUT)


def _mode_inert(m: nn.Module) -> bool:
    """A module of ``_MODE_SENSITIVE`` whose mode changes nothing: a dropout of ``p=0`` (a
    transformer built with ``dropout=0.0``), an RNN of one layer (its dropout acts between
    layers) or none, batch statistics in both modes (``track_running_stats=False``)."""
    if isinstance(m, nn.modules.dropout._DropoutNd):
        return not m.p
    if isinstance(m, nn.RNNBase):
        return not m.dropout or m.num_layers == 1
    if isinstance(m, nn.MultiheadAttention):
        return not m.dropout
    return isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is None


def _extra_repr(m: nn.Module) -> str:
    """What the module says of itself in ``print(model)`` (``in_features=8, out_features=4,
    bias=True``), shortened; "" where it says nothing or its ``extra_repr`` fails (user code)."""
    if type(m).extra_repr is nn.Module.extra_repr:
        return ""
    try:
        text = str(m.extra_repr())
    except Exception:  # a user's extra_repr reading what is not there yet: nothing to show
        return ""
    return text if len(text) <= EXTRA_REPR_CHARS else text[:EXTRA_REPR_CHARS - 1] + "…"


EXTRA_REPR_CHARS = 240
METRICS_PER_CALL = 64  # names one log() call records (a dict of every layer's stat splatted in is cut)
METRIC_NAME_CHARS = 100


def _metric_value(value: Any) -> float | None:
    """A logged value as a float; None for what is no number (a string, a list, a big tensor)."""
    if isinstance(value, bool | int | float):
        return float(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        with _native.unrecorded():  # our read: no op of the step's graph, nor a FLOP counter's
            return float(value.detach().reshape(()).item())
    item = getattr(value, "item", None)  # a numpy scalar
    if callable(item) and not isinstance(value, torch.Tensor):
        try:
            got = item()
        except (TypeError, ValueError):
            return None
        return float(got) if isinstance(got, bool | int | float) else None
    return None
# activation-gradient slot whose hook has not run yet (no row: left out of the step's event)
_NO_STATS: tuple[float, ...] = ()
_GRAD_CONSTS = 64  # tensors followed from a torch.autograd.grad for inputs (_keep_grad_consts), at most
_T = torch.Tensor
_SCALES = frozenset((_T.__mul__, _T.__rmul__, _T.__truediv__, _T.mul, _T.div, torch.mul, torch.div))  # by a number
_ADDS = frozenset((_T.__add__, _T.__radd__, _T.__sub__, _T.__rsub__, _T.__iadd__, _T.__isub__, _T.add, _T.sub,
                   _T.add_, _T.sub_, torch.add, torch.sub))  # a term added to a loss
_CallKey = tuple[str, int, int]  # a module's path, its call in the step, which of its outputs
# a module's calls in one step whose output gradients are watched (an RNN cell over 1,000 time
# steps: a hook each on the first 32, told as one row with their count)
ACT_CALLS = 32
_STATS_DTYPES = (torch.float32, torch.float64)


class _Sentinel:
    """Lives in a backward root's (or a forward output's) ``metadata``: dies with the node, so
    a live weak reference at a later step boundary means that step's graph is still reachable (P7)."""

    __slots__ = ("step", "nodes", "saved", "usable", "output", "fed", "src", "held_at", "loss", "sized", "__weakref__")

    def __init__(self, step: int, nodes: int, src: str, output: bool = False) -> None:
        # src: the user's line of the backward (or of the forward, for an output) it belongs to
        self.step, self.nodes, self.src, self.output = step, nodes, src, output
        # nodes and saved bytes are the graph's own: not those of earlier steps' graphs it
        # contains (a recurrent state never detached nests every step's graph in the next);
        # saved: what its nodes still hold after the step (a backward without retain_graph frees it)
        self.saved = 0
        # a later backward can go through it: its own kept it (retain_graph=True), or none went
        # through it yet (an output); only such a graph can be inside a later one
        self.usable = output
        self.fed = False  # a later step's graph contains it: an output carried into the next forward
        self.held_at = ""  # the user's line of a call that took the loss into a new graph (total += loss)
        self.loss: weakref.ref[torch.Tensor] | None = None  # the backward's root, for what holds it (_held_in)
        self.sized = False  # an output's graph measured as its forward ended (built in eval mode or without grad)


class _Nested(NamedTuple):
    """What a backward's graph holds of earlier steps' graphs (``_nested``)."""

    nodes: int  # interior nodes of theirs it reaches
    saved: int  # bytes their nodes hold saved for backward
    # this step's forward outputs it reaches: (sentinel, own interior nodes, own saved bytes)
    outputs: list[tuple[_Sentinel, int, int]]


def _nested(walk: AutogradWalk, step: int, param_ptrs: set[int], frees: bool) -> _Nested:
    """Tell a backward's graph from the earlier steps' graphs inside it (a recurrent state
    never detached nests each step's graph in the next): the nodes below an earlier step's
    sentinel are theirs; the rest, this step's own -- and of those, each forward output's.
    Earlier sentinels found are marked ``fed``, and hold no saved bytes any more when this
    backward ``frees`` the graph (no retain_graph).  Reads every node's ``metadata`` (which
    makes one dict a node) and walks again: only while an earlier step's graph is alive, which
    a clean loop never has."""
    earlier: list[Any] = []
    outs: list[tuple[Any, _Sentinel]] = []
    for n in walk.nodes:
        md = n.metadata
        for key in ("torchscope_sentinel", "torchscope_out_sentinel"):
            sent = md.get(key)
            if not isinstance(sent, _Sentinel):
                continue
            if sent.step < step:
                earlier.append(n)
                sent.fed = True
                if frees:
                    sent.saved, sent.usable = 0, False
            elif key == "torchscope_out_sentinel":
                outs.append((n, sent))
    inner = AutogradWalk(earlier)
    theirs, _ = inner.saved(param_ptrs)
    outputs = []
    for node, sent in outs:
        part = AutogradWalk([node])
        mine, _ = part.saved(param_ptrs)
        nodes = sum(1 for n in part.nodes if n not in inner.index and type(n).__name__ != "AccumulateGrad")
        outputs.append((sent, nodes, sum(b for ptr, b in mine.items() if ptr not in theirs)))
    return _Nested(inner.interior(), sum(theirs.values()), outputs)


def _through_outputs(walk: AutogradWalk, s: _StepState) -> bool:
    """Whether ``walk`` passes through an output of this step's forwards of the model (or the
    node of a reentrant checkpoint that ran one: ``_watch_checkpoint``).  A
    model whose parameters are stand-ins during the forward -- FSDP2 gathers each layer's shards
    into a full parameter for it, and the backward accumulates into those -- has no
    ``AccumulateGrad`` of the watched parameters in its graph, yet the backward is its own."""
    outs = {id(o) for r in s.out_sentinels if (o := r()) is not None}
    return bool(outs) and any(id(n.metadata.get("torchscope_out_sentinel")) in outs for n in walk.nodes)


def _through_a_forward(walk: AutogradWalk, param_ids: dict[int, str]) -> bool:
    """Whether every watched parameter ``walk`` reaches lies behind the output of a recorded
    forward of the model, of any step: the backward goes through an earlier forward's retained
    graph, and no call of the model past its hooks (``model.forward(x)`` beside it, QA 47c) made
    a path of its own (asked only of a backward in a step with no forward of its own)."""
    f = walk.flat
    children: dict[int, list[int]] = {}
    for k in range(0, len(f), 3):
        children.setdefault(f[k], []).append(f[k + 1])
    parented = {f[k + 1] for k in range(0, len(f), 3)}
    todo = [i for i in range(len(walk.nodes)) if i not in parented]  # the roots
    seen, behind = set(todo), False
    while todo:
        n = walk.nodes[todo.pop()]
        if "torchscope_out_sentinel" in getattr(n, "metadata", {}):
            behind = True  # (what lies below it is that forward's)
            continue
        if id(getattr(n, "variable", None)) in param_ids:
            return False
        for j in children.get(walk.index[n], ()):
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return behind


def _reentrant_checkpoint_node() -> Any:
    """The node of the ``torch.utils.checkpoint`` reentrant function this forward runs inside
    (its ``ctx``: the grad_fn its outputs get), or None (asked only of a forward under no_grad)."""
    module = sys.modules.get("torch.utils.checkpoint")
    code = getattr(getattr(getattr(module, "CheckpointFunction", None), "forward", None), "__code__", None)
    frame: Any = sys._getframe(1)
    for _ in range(16):  # it calls the model's __call__ directly: a few frames up
        if frame is None or code is None:
            return None
        if frame.f_code is code:
            # (f_locals' snapshot holds the call's arguments until that frame returns, soon)
            ctx = frame.f_locals.get("ctx")
            return ctx if callable(getattr(ctx, "register_prehook", None)) else None
        frame = frame.f_back
    return None


def _saved_by_op(nodes: list[NodeRecord]) -> dict[int, list[tuple[int, Region]]]:
    """Storage id -> (forward op whose graph node saved it, the bytes saved) of each saved tensor."""
    saved: dict[int, list[tuple[int, Region]]] = {}
    for n in nodes:
        op = n.get("op")
        if op is None:
            continue
        for t in n.get("saved", ()):
            if "offset" in t and "stride" in t:
                r = region(t["offset"], t["shape"], t["stride"], itemsize(t["dtype"]))
                saved.setdefault(t["storage"], []).append((op, r))
    return saved


def _forward_pending(s: _StepState) -> bool:
    """A root-module forward of this step built a graph no backward has run through yet (as
    of the last backward's end: the native marks are read then, ``_reached``)."""
    return any(f["built_graph"] and not f["backward"] for f in s.forwards)


class _ThreadFlags(threading.local):
    """Per-thread flags read at every forward and step boundary; class-level defaults, since
    ``getattr(threading.local(), name, default)`` raises and catches inside (~1.3 us)."""

    pushed = False  # our function mode is on this thread's stack (_mode_on)
    eval_probe = False  # the eval-mode dropout probe is on this thread's stack (_on_forward_pre)
    skipped = 0  # root forwards of another thread being skipped (_fwd_pre)


_dispatch_modes = torch._C._len_torch_dispatch_stack


class _Together:
    """Optimizers seen as one for their state (optimizer in backward: one per parameter)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.state = {k: v for o in dict.fromkeys(optimizers) for k, v in o.state.items()}


class _StepState:
    """What the capture gathers between two step boundaries."""

    # slots: made at every step boundary (~45 attributes), read all through the step
    __slots__ = (
        "t0",
        "started",
        "capture",
        "check_nan",
        "forwards",
        "transformed",
        "node_hooks",
        "used",
        "marks",
        "out_sentinels",
        "holders",
        "asked",
        "unrestricted",
        "forward_us",
        "backward_us",
        "before_fwd_us",
        "opt_t0",
        "opt_fb0",
        "micro",
        "losses",
        "summed",
        "pass_summed",
        "tentative_from",
        "closure_reset",
        "roots",
        "backward_src",
        "backward_errors",
        "zero_grad",
        "set_to_none",
        "grad_mark",
        "accumulated",
        "step_began",
        "unregistered",
        "reached",
        "through_fn",
        "pre_nonzero",
        "pre_grads",
        "pre_checked",
        "copies",
        "copy_bytes",
        "track_copies",
        "noop_to",
        "noop_src",
        "clip_flagged",
        "clip",
        "restat",
        "moves",
        "conversions",
        "breaks",
        "events",
        "saved_peak",
        "sigs",
        "scale_version",
        "recorder",
        "sid",
        "module_stack",
        "module_calls",
        "node_module",
        "graph",
        "timer",
        "nan_origin",
        "walk",
        "stats",
        "before_create",
        "retained",
        "autocast",
        "autocast_dtype",
        "in_shapes",
        "in_refs",
        "act_grads",
        "native",
        "act_slots",
        "act_epoch",
        "act_numel",
        "act_calls",
        "out_stats",
        "out_numel",
        "out_calls",
        "out_versions",
        "upd_before",
        "fwd_t0",
        "saved_now",
        "checked",
        "in_backward",
        "unscaled",
        "lr",
        "grad_st",
        "rec_grads",
        "untracked",
        "in_st",
        "in_held",
        "in_known",
        "in_saved",
        "opt_from",
        "clipping",
        "grad_names",
    )

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.started = False
        self.capture = False
        self.check_nan = False
        self.forwards: list[ForwardInfo] = []
        self.transformed = 0  # forwards of the model inside a torch.func transform (not recorded)
        self.node_hooks: list[Any] = []
        self.used: dict[int, ForwardInfo] = {}  # token -> forward whose output a native hook watches
        # without the extension: a forward's mark, set by Python hooks on its output nodes, and those hooks
        self.marks: list[tuple[list[bool], ForwardInfo, list[Any]]] = []
        self.out_sentinels: list[weakref.ref[_Sentinel]] = []  # of this step's forward outputs
        # while probing (Watch._probing): one-value tensors with a graph the user's calls took
        # in before a backward, with the call's line -- the loss's holder, when it is the root
        self.holders: list[tuple[weakref.ref[torch.Tensor], str]] = []
        self.asked: set[int] | None = None  # parameters backward(inputs=...) asked for (_note_inputs)
        self.unrestricted = False  # a backward of this step asked for every gradient
        self.forward_us = 0.0
        self.backward_us = 0.0
        self.before_fwd_us: float | None = None  # from the step's start to its first forward (the next batch's fetch)
        self.opt_t0: float | None = None  # when the watched optimizer's step() began
        self.opt_fb0 = 0.0  # forward_us + backward_us then (a closure's inside step() are theirs)
        self.micro = 0
        self.losses: list[torch.Tensor] = []
        # indices in ``losses`` of the roots of the backwards that accumulated into the
        # gradients since they were last reset (not torch.autograd.grad's): the step's loss
        self.summed: list[int] = []
        self.pass_summed = 0  # len(summed) before the running backward's roots were added
        # inside optimizer.step(closure), passes after its first: the closure's micro-batches
        # (summed from this index on) unless it reset the gradients again (closure_reset: an
        # LBFGS re-evaluation, whose loss is not the step's); with no reset, each pass is told
        # apart from a micro-batch by nothing, and counts as a re-evaluation (the first pass's loss)
        self.tentative_from: int | None = None
        self.closure_reset = False
        self.roots: list[str] = []
        self.backward_src: list[str] = []
        self.backward_errors: list[str] = []
        self.zero_grad = 0
        self.set_to_none = False
        # (parameter index, its .grad's version counter) as the last backward left it: a
        # zero_grad(set_to_none=False) before the next one moves it (see _grads_reset)
        self.grad_mark: tuple[int, int] | None = None
        self.accumulated = 0  # backward passes summed into .grad since its last reset
        self.step_began: int | None = None  # backward passes before the optimizer's step() began
        # captured graph's AccumulateGrad records of Parameters not the model's, with the Parameter
        # (weakly): the step's end keeps the mark of those no optimizer stepped (_owned_elsewhere)
        self.unregistered: list[tuple[NodeRecord, weakref.ref[torch.Tensor]]] = []
        # light mode: names of the parameters whose AccumulateGrad the step's walked graphs hold
        # (None: no graph walked this step -- the last walk's structure ran again)
        self.reached: set[str] | None = None
        # of those, the ones reached through one custom autograd.Function only: name -> its class
        self.through_fn: dict[str, str] = {}
        self.pre_nonzero: list[int] = []
        # those gradients as the first backward found them (param index, the tensor, its
        # _version): one no backward of the step added onto is no accumulation (P5)
        self.pre_grads: list[tuple[int, weakref.ref[torch.Tensor], int]] = []
        self.pre_checked = False  # a backward returned since: pre_grads holds the untouched ones
        self.copies = 0
        self.copy_bytes = 0
        self.track_copies = True  # the mode watched the whole step for copies (see _opt_post)
        self.noop_to = 0
        self.noop_src = ""  # the line of the step's first no-op move
        self.clip_flagged = False
        self.clip: tuple[torch.Tensor, float, float] | None = None  # clip_grad_norm_'s total, max_norm, norm_type
        # a hand-written update's statistics, read as the backward returned, are of gradients a
        # clipping has since scaled: read again at the update (Watch._restat)
        self.restat = False
        self.moves: dict[tuple[str, str], list[int]] = {}  # (what, src) -> [count, bytes]
        # output storage -> source dtype/device, and the output (weakly): a storage address is
        # the same data only while that output lives (a new tensor may reuse a freed address)
        self.conversions: dict[int, tuple[torch.dtype, torch.device, weakref.ref[torch.Tensor]]] = {}
        self.breaks: list[dict[str, object]] = []
        self.events: list[dict[str, object]] = []
        self.saved_peak = 0  # largest saved-for-backward total of one backward in this step
        self.sigs: list[str] = []
        self.scale_version: int | None = None
        self.recorder: OpRecorder | NativeRecorder | None = None
        self.sid = StorageIds()
        # (module path, call index, call site when the module is torch's own: ops inside it then
        # need no stack walk, see _srcloc.op_src; '' for the user's modules)
        self.module_stack: list[tuple[str, int, str]] = []
        # (path, call, inside) of the forward op that made the node a recorded backward runs
        self.node_module: tuple[str, int, bool] | None = None
        self.module_calls: dict[str, int] = {}
        self.graph: GraphEvent | None = None
        self.timer: BackwardTimer | None = None
        self.nan_origin: NonFiniteOrigin | None = None  # on steps checked for NaN
        self.walk: AutogradWalk | None = None
        self.stats: StatsRead | None = None  # launched just before optimizer.step()
        # (watched parameter indices, their statistics) read as optimizers stepping inside the
        # backward stepped them (_stepped_in_backward)
        self.in_backward: list[tuple[list[int], GradRead]] = []
        self.before_create: AutogradWalk | None = None  # the graph before a create_graph=True backward
        self.retained = False
        self.autocast = False
        self.autocast_dtype: str | None = None
        self.in_shapes: tuple[tuple[int, ...], ...] = ()
        # the latest forward's floating-point inputs, weakly: read only at a first NaN/Inf loss
        # (_inputs_at_bad_loss), while the loop still holds its batch
        self.in_refs: list[weakref.ref[torch.Tensor]] = []
        # (module path, its call in the step, which output: 0 the first, _other_outputs' 1 and 2)
        # -> [norm, min, max, non-zeros(, nan, inf)]: floats from the native pass, or a tensor on
        # the gradient's device, read at the step's end
        self.act_grads: dict[_CallKey, torch.Tensor | tuple[float, ...]] = {}
        self.native = _native.loaded()  # the extension, looked up once a step, not per module
        self.act_slots: list[_CallKey] = []  # the calls whose statistics the native hooks take, by slot
        self.act_epoch = 0  # their hooks' epoch (_native.next_epoch), 0 before the first
        self.act_numel: dict[_CallKey, int] = {}
        self.act_calls: dict[str, int] = {}  # module path -> its calls watched this step
        # the same of the modules' outputs themselves (the forward's values), read as they are made
        self.out_stats: dict[_CallKey, torch.Tensor | tuple[float, ...]] = {}
        self.out_numel: dict[_CallKey, int] = {}
        self.out_calls: dict[str, int] = {}
        # storage -> version counter of a module output as its forward ended, of the modules
        # with user forward hooks (_out_version): one changed in place later is P13's
        self.out_versions: dict[int, int] = {}
        # on steps with full statistics: the parameters sampled, and their samples before optimizer.step()
        self.upd_before: tuple[list[int], torch.Tensor] | None = None
        self.fwd_t0: float | None = None  # the root forward's start (_on_forward_pre)
        self.saved_now = 0  # saved-for-backward bytes of the latest backward
        # the one-value tensor of the graph the loop last checked with isfinite/isnan/isinf (its
        # loss), weakly: read only if its forward gets no backward (a skipped batch)
        self.checked: weakref.ref[torch.Tensor] | None = None
        # the losses GradScaler.scale() scaled in this step, by their graph node (_node_key):
        # a root made from one is recorded as the loss it scaled (_on_scaling)
        self.unscaled: dict[tuple[int, int], torch.Tensor] | None = None
        self.lr: list[float] | None = None  # read before the step's end (a skipped step's), else at it
        self.grad_st: dict[int, int] | None = None  # the gradients' storages, read as self.lr is
        # the .grad tensors the full-mode recorder's baseline counted (a weak reference and its
        # storage's bytes each), and the bytes of those that died outside any op
        # (_untracked_frees), less those of later forwards' inputs the ledger took on (_inputs)
        self.rec_grads: list[tuple[weakref.ref[torch.Tensor], int]] = []
        self.untracked = 0
        # the storages (pointer -> bytes) of the tensors the step's recorded forwards were called
        # with, which the recorder's ledger follows (the first forward's in its baseline), a weak
        # reference to each with its bytes, the parameters', gradients' and state's storages
        # (not inputs), and of the inputs the bytes saved for backward (counted in ``saved``
        # too: not twice in ``temporaries``)
        self.in_st: dict[int, int] = {}
        self.in_held: list[tuple[weakref.ref[torch.Tensor], int, int]] = []  # (tensor, pointer, bytes)
        self.in_known: set[int] = set()
        self.in_saved = 0
        self.opt_from: int | None = None  # the id of the recorder's first op of optimizer.step()
        self.clipping = False  # full mode records since a clipping of the gradients (_record_clip)
        self.grad_names: tuple[int, dict[int, str]] | None = None  # (micro, id of .grad -> parameter), _on_grads_zeroed

    def passes_in_step(self) -> int:
        """Backward passes that ran inside the optimizer's step(): its closure's (LBFGS,
        Lightning's last micro-batch)."""
        return self.micro - self.step_began if self.step_began is not None else 0


def _lrs(opt: Any) -> list[float] | None:
    """The learning rate of each param group of ``opt`` (None: no torch-like optimizer)."""
    groups = getattr(opt, "param_groups", None) if opt is not None else None
    if not isinstance(groups, list):
        return None
    return [float(g.get("lr", 0.0)) for g in groups if isinstance(g, dict)]


def _sequence_nr(fn: Any) -> int:
    """A graph node's sequence number (one counter per thread, one number per node made); -1
    for none (no node, or one without the method)."""
    number = getattr(fn, "_sequence_nr", None)
    return int(number()) if callable(number) else -1


def _node_key(fn: Any) -> tuple[int, int]:
    """A graph node's key while it lives, held without holding it: its id, and its sequence
    number, so a node made at an earlier one's freed address is another key."""
    return id(fn), _sequence_nr(fn)


def _reached(s: _StepState, input_grad: bool = False) -> None:
    """Marks the forwards whose output a backward has reached, as the native hooks noted
    (``Watch._watch_used``): their marks are read in place, no call.  ``input_grad``: the pass
    was a ``torch.autograd.grad`` for inputs only (an adversarial attack's gradient of the
    input), which trains nothing -- said of them too (P11 does not count it as training)."""
    if s.used and s.native is not None:
        for token in [t for t in s.used if _token_reached(t)]:
            f = s.used.pop(token)
            f["backward"] = True
            if input_grad:
                f["input_grad"] = True
    if not s.marks:  # with the extension there are none: no list to build
        return
    for entry in [e for e in s.marks if e[0][0]]:
        s.marks.remove(entry)
        entry[1]["backward"] = True
        if entry[1].get("checkpoint"):  # (its graph is the checkpoint's: built once the call returned)
            entry[1]["built_graph"] = True
        if input_grad:
            entry[1]["input_grad"] = True
        for h in entry[2]:
            h.remove()


def _mark_when_reached(s: _StepState, fwd: ForwardInfo, nodes: list[Any]) -> None:
    """Python pre-hooks on ``nodes`` that mark ``fwd`` once a backward reaches any of them,
    read back by ``_reached``."""
    mark = [False]

    def consumed(grad_outputs: Any, mark: list[bool] = mark) -> None:
        mark[0] = True

    s.marks.append((mark, fwd, [fn.register_prehook(consumed) for fn in nodes]))


def _token_reached(token: int) -> bool:
    marks = _native.used_marks()
    return bool(marks[token % len(marks)] == token)


def _no_module(op: int) -> str:
    return ""


def _dense(t: torch.Tensor) -> bool:
    """A plain strided tensor with its data here: what the module outputs' and the updates'
    reads take.  A tensor subclass (DTensor, FSDP2's and tensor parallelism's parameters and
    outputs: a wrapper whose own storage is empty, read by the C++ pass or with dispatch off,
    crashed the process), a nested (jagged) tensor or one on the meta device is left out."""
    return type(t) in (torch.Tensor, nn.Parameter) and t.layout == torch.strided and not t.is_nested and not t.is_meta


def _grad_refs(params: list[torch.Tensor | None]) -> list[tuple[weakref.ref[torch.Tensor], int]]:
    """A weak reference to each ``.grad`` that owns all of its storage, with that storage's bytes:
    its death frees them (a gradient viewing a larger buffer -- DDP's ``gradient_as_bucket_view``
    -- frees nothing, and is left out)."""
    out: list[tuple[weakref.ref[torch.Tensor], int]] = []
    seen: set[int] = set()
    for p in params:
        g = p.grad if p is not None else None
        if g is None or not _dense(g) or type(g) is not torch.Tensor:
            continue
        st = g.untyped_storage()
        n = st.nbytes()
        if n == g.numel() * g.element_size() and st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            out.append((weakref.ref(g), n))
    return out


UPDATE_SAMPLE = 4096  # elements of a parameter the update's size is read from


_NARROW = (torch.bfloat16, torch.float16)
_WIDE = (torch.float64, torch.complex128, torch.complex64)


def _strided(n: int) -> tuple[int, int]:
    """The stride and the count of a parameter's sample (see _samples): through the whole of it
    (a stride rounded down read only the first UPDATE_SAMPLE * stride elements: an embedding's
    first rows, QA 39a)."""
    stride = max(1, -(-n // UPDATE_SAMPLE)) | 1
    return stride, min(UPDATE_SAMPLE, (n + stride - 1) // stride)


def _real(p: torch.Tensor) -> torch.Tensor:
    """A complex parameter as its real view (twice the elements, the same norm): what the
    update's sample and norms read."""
    return torch.view_as_real(p.detach()) if p.is_complex() else p


def _samples(params: list[torch.Tensor]) -> torch.Tensor:
    """Of each parameter, at most UPDATE_SAMPLE elements evenly strided through it (the stride
    odd, so that it runs across the columns of a matrix whose rows are a power of two long),
    all in one new tensor, in float32 where the parameters' dtypes differ."""
    views = []
    for p in params:
        stride, k = _strided(p.numel())
        if p.is_contiguous():  # one op, no copy: the elements at 0, stride, 2 * stride, ...
            views.append(torch.as_strided(p, (k,), (stride,), p.storage_offset()))
        else:
            views.append(p.reshape(-1)[: k * stride : stride])
    if len({v.dtype for v in views}) > 1 or views and views[0].dtype in _NARROW:
        views = [v.float() for v in views]  # (a few thousand elements each: the change in float32)
    return torch.cat(views)


def _stats_row(ext: Any, t: torch.Tensor, check_nan: bool) -> torch.Tensor | tuple[float, ...] | None:
    """``[norm, min, max, non-zeros(, nan, inf)]`` of a module output or its gradient (a complex
    one by its magnitudes), None for an empty one.  On the CPU, with the native extension, one
    pass in C++ with no op dispatched (floats); otherwise torch ops no recorder or Python mode
    sees (both C guards are cheap), as few passes as possible -- NaN/Inf counted only on steps
    armed by an earlier non-finite one -- as one small tensor, read at the step's end."""
    if ext is not None:
        try:
            r = ext.tensor_stats(t, check_nan)
        except Exception:  # a tensor pybind cannot take (a subclass): the torch path
            r = None
        if r is not None:
            return cast("tuple[float, ...]", r)
    with _native.unrecorded():
        v = t.detach()
        if not v.numel():
            return None
        if v.is_complex():  # by magnitudes, as a complex parameter's gradient
            v = v.abs()
        if v.dtype not in _STATS_DTYPES:
            v = v.float()
        lo, hi = torch.aminmax(v)
        parts = [torch.linalg.vector_norm(v), lo, hi, count_nonzero(v).to(v.dtype)]
        if check_nan:
            parts += [torch.isnan(v).sum().to(v.dtype), torch.isinf(v).sum().to(v.dtype)]
        return torch.stack(parts)


def _module_rows(
    stats: dict[_CallKey, torch.Tensor | tuple[float, ...]], numel: dict[_CallKey, int]
) -> dict[str, list[tuple[list[float], int]]]:
    """Per module path, its calls' statistics rows ``[norm, min, max, non-zeros(, nan, inf)]``
    and element counts, the calls whose statistics came (placeholders left out).  The torch
    path's tensors are read with one transfer; the native pass's are floats already."""
    items = [(k, v) for k, v in stats.items() if len(v) >= 4 and not k[2]]  # (an RNN's h_n: _reached_first)
    stacked = [v for _, v in items if isinstance(v, torch.Tensor)]
    read = iter(torch.cat([v.to(stacked[0].device, torch.float64) for v in stacked]).tolist() if stacked else [])
    calls: dict[str, list[tuple[list[float], int]]] = {}
    for key, v in items:
        row = [next(read) for _ in range(len(v))] if isinstance(v, torch.Tensor) else list(v)
        calls.setdefault(key[0], []).append((row, numel.get(key, 0)))
    return calls


def _nonfinite_counts(a: dict[str, Any], rows: list[tuple[list[float], int]], norm: float) -> None:
    if all(len(r) == 6 for r, _ in rows):
        a["nan"], a["inf"] = int(sum(r[4] for r, _ in rows)), int(sum(r[5] for r, _ in rows))
    elif math.isfinite(norm):  # a finite norm: no NaN or Inf anywhere
        a["nan"] = a["inf"] = 0
    if len(rows) > 1:
        a["calls"] = len(rows)


def _output_row(path: str, rows: list[tuple[list[float], int]]) -> ActivationStats:
    """One module's output statistics from its calls' rows: the norm of all of them together,
    their root mean square, smallest and largest value, the fraction of exact zeros."""
    norm = math.sqrt(sum(r[0] * r[0] for r, _ in rows))
    lo, hi = min(r[1] for r, _ in rows), max(r[2] for r, _ in rows)
    if any(math.isnan(r[1]) or math.isnan(r[2]) for r, _ in rows):
        lo = hi = math.nan  # min()/max() skip past a NaN; aminmax does not
    numel = sum(n for _, n in rows)
    nonzero = sum(r[3] for r, _ in rows)
    a: ActivationStats = {
        "module": path,
        "norm": norm,
        "rms": norm / math.sqrt(numel) if numel else 0.0,
        "min": lo,
        "max": hi,
        "zero_frac": 1.0 - nonzero / numel if numel else 0.0,
        "numel": numel,
    }
    _nonfinite_counts(cast("dict[str, Any]", a), rows, norm)
    return a


def _activation_row(path: str, rows: list[tuple[list[float], int]]) -> ActivationGrad:
    """One module's output-gradient statistics from its calls' rows ``[norm, min, max,
    non-zeros(, nan, inf)]`` and element counts: the norm of all of them together, the largest
    magnitude, the fraction of zeros among all their elements."""
    norm = math.sqrt(sum(r[0] * r[0] for r, _ in rows))
    lo, hi = min(r[1] for r, _ in rows), max(r[2] for r, _ in rows)
    if any(math.isnan(r[1]) or math.isnan(r[2]) for r, _ in rows):
        lo = hi = math.nan  # min()/max() skip past a NaN; aminmax, like abs().max(), does not
    numel = sum(n for _, n in rows)
    nonzero = sum(r[3] for r, _ in rows)
    a: ActivationGrad = {
        "module": path,
        "norm": norm,
        "max_abs": math.nan if math.isnan(lo) else max(abs(lo), abs(hi)),
        "zero_frac": 1.0 - nonzero / numel if numel else 0.0,
    }
    _nonfinite_counts(cast("dict[str, Any]", a), rows, norm)
    return a


def _first_tensor(x: Any) -> torch.Tensor | None:
    """A module output's tensor: its first floating-point (or complex) one -- of ``(indices,
    probs)`` the probabilities (QA 39a) -- else its first; through lists, tuples, dicts
    (ModelOutput) and dataclasses, and a ``.logits`` attribute."""
    if isinstance(x, torch.Tensor):  # the usual output (and a no_grad evaluation's, every step): no generator
        return x
    first: torch.Tensor | None = None
    for t in _tensors_in(x, 4):
        if t.is_floating_point() or t.is_complex():
            return t
        first = first if first is not None else t
    return first


def _other_outputs(x: Any, first: torch.Tensor) -> list[torch.Tensor]:
    """Besides ``first``, a tuple output's floating tensors that carry a graph, top level and one
    down, at most two: an RNN's ``h_n`` (and ``c_n``) of ``(output, h_n)`` /
    ``(output, (h_n, c_n))``, whose ``output`` a loop may discard (``_, h = gru(x)``: the
    gradient reaches the module through ``h_n`` alone; QA 42a).  None for a lone tensor or a
    dict (a ``ModelOutput``'s loss comes first and is the one its gradient reaches)."""
    if not isinstance(x, (tuple, list)):
        return []
    return [v for v in _one_level_down(x) if isinstance(v, torch.Tensor) and v is not first and v.grad_fn is not None
            and v.is_floating_point()][:2]


def _one_level_down(items: Iterable[Any]) -> list[Any]:
    """``items``, each list or tuple among them replaced by its own items."""
    return [u for v in items for u in (v if isinstance(v, (list, tuple)) else (v,))]


def _hold_activation_rows(s: _StepState) -> dict[_CallKey, torch.Tensor | tuple[float, ...]] | None:
    """Before a pass whose output gradients are not to count: the rows the step has, the
    native pass's taken in first; None on a step that watches no output."""
    if not s.act_grads:
        return None
    _take_native_rows(s)
    return dict(s.act_grads)


def _forget_oldest(d: dict[Any, Any], most: int) -> None:
    """Bounded: past ``most`` entries, the older half (insertion order) is forgotten."""
    if len(d) > most:
        for k in list(d)[: most // 2]:
            del d[k]


def _take_native_rows(s: _StepState) -> None:
    """The rows the C++ pre-hooks took so far (see ``_native.take_grads``), into ``act_grads``."""
    ext = s.native
    if s.act_slots and ext is not None:
        for slot, row in ext.take_grads(s.act_epoch):
            s.act_grads[s.act_slots[slot]] = row


def _restore_activation_rows(s: _StepState, rows: dict[_CallKey, torch.Tensor | tuple[float, ...]]) -> None:
    """After that pass: its rows dropped (the native pass's with them), the earlier ones back."""
    ext = s.native
    if s.act_slots and ext is not None:
        ext.take_grads(s.act_epoch)
    for key in s.act_grads.keys() & rows.keys():
        s.act_grads[key] = rows[key]


def _reached_first(s: _StepState) -> None:
    """Where a call's first output (key ``(path, call, 0)``) got no gradient and another of its
    outputs did (``(path, call, j)``, j = 1, 2), that one's statistics and element count, of the
    gradient and of the output itself, become the call's: the module's output the backward
    used.  The others are dropped."""
    for k in sorted((k for k, v in s.act_grads.items() if k[2] and len(v) >= 4), key=lambda k: k[2]):
        key = (k[0], k[1], 0)
        if len(s.act_grads.get(key, ())) < 4:
            s.act_grads[key], s.act_numel[key] = s.act_grads[k], s.act_numel.get(k, 0)
            if k in s.out_stats:
                s.out_stats[key], s.out_numel[key] = s.out_stats[k], s.out_numel.get(k, 0)
    for d in (s.act_grads, s.act_numel, s.out_stats, s.out_numel):
        for k in [k for k in d if k[2]]:
            del d[k]


def _tensors_in(x: Any, depth: int) -> Iterator[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif depth < 0:
        return
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors_in(v, depth - 1)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors_in(v, depth - 1)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            yield from _tensors_in(getattr(x, f.name, None), depth - 1)
    elif isinstance(getattr(x, "logits", None), torch.Tensor):
        yield x.logits


def _output_tensors(x: Any, limit: int = 8) -> list[torch.Tensor]:
    """The tensors a forward returned that carry a graph, one per distinct ``grad_fn`` node, at
    most ``limit``: top level (a tensor, or the items of a tuple, list or dict -- a
    ``ModelOutput``'s loss and logits -- and of a tuple or list among them), else the first one
    found deeper.  Every one counts: a loss built from the second output alone (an embedding
    and logits, the embedding kept detached) still uses the forward."""
    items = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else (x,)
    # and one level down: an RNN's ``(output, (h, c))``, whose state the loop may carry into
    # the next forward without ``.detach()`` (P7)
    items = _one_level_down(items)
    out: list[torch.Tensor] = []
    nodes: list[Any] = []
    for v in items:
        fn = v.grad_fn if isinstance(v, torch.Tensor) else None
        if fn is not None and all(fn is not n for n in nodes):
            out.append(v)
            nodes.append(fn)
            if len(out) >= limit:
                break
    if not out and (t := _first_tensor(x)) is not None and t.grad_fn is not None:
        out.append(t)
    return out


def _default_name(model: nn.Module) -> str:
    """The training script's name (``python train_gan.py`` -> ``train_gan``; a package's
    ``__main__.py`` -> the package), which tells runs apart where the model class often does not
    (every ``nn.Sequential``); a notebook's name; the class, lower-cased, where there is neither
    (a console, -c)."""
    script = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-") else ""
    stem = os.path.splitext(os.path.basename(script))[0]
    if stem == "__main__":
        stem = os.path.basename(os.path.dirname(os.path.abspath(script)))
    if "ipykernel" in script or stem in ("ipython", "ipython3"):
        # a notebook: its own name where the Jupyter server gave it to the kernel
        notebook = os.environ.get("JPY_SESSION_NAME", "")
        stem = os.path.splitext(os.path.basename(notebook))[0] if notebook.endswith(".ipynb") else ""
        return stem or _class_name(model).lower()
    if not stem or not os.path.isfile(script):
        return _class_name(model).lower()
    return stem


def _check_count(name: str, value: object, unit: str) -> None:
    """A watch() argument that counts something: a whole number, at least 1, or a clear error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"torchscope: {name} must be a whole number of {unit}, at least 1, not {value!r}")


class Watch:
    """``torchscope.watch(model, optimizer=None, ...)``: watch ``model`` (and ``optimizer``) for
    the rest of the run; the returned handle is also a context manager (``close()`` on exit).

    ``server``: "auto" ($TORCHSCOPE_SERVER or http://127.0.0.1:6150, started if needed), a URL,
    or None (record to the file only).  ``mode``: "default" | "full" | "light".
    ``cuda_history``: on CUDA, also keep the allocator's history (up to this many entries),
    labelled by step and module, written next to the session file at the end in PyTorch's own
    snapshot schema (JSON, and its memory viewer as HTML).  ``max_ops``: the most ops a
    captured step's graph records (the rest are counted as ``shed_ops``).  ``save_code``: record the
    text of the run's script in the file, for the doctor on any host (``$TORCHSCOPE_SAVE_CODE=0``
    also turns it off).  See ``docs/capture.md``.
    """

    _n_active: ClassVar[int] = 0  # watches running in this process (see _reuse_walk)
    _model: weakref.ref[nn.Module]

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        server: str | None = "auto",
        record: str | os.PathLike[str] | None = None,
        name: str | None = None,
        mode: str = "default",
        scaler: Any = None,
        sample_every: int = 50,
        token: str | None = None,
        cuda_history: int | None = None,
        max_ops: int = _MAX_OPS,
        save_code: bool = True,
    ) -> None:
        if not isinstance(model, nn.Module):
            # (QA 52a: watch(optimizer) raised AttributeError: 'SGD' object has no attribute 'named_parameters')
            hint = " (the optimizer goes second: watch(model, optimizer))" if isinstance(model, torch.optim.Optimizer) else ""
            raise TypeError(f"torchscope: watch() takes the model, an nn.Module, first; got {type(model).__name__}{hint}")
        if mode not in MODES:
            raise ValueError(f"torchscope: mode must be one of {', '.join(MODES)}, not {mode!r}")
        _check_count("max_ops", max_ops, "ops")
        _check_count("sample_every", sample_every, "steps")  # (0 read as 1, unsaid: QA 52a)
        if server not in (None, "auto") and not str(server).startswith(("http://", "https://")):
            raise ValueError(f"torchscope: server must be 'auto', None or an http(s):// URL, not {server!r}")
        if server not in (None, "auto"):
            from .transport import base_url_hint, names_more_than_a_server

            if names_more_than_a_server(str(server)):
                raise ValueError(f"torchscope: {base_url_hint('server', str(server))}")
        self.url: str | None = None
        self.path: str | None = None
        self.session_id: str | None = None
        self._active = False
        self._capturing_ops = False
        self._closed = False
        if torch.utils.data.get_worker_info() is not None:
            return  # a DataLoader worker: the main process is the one being watched
        for orphan in [w for w in list(_every) if w._active and w._model() is None]:
            # a run whose model is gone (a sweep's run() returned without close()): its hooks
            # would see this run's steps and write into its file -- it ends here, "finished"
            orphan.close()
        prev = _watching.get(model)
        if prev is not None and prev._active:
            # a notebook cell run again, or watch() inside an epoch loop: one watch per model,
            # not hooks stacking up and the same steps recorded twice
            say(
                f"torchscope: {_class_name(model)} is already watched (recording to {prev.path}); "
                "closing that watch first",
            )
            prev.close()
        self.mode = mode
        # full mode loads the C++ op recorder or starts building it in the background; the
        # other modes load a build that is there (its gradient statistics, default's captures)
        _native.get(build=mode == "full")
        self.sample_every = sample_every
        self.max_ops = max_ops
        # the run's script, recorded in the file by the writer thread after the session event
        # (_source; unless save_code=False or TORCHSCOPE_SAVE_CODE=0): None where there is none
        self._code = _source.main_script() if _source.wanted(save_code) else None
        self.name = name or _default_name(model)
        self._rank: RankInfo = rank_info()
        self.session_id = session_id(self.name, self._rank)
        base = os.fspath(record) if record is not None else default_record(self.name)
        self.path = claim_record(base, self._rank, record is not None, lambda p: bool(_writing(p)), self.name)
        if self.path is None:
            return  # no file can be written: not watched (said), the training runs as it would
        # imported with the transport, not by `import torchscope`
        from .transport import UNSENDABLE_TOKEN, read_token, resolve_server, sendable

        self._server, autostart = resolve_server(server)
        token = read_token(token)
        if self._server and not sendable(token):
            say(f"torchscope: {UNSENDABLE_TOKEN}: not sending to {self._server}, recording to {self.path} only")
            self._server, autostart = None, False
        if self._server:
            self.url = f"{self._server}/sessions/{self.session_id}"
            if token:
                self.url += "?" + urllib.parse.urlencode({"token": token})
        self._model = weakref.ref(model)
        hookable = _hookable(optimizer)
        if optimizer is not None and hookable is None:
            say(
                f"torchscope: {type(optimizer).__name__} has no step hooks (not a torch.optim.Optimizer, or one whose "
                "__init__ skipped Optimizer.__init__, as a Lookahead wrapper may): "
                "a step ends when the parameters changed between a backward and the next forward "
                "(or call .step() on the watch)",
            )
        # the optimizer whose hooks end steps: a wrapper's inner one (accelerate, Lightning)
        optimizer = hookable or optimizer
        self._optimizer = weakref.ref(optimizer) if optimizer is not None else None
        # optimizer-state bytes the last step ended with: the state a captured step made (Adam's
        # on its first step) after its peak is no part of that peak's excess (None: unknown --
        # an optimizer that already had state when watched, or none; then nothing is)
        self._o_prev: int | None = 0 if optimizer is not None and not getattr(optimizer, "state", None) else None
        self._auto_steps = optimizer is not None and hookable is None
        self._param_version = -1  # sum of the parameters' versions after the last backward
        self._param_data_taken = False  # a parameter's .data was taken since (_updated_by_hand)
        self._scaler = scaler
        self._disabled: set[str] = set()
        self._told_cap = False  # the per-step op cap was reached (said once)
        # tensors seen updated from a parameter with autograd on (id -> (ref, step, param, line, op)),
        # and the lines said (_on_graph_copy)
        self._weight_copies: dict[int, tuple[weakref.ref[torch.Tensor], int, str, str, str]] = {}
        self._graph_copies: set[str] = set()
        # from optimizer.step() to the next forward on the steps the mode watches: where a copy
        # of the weights is updated out of place (``shadow = 0.99 * shadow + 0.01 * p``)
        self._after_update = False
        self._keep_mode = False  # the watched optimizer has step pre-hooks of its own (_opt_pre)
        # functional dropout left on in eval mode (P11): the first eval-mode forward from each
        # call site runs under a probe (its line), and what it finds is said once a line
        self._eval_probe = EvalDropoutProbe(self._safe, self._on_eval_dropout)
        self._eval_probed: set[str] = set()
        # while one of these modes is on the stack, PyTorch's fast paths are taken without it
        self._fast = FastPathGuard(lambda: (self._interposer, self._eval_probe))
        self._calls = 0  # torch calls through the function mode (every IDLE_EVERY-th looks at _idle)
        self._last_event = time.monotonic()  # the watched loop's last forward, backward or step
        self._backward_running = False  # inside a backward of the loop's (_run_backward)
        self._hand_updates = False  # a step was ended by a hand-written update (_updated_by_hand)
        if type(model).__name__ == "OptimizedModule":  # watch(torch.compile(model))
            self._fast.compiled_forward()
        self._eval_dropouts: set[str] = set()
        self._direct_noted = isinstance(model, torch.jit.ScriptModule)  # told at watch() already
        self._model_name = _class_name(model)
        self._grad_attrs: dict[str, bool] = {}  # module path -> its plain requires_grad attribute (P17)
        named = list(model.named_parameters())
        # a parameter object that dies (to_empty() of a model built on meta, load_state_dict
        # (assign=True), each making new ones under the old names) marks this, read where a
        # forward begins: the parameters are then followed by name (_rebind).  The callback
        # holds no reference to the watch.
        # [1]: a submodule was assigned (``model.head = nn.Linear(...)``, ``model.layers[2] =
        # block``): the modules are listed again there too, their hooks follow the new ones
        self._dead = dead = [False, False]
        self._on_dead: Callable[[Any], None] = lambda _ref: dead.__setitem__(0, True)
        self._names = [n for n, _ in named]
        self._params = [weakref.ref(p, self._on_dead) for _, p in named]
        self._param_names = {id(p): n for n, p in named}
        self._set_param_ptrs(set(storages(p for _, p in named)), model)  # refreshed once lazy ones exist
        # LazyLinear & co. make their parameters in the first forward: the session event (their
        # shapes) waits for it; so does a model built on the meta device (``to_empty()`` after
        # watch() gives it its device)
        self._lazy = any(is_lazy(p) for _, p in named)
        self._session_pending = self._lazy or any(p.is_meta for _, p in named)
        self._sizes = StorageSizes()
        self._modules = [(path, weakref.ref(m)) for path, m in model.named_modules()]
        self._module_ids = {id(m) for m in model.modules()}  # read by the registration hooks below
        # the submodules' hooks of recorded steps (module context of each op): registered for a
        # captured step and removed after it -- in full mode, where every step is captured, kept
        # (registering ~2 per module cost ~1 ms a transformer step); inert while nothing records
        self._module_hooks: list[Any] = []
        # a model whose own forward the loop never calls (model.enc(x); model.head(z), Lightning's
        # self.model(x), an nn.ModuleDict of models): its direct submodules' calls are its
        # forwards, once a backward without one showed it (_enter_by_children)
        self._entries: dict[int, str] = {}  # id(submodule) -> its path
        self._entered: nn.Module | None = None  # the submodule whose call is the running forward
        self._step = 0
        self._bad_metrics: set[str] = set()  # names log() left out, told once each
        self._last_sig: str | None = None
        self._capture_next = False
        self._structures: set[str] = set()  # graph signatures captured (see _follow_structure)
        self._wanted: str | None = None  # a new structure not captured yet
        self._tries = 0
        self._change_captures = 0  # steps captured for a new structure (held to a budget)
        self._nan_armed = False
        # CUDA: a step event waiting for its gradient statistics (see _finish)
        self._deferred: tuple[StepEvent, StatsRead, int, list[int], bool, tuple[float, float] | None, list[int], list[int], dict[str, Any] | None, list[tuple[NodeRecord, weakref.ref[torch.Tensor]]], tuple[list[int], torch.Tensor] | None] | None = None
        self._sentinels: list[weakref.ref[_Sentinel]] = []
        # an earlier step's loss is kept alive (P7): the mode sees the user's calls outside the
        # forward, for the one that takes the loss in (_on_holder); for at most _PROBE_STEPS steps
        self._probing = False
        self._probe_left = _PROBE_STEPS
        self._recomputing = False  # the root forward now running is a checkpoint's recompute (_on_forward_pre)
        self._step_site: tuple[types.CodeType, int] | None = None  # where the last optimizer.step() was called (_trailing)
        self._told_following: set[str] = set()  # optimizer classes _adopt said it follows
        self._clip_open = False  # full mode records a clipping's ops now (_record_clip, _end_clip)
        # the step's results of torch.autograd.grad for inputs without create_graph, and what
        # the loop computed from them without a graph (_on_grad_const): id -> (tensor, its line)
        self._grad_consts: dict[int, tuple[weakref.ref[torch.Tensor], str]] = {}
        # ... and the one-value sums with a graph that took one in: id -> (sum, the grad's line, the sum's)
        self._grad_joins: dict[int, tuple[weakref.ref[torch.Tensor], str, str]] = {}
        # the named container keeping earlier steps' losses (_held_in): None until looked for
        self._held_in: str | None = None
        # ... and the one keeping earlier steps' outputs, or what was computed from them
        # (_probe_outputs): None until found, looked for at most _PROBE_STEPS times
        self._outputs_held_in: str | None = None
        self._outputs_probes = _PROBE_STEPS
        self._graph_lists: dict[int, int] = {}  # (graph_lists) at the boundary before
        self._nest_check = False  # the last boundary saw a graph a later backward can go through alive
        # default mode: a backward failed on a step not captured; steps are captured (at most
        # _FAILURE_TRIES) until one with a failing backward is, so the doctor can name the op
        self._failure_wanted = False
        self._failure_tries = 0
        # (tensor id, target dtype, target device) of conversions -> (weak tensor, last step,
        # its version counter then): P12 repeats
        self._converted: dict[
            tuple[int, torch.dtype, torch.device], tuple[weakref.ref[torch.Tensor], int, int]
        ] = {}
        # ... and of memory torch does not own (a numpy array's): (its address, shape, types) ->
        # (last step, a sample of its values then) (_repeat_external)
        self._converted_ext: dict[tuple[Any, ...], tuple[int, tuple[float, float, float]]] = {}
        self._depth = 0
        # the thread running the training loop: watch()'s until a forward with grad, a backward
        # or an optimizer step runs in another (see _other_thread)
        self._owner = threading.get_ident()
        self._rec_thread = 0  # the thread whose mode stack holds the op recorder
        self._started_at = time.time()
        self._s = _StepState(time.perf_counter())

        from .transport import Transport  # H3's writer/sender thread

        try:
            self._transport = Transport(self.path, self.session_id, self._rank.rank, self._server, token, autostart)
        except OSError as exc:  # the file claimed, then its header not written (a disk full)
            say(f"torchscope: cannot record to {self.path} ({exc.strerror or exc!r}): not watching this run")
            with contextlib.suppress(OSError):
                if os.path.getsize(self.path) == 0:  # ours, empty: a later run may have the name
                    os.remove(self.path)
            return
        if not self._session_pending:
            self._transport.emit(self._session_event(model, optimizer))
            self._record_code()
        self._handles: list[Any] = []
        self._handles += assignment_hooks(self._module_ids, self._dead)
        scripted = isinstance(model, torch.jit.ScriptModule)
        if scripted:
            # TorchScript runs no Python module hooks: its forwards are not seen, its backward,
            # gradients, memory and optimizer steps are (the function mode stays on for them)
            say(
                f"torchscope: {_class_name(model)} is a TorchScript module: its forward ops and "
                "modules are not recorded, its backward, gradients and memory are",
            )
        else:
            # first among its pre-hooks: the ops of the user's own pre-hooks (registered before
            # watch()) belong to the step's forward
            self._handles += hook_module(model, self._fwd_pre, self._fwd_post, with_kwargs=True, prepend=True)
        # Every torch optimizer's step passes through torch.optim's global step hooks: the
        # watched optimizer's steps end steps; with watch(model) alone, the first optimizer that
        # steps the model's parameters becomes the watched one, and one that replaces it mid-run
        # (a second training phase) is followed from the step it takes over (_on_forward_pre)
        self._stray: weakref.ref[torch.optim.Optimizer] | None = None
        self._stray_again = False  # it stepped twice with no step of the watched one between
        # the previous step's forwards no backward had reached by its end (_late_reached):
        # (step, micro, native token or None, Python mark or None, Python hooks)
        self._late: list[tuple[int, int, int | None, list[bool] | None, list[Any]]] = []
        self._followed = False  # the watched optimizer was found, not given
        self._manual = False  # the loop calls watch.step()
        self._steps_ours: weakref.WeakKeyDictionary[torch.optim.Optimizer, bool] = weakref.WeakKeyDictionary()
        # whether an optimizer steps any of the watched one's parameters (asked once each, until
        # another one is watched): a GAN's second optimizer is asked at every step otherwise
        self._shares: weakref.WeakKeyDictionary[torch.optim.Optimizer, bool] = weakref.WeakKeyDictionary()
        # optimizers that step inside the backward (post-accumulate-grad hooks), and the
        # watched parameters each steps
        self._in_backward: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[int]] = weakref.WeakKeyDictionary()
        # torch.optim's global step hooks, and whether they are still plain (_compile_proof_hooks)
        self._opt_hooks: list[Any] = []
        self._opt_hooks_plain = False
        if not self._auto_steps:
            self._opt_hooks = [
                register_optimizer_step_pre_hook(self._any_opt_pre),
                register_optimizer_step_post_hook(self._any_opt_post),
            ]
            self._handles += self._opt_hooks
            self._opt_hooks_plain = True
            self._compile_proof_hooks()
        first = next(iter(model.parameters()), None)
        self._history = (
            _cuda.AllocatorHistory(
                first.device if first is not None else torch.device("cpu"), int(cuda_history or 0)
            )
            if cuda_history
            else None
        )
        self._interposer = Interposer(self)
        # the function-mode stack is per thread: so is whether ours is on it (a loop may run in
        # another thread than the one that called watch())
        self._tls = _ThreadFlags()
        self._mode_always = scripted  # see _counts_copies
        # walk key -> (signature, nodes) of the walks made (_walk_key, _reuse_walk)
        self._walked: dict[tuple[Any, ...], tuple[str, int]] = {}
        self._last_seq = 0  # sequence number of the last backward root's grad_fn (_nodes_since)
        self._checked_step = -1  # the last step captured with its ops checked for NaN/Inf
        self._outside_told: frozenset[int] = frozenset()  # ids of the unregistered parameters light last told
        self._walked_nodes = 0  # nodes of the last graph_key walk (sizes the next one's table)
        # (signature, input shapes) -> bytes saved for backward, unreadable saved tensors
        self._saved_cache: dict[tuple[str, tuple[tuple[int, ...], ...]], tuple[int, list[str]]] = {}
        # per step structure (its graphs' signatures and input shapes): how far the last captured
        # step of it peaked above the state it ended with (``_memory``)
        self._excess: dict[tuple[tuple[str, ...], tuple[tuple[int, ...], ...]], int] = {}
        self._mem_key: tuple[int, int, int, int] | None = None
        self._state_lists = False  # the optimizer state held lists of tensors at the last reading
        self._modes_key: tuple[bool, int] | None = None  # see _modes_now
        self._mode_facts: tuple[list[str], list[str], dict[str, bool]] = ([], [], {})
        self._hooked: list[tuple[str, weakref.ref[nn.Module]]] | None = None  # modules with forward hooks
        self._versioned: set[int] = set()  # ids of the modules _out_version is a forward hook of
        self._pruned: set[int] = set()  # parameters torch.nn.utils.prune masks (said once)
        self._grad_hooks: tuple[list[int], list[str]] = ([], [])  # as last said (_gradient_hooks)
        # parameters' and optimizer state's storages, their union and its bytes (see _memory)
        self._mem_static: tuple[dict[int, int], dict[int, int], dict[int, int], int] = ({}, {}, {}, 0)
        self._held_key: tuple[int, tuple[int, ...]] | None = None  # optimizer and group sizes (_not_stepped)
        self._told_new: set[str] = set()  # parameters gained after watch() the user was told of
        self._unheld: list[int] = []  # parameter indices that optimizer does not hold
        # what it holds that is not the model's (weakly): a layer's old parameters after a new one
        # was assigned, a learnable loss weight kept beside the model
        self._orphans: list[weakref.ref[torch.Tensor]] = []
        # other optimizers stepping watched parameters beside the watched one (a backbone's SGD
        # beside the head's Adam) -> the step they last stepped at: theirs are trained too
        # every tensor an optimizer stepped since watch(), by id (weakly): kept after that optimizer
        # is collected -- a train() whose optimizers are locals, its watch closed (and the last
        # step's outside parameters asked, _owned_elsewhere) after they are gone (QA 53a)
        self._stepped: dict[int, weakref.ref[torch.Tensor]] = {}
        self._stepped_live = 0  # len(_stepped) after its last pruning of dead tensors
        # each optimizer seen stepping -> its group sizes when its tensors were noted (_note_stepped)
        self._stepped_keys: weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[int, ...]] = weakref.WeakKeyDictionary()
        self._told_foreign = False  # an optimizer of none of the model's parameters was said (foreign_step)
        # (id of the optimizer, the recorder) whose step() paused the op recorder (_pause_for_step)
        self._paused_for: tuple[int, Any] | None = None
        self._co_opts: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = weakref.WeakKeyDictionary()
        self._frozen_values: dict[int, float] | None = None  # a value of each frozen parameter at step 0 (_frozen_moved)
        self._co_trained: list[int] = []  # the model's parameters another optimizer steps, as last told (_not_trained)
        self._co_candidates: set[int] = set()  # the first step's not_trained another optimizer may train
        self._touches: dict[str, int] = {}  # graph signature -> a node of one of our parameters in it
        self._gc_paused = False
        self._ended_by: tuple[str, str] | None = None  # (status, message) when the run raised
        self._seen_error = id(getattr(sys, "last_value", None))  # IPython's last shown exception (_close_at_exit)
        self._active = True
        Watch._n_active += 1
        _watching[model] = self
        _every.add(self)
        _install_excepthook()
        _warnings.install()
        _sigterm.install(_end_on_sigterm)
        self._mode_on()
        atexit.register(self._close_at_exit)
        self._mp_exit = _multiprocessing_exit(self._close_at_exit)
        where = f" → {self.url}" if self.url else ""
        say(
            f"torchscope: watching {_class_name(model)}{where}  (recording to {self.path})",
        )

    # ------------------------------------------------------------------ public
    def step(self) -> None:
        """Mark a step boundary (only needed without an optimizer; harmless with one)."""
        if not self._manual:
            # the loop ends its steps itself: an optimizer followed since watch(model) is not
            # (its step would close a second, empty step after this one)
            self._manual = True
            if self._followed:
                self._optimizer, self._followed = None, False
        if self._active and self._s.started:
            self._safe("step", self._close_step, False)

    def log(self, step: int | None = None, **values: Any) -> None:
        """Record numbers of your own with a step -- accuracy, a validation loss, a schedule's
        temperature -- plotted beside the loss (``torchscope.log(acc=0.91)``).  Numbers, bools
        and one-element tensors (read like ``.item()``: on a GPU that waits for the device, as
        logging ``.item()`` does).  Without ``step``: the step running now, or, called after
        ``optimizer.step()`` and before the next training forward (an evaluation between is
        none; nor is a forward below the step in the loop's function: ``_trailing``), the step
        that just ended.  Never
        raises: a value that is no number is left out with one warning."""
        if self._closed or not self._active:
            return
        try:
            self._log(step, values)
        except Exception as exc:  # never into the loop (the metrics part alone turns off)
            self._safe("metrics", _raise, f"{type(exc).__name__}: {exc}")

    def _log(self, step: int | None, values: dict[str, Any]) -> None:
        if "metrics" in self._disabled:
            return
        kept: dict[str, float] = {}
        for name, value in list(values.items())[:METRICS_PER_CALL]:
            number = _metric_value(value)
            if number is None or len(name) > METRIC_NAME_CHARS:
                if name not in self._bad_metrics:
                    self._bad_metrics.add(name)
                    say(f"torchscope: log({name}=...) left out: a metric is a number, a bool or a one-element tensor "
                        f"under a name of at most {METRIC_NAME_CHARS} characters (got {type(value).__name__})")
                continue
            kept[name] = number
        if not kept:
            return
        if step is None or type(step) is not int or step < 0:
            # after optimizer.step() and before the next training forward (an evaluation under
            # no_grad or in eval mode between is none): the step that ended
            s = self._s
            began = s.micro > 0 or any(f.get("grad_mode") and f.get("training", True) for f in s.forwards)
            step = self._step - 1 if self._step > 0 and (not began or self._trailing(s)) else self._step
        shown = ", ".join(f"{k}={v:.4g}" for k, v in kept.items())
        self._transport.emit({"kind": "log", "t": time.time(), "level": "info", "message": f"step {step}: {shown}",
                              "step": step, "metrics": kept})

    def _trailing(self, s: _StepState) -> bool:
        """Whether what the open step holds is the tail of the loop's iteration that stepped,
        not a new one: ``log()`` is called below ``optimizer.step()`` in the same function, and
        the open step's training forwards ran there too, none above the step (where a new
        iteration begins).  A GAN's generator update through the watched discriminator after
        its step, an accuracy computed with a forward after the step (QA 48b: every logged value
        one step late, or lost under the next step's)."""
        site, here = self._step_site, user_site(3)
        if site is None or here is None or here[0] is not site[0] or here[1] <= site[1]:
            return False
        lines = [same_function(str(f.get("src", "")), site[0]) for f in s.forwards
                 if f.get("grad_mode") and f.get("training", True)]
        return bool(lines) and all(n is not None and n > site[1] for n in lines)

    def flush(self, timeout: float = 5.0) -> bool:
        """Write what was recorded so far to the session file and wait for it (at most
        ``timeout`` seconds; False if it took longer): for reading the run while it goes on,
        from the same process -- a notebook's next cell.  ``torchscope.load()`` of this
        watch's file calls it.  The open step, the one now running, is not in it."""
        if not self._active or self._closed:
            return True
        if self._deferred is not None:  # the last closed step's statistics, still to be read
            self._safe("step", self._finish_deferred)
        return bool(self._transport.flush(timeout))

    def close(self) -> None:
        """End the session: flush the last step, write the end event.  Idempotent."""
        if self._closed or not self._active:
            self._closed = True
            return
        self._closed = True
        interrupted = False
        try:
            model = self._model()
            if self._session_pending and model is not None:
                self._safe("session", self._emit_session, model)
            # the open step: one with a backward, or, in a watch without optimizer (inference),
            # one with forwards (a training loop's trailing evaluation is not a step of its own)
            # (optimizers stepping inside the backward end steps too: no inference watch)
            failed_in: tuple[dict[str, Any] | None, list[dict[str, object]]] | None = None
            # (a loop that updated by hand: its trailing no-backward forwards are an evaluation,
            # QA 43b: the word_language_model example's made a 25th step of 24 updates)
            if self._s.micro > 0 or (self._s.forwards and self._optimizer is None and not self._in_backward
                                     and not self._hand_updates):
                skipped = self._scale_changed()  # the loop's last step, skipped by its GradScaler: a step
                if self._an_unapplied_step() and not skipped:
                    self._s.forwards = [f for f in self._s.forwards if not f.get("backward")]
                else:
                    self._safe("step", self._close_step, skipped)
            elif self._s.forwards and self._ended_by is not None and self._ended_by[0] == "error":
                failed_in = self._safe("step", self._failed_forward, self._s)
            trailing = list(self._s.forwards)  # none once closed: an evaluation after the last step
            self._safe("step", self._finish_deferred)
            if failed_in is not None and failed_in[0] is not None:
                self._transport.emit(failed_in[0])  # after the step before it (deferred till now)
            late = self._safe("step", self._drop_open_step)
            for h in self._handles:
                h.remove()
            self._resume_gc()
            self._mode_remove()
            if self._tls.eval_probe:  # closed inside an evaluation's forward
                remove_mode(self._eval_probe)
                self._tls.eval_probe = False
            _warnings.uninstall()
            _native.release(id(self))
            if self._history is not None and self.path is not None:
                for p in self._safe("cuda_history", self._history.write, self.path) or ():
                    say(f"torchscope: CUDA allocator history in {p}")
            self._active = False
            Watch._n_active -= 1
            end = self._end_event()
            if trailing:
                end["forwards"] = trailing
            if late:
                end["late_backward"] = late
            if failed_in is not None and failed_in[1]:
                end["events"] = failed_in[1]
            try:
                self._transport.close(end, patient=True)
            except KeyboardInterrupt:
                # a Ctrl-C in the wait for a slow disk (or a second one at exit): said in one line
                # what the file lacks, and the interrupt goes on to the loop (QA 51c, 52a: it came
                # as a traceback through the transport's wait)
                interrupted = True
                say(f"torchscope: interrupted while closing: {self.path or 'the session file'} may lack the run's "
                    "last events and its end")
        except Exception as exc:  # closing must not raise into an atexit or a with-block
            log.warning("torchscope: close failed: %r", exc)
        atexit.unregister(self._close_at_exit)
        if self._mp_exit is not None:
            self._mp_exit.cancel()
        if interrupted:
            raise KeyboardInterrupt from None

    def _close_at_exit(self) -> None:
        """``close()`` as the interpreter exits.  IPython shows a cell's exception itself (no
        ``sys.excepthook``) and keeps it in ``sys.last_value``: a kernel restarted or shut down
        while a cell trains first interrupts that cell, and an exception shown since the last
        step ended -- an interrupt, or an error with a step left half done -- is how the run ended."""
        last = getattr(sys, "last_value", None)
        if (self._ended_by is None and isinstance(last, BaseException) and id(last) != self._seen_error
                and (isinstance(last, KeyboardInterrupt) or self._s.micro > 0)):
            self._ended_by = _ending(last) if not isinstance(last, KeyboardInterrupt) else (
                "interrupted", "stopped by KeyboardInterrupt (a notebook's Stop, or its kernel restarted or shut "
                "down while a cell ran)")
        with contextlib.suppress(KeyboardInterrupt):
            # a second Ctrl-C (a terminal's and `timeout`'s forwarded one, or a user who will not
            # wait for a slow disk) landing in the wait for the writer, said by close(): the process
            # is leaving, and a traceback of ours after the user's own said nothing useful (QA 51c)
            self.close()

    def _end_now(self) -> None:
        """The end record, written from a signal handler just before the process dies: what
        the file and server already have stays, the open step is lost, nothing is undone.
        The transport's close takes no lock the interrupted code might hold."""
        if self._closed:
            # a SIGTERM landing inside close() (a Pool's workers are terminated as they end
            # their last task's watch): the record it was writing is finished here, then the
            # process dies -- not left without its last steps and end
            self._transport.close(self._end_event(), timeout=3.0)  # (only waits, if close() got there)
            return
        if not self._active:
            return
        self._active, self._closed = False, True
        Watch._n_active -= 1
        self._transport.close(self._end_event(), timeout=3.0)

    def _end_event(self) -> dict[str, Any]:
        end: dict[str, Any] = {"kind": "end", "t": time.time(), "status": "finished", "steps": self._step}
        if self._ended_by is not None:
            end["status"], end["message"] = self._ended_by
        return end

    def _an_unapplied_step(self) -> bool:
        """Whether the step open at close is backwards the watched optimizer never applied, in
        a run that ended well: no step.  A GAN's critic watch sees the generator's backward
        through the critic after its own last step; a loop can end mid-accumulation.  A run
        that failed keeps it (the step it failed in), as does a watch whose steps end without
        optimizer hooks, or a run with no step yet."""
        if self._optimizer is None or self._auto_steps or self._manual or self._step == 0:
            return False
        failed = self._ended_by is not None and self._ended_by[0] == "error"
        return self._s.micro > 0 and not failed and not self._s.backward_errors

    def _drop_open_step(self) -> list[list[int]]:
        """What a step left unclosed at close (a forward without backward: a trailing
        evaluation, an exception in the loss) still holds: the op recorder on the dispatch
        stack, where it would see every later op of the process, and hooks on modules and
        graph nodes.  Returns the last step's forwards a backward after it reached (a GAN's
        generator update after the critic's last step: ``late_backward``, said by the end event)."""
        s = self._s
        self._stop_recorder()
        for h in s.node_hooks:
            h.remove()
        s.node_hooks = []
        for _, _, hooks in s.marks:
            for h in hooks:
                h.remove()
        s.marks = []
        late = self._late_reached(s, [])
        self._remove_module_hooks()
        return late

    def _failed_forward(self, s: _StepState) -> tuple[dict[str, Any] | None, list[dict[str, object]]]:
        """The step a run failed in before its backward -- the loop raised on a NaN loss it
        checked (``if torch.isnan(loss): raise``), an op of the loss raised on one: what the
        doctor needs to say where the NaN began, which the step's record (never written: no
        backward, no step) would have held.  The loss the loop checked (kept with the trailing
        forward), which parameters and inputs its forward read non-finite, and, on a step whose
        ops were recorded, their graph (``failed``: ops only, no backward nodes)."""
        rec = s.recorder if s.graph is None else None
        if rec is not None:
            self._stop_recorder()  # before our own reads below (and the C++ recorder counts its ops as it stops)
        if s.checked is not None:
            self._skipped_loss(s)  # the loss, and on a non-finite one the inputs it read
        if not math.isfinite(s.forwards[-1].get("loss", 0.0)):
            self._params_nonfinite(s)
        facts = [e for e in s.events if e.get("what") in ("inputs_nonfinite", "params_nonfinite")]
        if rec is None or not rec.n_ops:
            return None, facts
        s.graph = {"kind": "graph", "step": self._step, "rank": self._rank.rank, "micro": 0, "nodes": [], "edges": [],
                   "failed": True}
        return dict(self._graph_event(s)), facts

    def _remove_module_hooks(self) -> None:
        for h in self._module_hooks:
            h.remove()
        self._module_hooks = []

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None and not self._closed:
            self._ended_by = _ending(exc)
        self.close()

    # ------------------------------------------------------------------ safety
    def _safe(self, part: str, fn: Callable[..., Any], *args: Any) -> Any:
        if part in self._disabled or not self._active:
            return None
        if profiling():  # a profiler the user runs around the loop: our ops under our label
            with labelled(part):
                return self._guarded(part, fn, args)
        return self._guarded(part, fn, args)

    def _guarded(self, part: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        at = self._step  # (a step's record moves it on even when it fails)
        try:
            with torch._C.DisableTorchFunction():  # our own tensor calls skip every function mode
                # ... and the loop's dispatch modes, where they only read (_unseen, inlined:
                # without a dispatch mode, the usual case, no context manager is made)
                if part in _PURE and _dispatch_modes():
                    with _disable_current_modes():
                        return fn(*args)
                return fn(*args)
        except Exception as exc:
            self._turn_off(part, at, exc)
            return None

    def _turn_off(self, part: str, at: int, exc: Exception) -> None:
        self._disabled.add(part)
        # said at the terminal as well as kept: a run whose step recording turned off this
        # way read as "0 steps, finished" with nothing said anywhere (QA 38a)
        msg = (f"{CAPTURE_OFF}{part} turned off at step {at} after an internal error: "
               f"{exc!r}; your training goes on unchanged, the session records less from here "
               "(a torchscope bug: please report it)")
        log.debug(msg, exc_info=True)
        with contextlib.suppress(Exception):
            self._tell(msg, "error", at, {"capture_off": {"part": part, "error": repr(exc)[:500]}})

    # The function mode is on the stack only between a forward's end and optimizer.step()
    # (loss, backward, clipping) and, on the steps that count copies, between
    # optimizer.step() and the next forward (data movement): the forward, the optimizer's own
    # many small calls and, on the other steps, zero_grad (a Python-level call per
    # parameter's ``.grad`` under any function mode: ~300 us a step on a 51-parameter model)
    # then cost nothing.  Captured steps keep it on through the forward too (graph breaks).
    def _mode_on(self) -> None:
        if not self._tls.pushed and self._active:
            insert_mode(self._interposer)  # below the loop's own modes: see insert_mode
            self._tls.pushed = True
            self._fast.on()

    def _idle(self) -> None:
        """Every _interpose.IDLE_EVERY torch calls through the mode: one left on after the loop stopped --
        optimizer.step() put it on for the data movement before the next forward, a forward's
        end for its loss and backward, and neither came (the loop is over, its model deleted;
        a notebook's next cells) -- would tax every later torch call of the process 1.5-2.4x
        (QA 37c).  After _IDLE_S without a forward, backward or step of the watched loop, or
        with its model gone, the next module call (outside this handler, where a mode can be
        taken off) ends it: the mode off, or the watch of a dead model closed."""
        if self._depth or self._capturing_ops or self._backward_running:
            return  # inside the watched forward or backward (a slow model's step is no idle loop)
        if self._model() is not None and time.monotonic() - self._last_event < _IDLE_S:
            return
        self._fast.on()  # its global module pre-hook makes the pending call
        self._fast.pending = self._leave_idle

    def _leave_idle(self, module: nn.Module) -> None:
        model = self._model()
        if model is None:
            self.close()  # what the next watch() would do to a run whose model is gone
        elif module is not model:  # (the loop itself back: its forward takes it from here)
            self._after_update = False
            self._mode_off()

    def _mode_off(self) -> None:
        # not on the stack: torch took it off while its handler runs (a hook of the user's
        # backward stepping an optimizer) and puts it back after; it comes off next time
        if self._tls.pushed and remove_mode(self._interposer):
            self._tls.pushed = False
            if not self._tls.eval_probe:
                self._fast.off()

    def _mode_remove(self) -> None:
        """At close: our mode off this thread's stack wherever it sits.  Left below another
        watch's or a user's mode, it would see every torch call of the process from then on
        and keep this watch alive (two watches closed in the order they were opened: a GAN's)."""
        if self._tls.pushed:
            remove_mode(self._interposer)
            self._tls.pushed = False
        self._fast.off()

    # ------------------------------------------------------------------ session
    def _emit_session(self, model: nn.Module) -> None:
        """The session event of a model whose lazy parameters now exist (or of whatever exists
        at close): first in the file, since no step can end before a forward."""
        self._session_pending = False
        self._set_param_ptrs(set(storages(p for _, p in model.named_parameters())), model)
        opt = self._optimizer() if self._optimizer is not None else None
        self._transport.emit(self._session_event(model, opt))
        self._record_code()

    def _record_code(self) -> None:
        """After the session event: the writer thread records the script's text (``_source``)."""
        if self._code is not None:
            self._transport.record_source(self._code)
            self._code = None

    def _session_event(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
        owner = {}
        modules: list[ModuleInfo] = []
        for path, m in model.named_modules():
            own = list(m.named_parameters(recurse=False))
            for pname, _ in own:
                owner[f"{path}.{pname}" if path else pname] = path
            info: ModuleInfo = {"path": path, "type": type(m).__name__, "n_params": len(own), "training": m.training}
            if isinstance(m, _OWN_DROPOUT):  # said either way: the doctor knows them by this alone
                info["mode_inert"] = _mode_inert(m)
            elif _mode_inert(m):
                info["mode_inert"] = True
            described = _extra_repr(m)
            if described:
                info["extra_repr"] = described
            flag = vars(m).get("requires_grad")  # an attribute of the instance: nn.Module has none
            if isinstance(flag, bool):
                info["requires_grad_attr"] = self._grad_attrs[path] = flag
            modules.append(info)
        params: list[ParamInfo] = []
        for n, p in model.named_parameters():
            lazy = is_lazy(p)  # still without a shape: closed before its first forward
            params.append(
                {
                    "name": n,
                    "module": owner.get(n, ""),
                    "shape": [] if lazy else list(p.shape),
                    "dtype": str(p.dtype).removeprefix("torch."),
                    "device": str(p.device),
                    "requires_grad": p.requires_grad,
                    "numel": 0 if lazy else p.numel(),
                    "nbytes": 0 if lazy else p.numel() * p.element_size(),
                }
            )
        first = next(iter(model.parameters()), None)
        ev: dict[str, Any] = {
            "kind": "session",
            "schema": list(SCHEMA_VERSION),
            "session_id": self.session_id,
            "name": self.name,
            "started_at": self._started_at,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "rank": self._rank.rank,
            "world_size": self._rank.world_size,
            "mode": self.mode,
            "torch_version": torch.__version__,
            "device": str(first.device) if first is not None else "cpu",
            "argv": list(sys.argv),
            "script": os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else "",
            "model": _class_name(model),
            "modules": modules,
            "params": params,
            "settings": {
                "sample_every": self.sample_every,
                "mode": self.mode,
                "max_ops": self.max_ops,
                "grad_stats_every": GRAD_STATS_EVERY,
                "save_code": self._code is not None,  # the script's text follows (LogEvent.source)
            },
        }
        if optimizer is not None:
            ev["optimizer"] = type(optimizer).__name__
        if any(hasattr(p, "grad_sample") for p in model.parameters()):  # Opacus marks the trainable ones
            ev["per_sample_grads"] = True
        return ev

    # ------------------------------------------------------------------ forward
    # Under torch.compile, Dynamo traces module hooks into the compiled graph; ours then do
    # nothing (a constant branch, no graph break), so a compiled forward runs exactly as
    # compiled and shows up in the autograd graph as its one CompiledFunctionBackward node.
    def _fwd_pre(self, module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        if _compiling() or _tracing():
            return  # a forward torch.jit.trace runs is a trace, not a step
        if _transformed():
            # inside torch.func's vmap/grad/jvp (per-sample gradients, forward-mode AD) the
            # forward runs on functorch's wrapped tensors, which must not escape the transform
            # into the step's records: it is counted, not recorded
            if module is self._model():
                self._s.transformed += 1
                if self._s.transformed == _TRANSFORMED_TELL and self._step == 0:
                    self._safe("forward", self._tell_transformed)
            return
        if module is not self._model():
            return  # a shallow copy (copy.copy) shares the watched model's hook dicts
        if self._other_thread():
            self._tls.skipped += 1
            return
        self._safe("forward", self._on_forward_pre, module, args, kwargs)

    def _tell_transformed(self) -> None:
        """Many forwards inside torch.func transforms and not one step ended: a functional loop
        (``grad_and_value`` and an update by hand), whose gradients never reach ``.grad`` and
        which calls no backward() nor optimizer.step() -- nothing torchscope sees as a step."""
        self._tell(
            f"torchscope: {_TRANSFORMED_TELL} forwards of {self._model_name} ran inside torch.func transforms (grad, "
            "vmap, ...) and no step has ended: torchscope records a step at optimizer.step() or after backward(), "
            "and reads gradients from .grad -- a loop that applies torch.func's gradients by hand records no step "
            "(write them into p.grad and call an optimizer's step() to have them recorded)", "warning")

    def _fwd_post(self, module: nn.Module, args: Any, output: Any) -> None:
        if _compiling() or _tracing() or _transformed() or module is not self._model():
            return
        skipped = self._tls.skipped
        if skipped:
            self._tls.skipped = skipped - 1
            return
        self._safe("forward", self._on_forward_post, module, output)

    def _entry_pre(self, module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        """A direct submodule's call: the model's forward when none runs (see _entries), else
        the submodule's own module context (its _mod_pre, which it does not get besides)."""
        if _compiling() or _tracing() or _transformed():
            return
        path = self._entries.get(id(module))
        if path is None:
            return
        model = self._model()
        if self._entered is module and self._depth and not self._forward_running(module):
            self._end_cut_forward()  # the call it began was cut short (see _end_cut_forward)
        if self._depth == 0 and model is not None and self._entered is None:
            if self._other_thread():
                return
            self._entered = module
            self._safe("forward", self._on_forward_pre, model, args, kwargs)
        self._mod_pre(path, _torch_module(module), 5)(module, args)

    def _entry_post(self, module: nn.Module, args: Any, output: Any) -> None:
        if _compiling() or _tracing() or _transformed() or id(module) not in self._entries:
            return
        self._mod_post(module, args, output)
        model = self._model()
        if self._entered is module and self._depth == 1 and model is not None:
            self._entered = None
            self._safe("forward", self._on_forward_post, model, output)

    def _enter_by_children(self, model: nn.Module) -> bool:
        """Make the calls of ``model``'s submodules its forwards (see _entries): hooked first
        among their pre-hooks, their module hooks of recorded steps left to these.  Every
        submodule, not only the direct ones: a loop may run ``for layer in model.encoder.layers:
        h = layer(h)``, never calling ``model.encoder``; inside a forward so begun, a deeper
        submodule's hook is only its module context, as the module hook would have been."""
        children = [(name, m) for name, m in model.named_modules() if m is not model
                    and not isinstance(m, torch.jit.ScriptModule)]
        if not children:
            return False
        self._remove_module_hooks()  # re-registered without the entries at the next recorded step
        for name, m in children:
            self._entries[id(m)] = name
            self._handles += hook_module(m, self._entry_pre, self._entry_post, with_kwargs=True, prepend=True)
        self._mode_always = False  # forwards are seen from now on (set again if still not)
        self._capture_next = True  # default mode: the next step's graph has the forward ops this one lacked
        return True

    def _other_thread(self) -> bool:
        """A root forward under no_grad in another thread than the training loop's -- an
        evaluation or inference thread beside training -- is not part of the step: taken, its
        calls would interleave with the loop's forward and break the step apart."""
        return self._owner != threading.get_ident() and not torch.is_grad_enabled()

    def _scale_changed(self) -> bool:
        scale = getattr(self._scaler, "_scale", None) if self._scaler is not None else None
        if not isinstance(scale, torch.Tensor) or self._s.scale_version is None:
            return False
        return bool(scale._version != self._s.scale_version)

    def _on_forward_pre(self, module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        if self._depth and not self._forward_running(module):
            self._end_cut_forward()
        self._depth += 1
        if self._depth > 1:
            return  # the root called itself: one forward
        if _in_a_backward():
            # a non-reentrant checkpoint's recompute of the model (checkpoint(model, x),
            # checkpoint_sequential) inside the step's backward: the same forward again, not
            # another one of the step (QA 46b: counted, it read as a forward no backward used)
            self._recomputing = True
            return
        self._last_event = time.monotonic()
        if self._dead[0]:
            self._rebind()
        if self._opt_hooks_plain:
            self._compile_proof_hooks()
        self._after_update = False
        if torch.is_grad_enabled():
            self._owner = threading.get_ident()
        s = self._s
        if s.checked is not None:
            self._skipped_loss(s)
        if s.step_began is not None and s.micro > 0 and "step" not in self._disabled and not self._in_step_call():
            # optimizer.step() began and never returned: a Ctrl-C inside it (a notebook's Stop
            # during Adam's update), its step hooks' post never ran; the step it began ends here
            s.events.append({"what": "step_cut_short"})
            self._safe("step", self._close_step, False)
            s = self._s
        if s.micro > 0 and self._scale_changed():
            self._close_step(True)  # GradScaler.update() ran without optimizer.step(): skipped
            s = self._s
        elif s.micro > 0 and self._updated_by_hand():
            self._close_step(False)  # an optimizer without hooks (or the loop itself) updated the parameters
            self._hand_updates = True
            s = self._s
        elif s.micro > 0 and (stray := self._stray() if self._stray is not None else None) is not None and (
            self._stray_again or self._safe("step", self._shares_params, stray) is True
        ) and not _calls_on_stack(_STEP_WRAPPER, stray):
            # only another optimizer stepped these parameters since the last backward: it has
            # replaced the watched one (a new optimizer for a second phase of training) when it
            # steps the same parameters, or twice in a row; one of other parameters is a second
            # optimizer of the loop (a GAN's generator's, stepping between the critic's steps).
            # Not while its step() runs this forward: a closure of a wrapper (SAM's step(closure)
            # around the watched base optimizer, whose step comes after it: QA 44e, one step more)
            self._adopt(stray)
            self._close_step(False)
            s = self._s
        elif len(s.forwards) >= _MAX_FORWARDS or s.micro >= _MAX_FORWARDS:
            # no step boundary for this long (an inference loop, a watch without optimizer and
            # no step() calls): a step every _MAX_FORWARDS keeps the capture's memory bounded
            # and the run live on the dashboard
            self._close_step(False)
            s = self._s
        if not s.started:
            self._start_step(s)
        s.in_refs = []
        s.in_shapes = _input_shapes(args, kwargs, s.in_refs)
        grad_mode = torch.is_grad_enabled()
        fwd: ForwardInfo = {
            "micro": len(s.forwards),
            "grad_mode": grad_mode,
            "inference_mode": torch.is_inference_mode_enabled(),
            "training": module.training,
            "built_graph": False,
            "backward": False,
            "src": user_src(3),  # 3: past this method and its caller (_safe), ours
        }
        if module.training:
            fwd["eval_modules"] = list(self._modes_now(module)[0])
        if not grad_mode:
            fwd["train_modules"] = list(self._modes_now(module)[1])
            if fwd["train_modules"] and self._recalibrating(fwd["train_modules"]):
                fwd["bn_recalibration"] = True
            ctx = _reentrant_checkpoint_node()
            if ctx is not None:
                fwd["checkpoint"] = True
                self._watch_checkpoint(s, fwd, ctx)
        s.forwards.append(fwd)
        if not s.capture and self._tls.pushed:  # (off already on most steps: see _opt_post)
            self._mode_off()
        if (not module.training and fwd["src"] not in self._eval_probed and len(self._eval_probed) < 64
                and not isinstance(module, FAST_PATHS)):  # (its fast path is taken before any hook could lift the probe)
            self._eval_probed.add(fwd["src"])
            insert_mode(self._eval_probe)
            self._tls.eval_probe = True
            self._fast.on()
        if not s.autocast:
            s.autocast = autocast_on()
            if s.autocast:
                s.autocast_dtype = autocast_dtype()
        if s.capture and "ops" not in self._disabled:
            self._start_recorder(s, module, args, kwargs)
        s.fwd_t0 = time.perf_counter()
        if s.before_fwd_us is None:
            s.before_fwd_us = (s.fwd_t0 - s.t0) * 1e6

    def _in_step_call(self) -> bool:
        """Whether this forward runs inside the step() that began (an LBFGS closure's)."""
        opt = self._optimizer() if self._optimizer is not None else None
        return opt is None or _calls_on_stack(_STEP_WRAPPER, opt) > 0

    def _forward_running(self, module: nn.Module | None) -> bool:
        """Whether the forward the capture counts as running (``_depth``) is still on the
        stack, asked only where one is counted: the model's call begun (or the submodule's
        whose call began it) has a ``Module._call_impl`` frame besides the current call's."""
        began = self._entered or self._model()
        return _calls_on_stack(_CALL_IMPL, began) > (1 if began is module else 0)

    def _end_cut_forward(self) -> None:
        """A forward that never returned nor raised an ``Exception``: a ``KeyboardInterrupt``
        (a notebook's Stop, Ctrl-C) leaves ``Module.__call__`` without its ``always_call``
        hooks, which torch runs for ``Exception`` only.  It is ended here, as one that returned
        nothing, before the next one begins; otherwise every later forward would count as
        nested in it and none would be recorded."""
        model = self._model()
        self._depth, self._entered = 1, None
        if model is not None:
            self._on_forward_post(model, None)
        self._depth = 0

    def _on_forward_post(self, module: nn.Module, output: Any) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        if self._recomputing:
            self._recomputing = False
            return
        if self._tls.eval_probe:
            remove_mode(self._eval_probe)
            self._tls.eval_probe = False
            if not self._tls.pushed:
                self._fast.off()
        if self._session_pending:
            self._emit_session(module)
            if self._lazy and self._s.forwards:  # the dry run that made the lazy modules' parameters (no evaluation)
                self._s.forwards[-1]["materialized"] = True
        if self._gc_paused:  # tested here, not in the call: once a step, rarely with work to do
            self._resume_gc()
        self._mode_on()
        s = self._s
        if s.fwd_t0 is not None:
            s.forward_us += (time.perf_counter() - s.fwd_t0) * 1e6
        if s.module_stack:
            s.module_stack.clear()
            self._module_changed()
        fwd = s.forwards[-1] if s.forwards else None
        if fwd is not None and module.training and (s.capture or self._step % GRAD_STATS_EVERY == 0):
            self._modes_after_forward(module, fwd)
        outs = _output_tensors(output)
        if fwd is None or not outs:
            return
        fwd["built_graph"] = True
        if s.capture:
            self._safe("activations", self._watch_output, "", outs[0])
            self._safe("activation_grads", self._watch_activation, "", outs[0])
        nodes: list[Any] = [t.grad_fn for t in outs]  # each has one (_output_tensors)
        self._watch_used(s, fwd, outs, nodes)
        # an output's graph node outliving the next step boundary means something keeps the
        # output (a list of predictions, or of a ModelOutput's logits, for metrics): its graph
        # is alive (P7).  The backward's root sentinel does not see that: the loss derived
        # from the output is gone by then.
        self._output_sentinels(s, fwd, nodes)
        if not module.training or not torch.is_grad_enabled():
            # a graph built in eval mode may never be consumed (P6): size it now, while it exists
            walk = AutogradWalk(nodes)
            saved, _ = walk.saved(self._not_activations)
            fwd["saved_bytes"] = sum(saved.values())
            n_nodes = walk.interior()
            for ref in s.out_sentinels[-len(nodes):]:  # this forward's: kept, they hold this much
                if (o := ref()) is not None:
                    o.saved, o.nodes, o.sized = fwd["saved_bytes"], n_nodes, True

    def _modes_after_forward(self, module: nn.Module, fwd: ForwardInfo) -> None:
        """Modules the forward itself put in eval mode (``self.encoder.train(False)`` inside
        ``forward``; the loop's ``model.train()`` undoes it before the next one, so the modes
        at the forward's start never show it).  Read fresh, on the steps the modes are."""
        kept = self._modes_key, self._mode_facts
        self._modes_key = None
        late = self._modes_now(module)[0]
        self._modes_key, self._mode_facts = kept  # the cache keeps what the step's other reads saw
        if late != fwd.get("eval_modules"):
            fwd["eval_modules"] = sorted({*fwd.get("eval_modules", ()), *late})

    def _output_sentinels(self, s: _StepState, fwd: ForwardInfo, nodes: list[Any]) -> None:
        """A sentinel in the metadata of each of the forward's output nodes: a backward through
        them is the model's (_through_outputs), and one outliving the step boundary tells the
        output's graph kept alive (P7)."""
        for node in nodes:
            out = _Sentinel(self._step, 1, fwd.get("src", ""), output=True)
            node.metadata["torchscope_out_sentinel"] = out
            ref = weakref.ref(out)
            self._sentinels.append(ref)
            s.out_sentinels.append(ref)

    def _watch_checkpoint(self, s: _StepState, fwd: ForwardInfo, ctx: Any) -> None:
        """A forward run inside ``checkpoint(model, x, use_reentrant=True)``: its output, made
        under no_grad, has no graph; the checkpoint's node (``ctx``, the grad_fn its outputs get
        when the call records a graph) stands for the output's node -- a backward that reaches
        it is the step's and used this forward (not another model's checkpoint, QA 47c); an
        evaluation under an outer no_grad never reaches it, and the node dies with the call."""
        _mark_when_reached(s, fwd, [ctx])
        self._output_sentinels(s, fwd, [ctx])

    def _watch_used(self, s: _StepState, fwd: ForwardInfo, outs: list[torch.Tensor], nodes: list[Any]) -> None:
        """``fwd["backward"]`` becomes True once a backward reaches any of ``nodes``, the nodes
        of the forward's outputs ``outs``: C++ hooks sharing one token, read back by
        ``_reached``, else Python ones."""
        if s.native is not None:
            token = _native.next_epoch()
            if all([s.native.watch_used(t, token) for t in outs]):  # every one hooked (a list: no short cut)
                s.used[token] = fwd
                return
        _mark_when_reached(s, fwd, nodes)

    def _start_step(self, s: _StepState) -> None:
        s.started = True
        step = self._step
        if step == 0 and self._hooked is None:  # hooks registered before the first forward: from it on
            self._safe("hook_versions", self._find_hooked)
        if step == 0:  # a model moved after watch() and before training: its storages are new
            self._param_storages([p for r in self._params if (p := r()) is not None])
        if self._history is not None:
            self._safe("cuda_history", self._history.label, f"step {step}")
        s.capture = self._captures(step)
        # ops are checked for NaN/Inf after a non-finite step, and on the first captured one: a
        # loss that is NaN from the start (log of a zero probability) is otherwise never traced
        # to its op, the parameters being poisoned by the time the next step is checked
        s.check_nan = s.capture and (self._nan_armed or step == 0)
        if s.check_nan:
            self._checked_step = step
        self._capture_next = False
        if self._scaler is not None:  # (else scale_version stays None, as the state starts)
            self._snapshot_scale(s)

    def _captures(self, step: int) -> bool:
        """Whether ``step``'s ops and graph are recorded (decided as its first forward begins)."""
        if self.mode == "default":
            return step == 0 or step % self.sample_every == 0 or self._capture_next
        return self.mode == "full"

    def _snapshot_scale(self, s: _StepState) -> None:
        scale = getattr(self._scaler, "_scale", None) if self._scaler is not None else None
        s.scale_version = scale._version if isinstance(scale, torch.Tensor) else None

    # ------------------------------------------------------------------ op capture
    def _start_recorder(self, s: _StepState, root: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        if s.recorder is None:
            s.recorder = self._new_recorder(s, args, kwargs)
            _compile.follow(_pause_for_compile)
        else:  # a later forward of the step: a micro-batch, the training forward after an evaluation
            self._safe("memory", self._inputs, s, s.recorder, _input_tensors(args, kwargs), False)
        if not self._module_hooks:  # (and again after a module was assigned: _relist_modules)
            for path, ref in self._modules:
                m = ref()
                if m is None or m is root or id(m) in self._entries or isinstance(m, torch.jit.ScriptModule):
                    continue  # an entry's own hooks give its module context; a ScriptModule takes none
                # first among its pre-hooks: the ops of the user's (torch.nn.utils.prune's
                # ``weight_orig * weight_mask``) are the module's, not its parent's (QA 52b)
                self._module_hooks += hook_module(m, self._mod_pre(path, _torch_module(m)), self._mod_post,
                                                   prepend=True)
        self._pause_gc()
        s.recorder.micro = len(s.forwards) - 1
        s.module_stack.append(("", s.module_calls.get("", 0), ""))
        s.module_calls[""] = s.module_calls.get("", 0) + 1
        if not self._capturing_ops:
            s.recorder.phase = "forward"
            s.recorder.__enter__()
            self._rec_thread = threading.get_ident()
            self._capturing_ops = True
        else:
            self._module_changed()

    def _new_recorder(self, s: _StepState, args: Any, kwargs: dict[str, Any]) -> OpRecorder | NativeRecorder:
        """The C++ observer records once it is built (see _native: full mode builds it, and
        default mode's captured steps use a build that exists), else a Python dispatch mode.
        Its baseline: the parameters, gradients and optimizer state, and the forward's input
        batch -- made before recording began, no op's allocation, yet alive through the step
        (a batch of images can outweigh the model; the first layer saves it for backward)."""
        live, s.in_known = self._live_bytes()
        inputs = _input_tensors(args, kwargs)
        s.in_st = {ptr: n for ptr, n in spanned(inputs).items() if ptr not in s.in_known}
        if self.mode == "full":  # (whose recorder goes on through the backward)
            s.rec_grads = _grad_refs([r() for r in self._params])
        ext = _native.claim(id(self))
        rec: OpRecorder | NativeRecorder
        if ext is not None:
            cdata = {p._cdata: self._param_names[id(p)] for r in self._params if (p := r()) is not None and id(p) in self._param_names}
            rec = NativeRecorder(ext, self._module_of, cdata, live + sum(s.in_st.values()), s.check_nan, self.max_ops, s.sid)
        else:
            rec = OpRecorder(self._module_of, self._param_names, live + sum(s.in_st.values()), s.check_nan, self.max_ops, s.sid)
        self._safe("memory", self._inputs, s, rec, inputs, True)
        return rec

    def _inputs(self, s: _StepState, rec: OpRecorder | NativeRecorder, inputs: list[torch.Tensor], first: bool) -> None:
        """The ledger follows the storages of ``inputs``, the tensors a recorded forward was called with, as
        if an op had made them: the first forward's are in the recorder's baseline (``first``),
        a later one's are live from its first op on.  Made by the data loader, they are no op's
        allocation, yet alive through the forward, and their death is a free: an evaluation's
        batch made before the training forward is not held on, a micro-batch's is counted (QA
        43a: the first forward's batch was counted to the step's end, a later one's never).  Of
        a batch sliced out of a dataset kept in one tensor, the part it spans (``spanned``)."""
        if first:
            spans = s.in_st
        else:
            # (a dead batch's address is the next one's as often as not: forgotten first)
            alive = []
            for held in s.in_held:
                if held[0]() is None:
                    s.in_st.pop(held[1], None)
                else:
                    alive.append(held)
            s.in_held = alive
            spans = {ptr: n for ptr, n in spanned(inputs).items() if ptr not in s.in_known and ptr not in s.in_st}
            if not spans:
                return
        for t in inputs:
            ptr = t.untyped_storage().data_ptr() if t.layout == torch.strided and _dense(t) else None
            n = spans.get(ptr) if ptr is not None else None
            if ptr is not None and n is not None and rec.follow(t, n, first):
                s.in_held.append((weakref.ref(t), ptr, n))
                if not first:
                    s.in_st[ptr] = n
                    s.untracked -= n

    def _untracked_frees(self, s: _StepState) -> None:
        """The .grad tensors the recorder's baseline counted that died since, outside any op:
        ``zero_grad()`` between the forward and ``loss.backward()`` (the order of PyTorch's own
        tutorial) frees them where the op ledger cannot see it, and the backward's new ones
        then counted on top of them (QA 41a: an in-step peak of 792.9 KiB where the allocator
        held 661.3 KiB).  Told to the recorder as a free of its next op."""
        held, s.rec_grads = s.rec_grads, []
        gone = sum(n for ref, n in held if ref() is None)
        if gone and s.recorder is not None:
            s.recorder.untracked_free(gone)
            s.untracked += gone

    def _module_changed(self) -> None:
        """The native recorder learns the module the next ops run in (the Python one asks)."""
        rec = self._s.recorder
        if self._capturing_ops and isinstance(rec, NativeRecorder):
            rec.sync()

    def _stop_recorder(self) -> None:
        s = self._s
        if self._capturing_ops and s.recorder is not None:
            self._capturing_ops = False
            if self._rec_thread != threading.get_ident():
                # a forward in one thread, its backward in another: a mode can only leave
                # the stack of the thread that entered it, so there it stays, passing ops through
                s.recorder.paused = True
                return
            s.recorder.__exit__(None, None, None)
            s.recorder._link_pending()
            if s.recorder.failed:
                self._safe("ops", _raise, f"op recorder: {s.recorder.failed}")

    def _mod_pre(self, path: str, torch_module: bool, caller: int = 4) -> Callable[[nn.Module, Any], None]:
        def hook(m: nn.Module, args: Any) -> None:
            s = self._s
            if s.recorder is None or _compiling() or _transformed() or threading.get_ident() != self._owner:
                return  # the recorded forward is the training thread's; between steps nothing records
            n = s.module_calls.get(path, 0)
            s.module_calls[path] = n + 1
            src = ""
            if torch_module:
                # the first user frame above this call: the caller's line when it is user code;
                # when a torch module's forward called it, that module's (only torch frames
                # lie between), without walking the stack again (frames: 0 op_src, 1 this hook,
                # 2 Module._call_impl, 3 Module._wrapped_call_impl, 4 the caller; one more
                # from _entry_pre)
                st = s.module_stack
                src = op_src(st[-1][2] if st else "", caller)
            s.module_stack.append((path, n, src))
            self._module_changed()
            if self._history is not None:
                self._history.label(f"step {self._step} {path}")

        return hook

    def _mod_post(self, m: nn.Module, args: Any, out: Any) -> None:
        if self._s.recorder is None or _compiling() or _transformed() or threading.get_ident() != self._owner:
            return
        st = self._s.module_stack
        # the root's own entry ("", under every module of its forward) is left to the root's
        # hook; a submodule run with no root forward around it -- a reentrant checkpoint's
        # recompute, inside the backward -- is the bottom of the stack itself
        if len(st) > 1 or (st and st[0][0]):
            path = st.pop()[0]
            self._module_changed()
            if self._history is not None:
                self._history.label(f"step {self._step} {st[-1][0] if st else ''}")  # back in the caller's module
            self._safe("activations", self._watch_output, path, out)
            self._safe("activation_grads", self._watch_activation, path, out)

    def _watch_output(self, path: str, out: Any) -> None:
        """On captured steps: statistics of this module's output itself (its values, as the
        forward made them: a ReLU that never fires, a saturated tanh, a residual stream that
        grows layer by layer), of each call up to ``ACT_CALLS``.  Read at once and only read:
        on the CPU in one C++ pass with no op dispatched, else by torch ops no recorder or mode
        sees, kept as one small tensor until the step's end (no sync inside the forward).  An
        RNN's ``h_n`` (``_other_outputs``) is read too, for the step's end to keep the output
        the backward used (``_reached_first``).  A complex output's values are read by
        magnitude, as its gradient is (QA 46b: it had no row)."""
        s = self._s
        t = _first_tensor(out)
        if t is None or not _dense(t) or not (t.is_floating_point() or t.is_complex()) \
                or not (t.requires_grad or torch.is_grad_enabled()):
            return  # (an evaluation under no_grad inside the step is not the training forward)
        call = s.out_calls.get(path, 0)
        if call and _in_a_backward():  # a non-reentrant checkpoint's recompute: no second call
            return
        if call >= ACT_CALLS or not t.numel():
            return
        s.out_calls[path] = call + 1
        for j, u in enumerate((t, *_other_outputs(out, t))):
            if j and (not _dense(u) or not u.numel()):
                continue
            key = (path, call, j)
            s.out_numel[key] = u.numel()
            row = _stats_row(s.native, u, s.check_nan)
            if row is not None:
                s.out_stats[key] = row

    def _watch_activation(self, path: str, out: Any) -> None:
        """On captured steps: statistics of the gradient flowing into this module's output, of
        each of its calls (an RNN cell over the time steps, a block shared by two branches, the
        micro-batches' forwards) up to ``ACT_CALLS``, told together at the step's end.  Of an
        RNN's ``(output, h_n)``, ``h_n``'s too: the output the backward used is told
        (``_reached_first``)."""
        s = self._s
        t = _first_tensor(out)
        if t is None or not t.requires_grad or not (t.is_floating_point() or t.is_complex()):
            return
        call = s.act_calls.get(path, 0)
        if t.is_leaf or (call and _in_a_backward()):
            # a module that returns its own Parameter: a hook on it would stay for good (one a
            # captured step, QA 39a), its gradient is the parameter's; a non-reentrant
            # checkpoint's recompute inside the backward is no second call (a reentrant one's,
            # whose forward ran under no_grad, is the only one there is)
            return
        if call >= ACT_CALLS:
            return
        s.act_calls[path] = call + 1
        for j, u in enumerate((t, *_other_outputs(out, t))):
            self._watch_grad(s, (path, call, j), u)

    def _watch_grad(self, s: _StepState, key: _CallKey, t: torch.Tensor) -> None:
        """The statistics of the gradient reaching ``t``, as the backward passes it, for ``key``."""
        s.act_grads[key] = _NO_STATS  # a shared placeholder: no tensor op inside the recorded step
        s.act_numel[key] = t.numel()
        ext = s.native
        if ext is not None:
            # a C++ pre-hook on the output's node takes them in the backward (CPU tensors;
            # compiled autograd leaves it out of its graph: no statistics, no failure)
            if s.act_epoch == 0:
                s.act_epoch = _native.next_epoch()
            if ext.watch_grad(t, s.act_epoch, len(s.act_slots)):
                s.act_slots.append(key)
                return

        def hook(g: torch.Tensor, s: _StepState = s) -> None:
            # Runs for every module output in a captured step's backward (a tensor subclass
            # that needs its mode fails in the torch path and is skipped)
            with contextlib.suppress(Exception):
                row = _stats_row(s.native, g, s.check_nan)
                if row is not None:
                    s.act_grads[key] = row

        fn = t.grad_fn
        if fn is None:  # a leaf as a module's output
            t.register_hook(hook)
            return
        # a pre-hook on the output's node, at the output's index: the gradient a tensor hook
        # would get (tensor hooks, too, stay with the node they were registered at), for ~8 us
        # where Tensor.register_hook (a Python method, its handle and hooks dict) costs ~12
        k = t.output_nr

        def pre(grads: tuple[torch.Tensor | None, ...], k: int = k) -> None:
            g = grads[k] if k < len(grads) else None
            if g is not None:
                hook(g)

        fn.register_prehook(pre)

    def _module_of(self) -> tuple[str, int, bool, str]:
        s = self._s
        st = s.module_stack
        if st:
            return st[-1][0], st[-1][1], True, st[-1][2]
        if s.node_module is not None:  # a recorded backward's op (_node_started)
            return s.node_module[0], s.node_module[1], s.node_module[2], ""
        return "", 0, False, ""

    def _on_break(self, name: str, t: torch.Tensor) -> None:
        s = self._s
        if s.recorder is not None and self._capturing_ops:
            s.recorder.add_marker(name, t, ["breaks_graph"])

    def _on_scaling(self, local: dict[str, Any], func: str) -> None:
        """Inside ``GradScaler.scale(loss)`` (its locals): a scaler not passed to watch() is
        followed as if it had been, and the loss it scales is kept (an alias, to the step's
        end) as the value of the root ``loss * scale`` a backward then takes: the step's loss
        is the one the loop logs, not 65,536 times it, moving with every change of the scale."""
        scaler = local.get("self")
        if isinstance(scaler, torch.amp.GradScaler) and self._scaler is None:
            self._scaler = scaler
        loss = local.get("outputs")
        if func != "scale" or not isinstance(loss, torch.Tensor) or loss.grad_fn is None or loss.numel() != 1:
            return  # (a list of losses is scaled one by one by an inner function: not followed)
        s = self._s
        if s.unscaled is None:
            s.unscaled = {}
        if len(s.unscaled) < 1024:
            with _unseen():  # the loop's dispatch modes do not see the alias
                s.unscaled[_node_key(loss.grad_fn)] = loss.detach()

    def _before_scaling(self, s: _StepState, fn: Any) -> tuple[str, torch.Tensor] | None:
        """The loss a root ``scaler.scale(loss)`` was made from (``_on_scaling``): its grad_fn's
        class and its value; or None."""
        if s.unscaled is None or type(fn).__name__ != "MulBackward0" or not fn.next_functions:
            return None
        made_from = fn.next_functions[0][0]
        loss = s.unscaled.get(_node_key(made_from)) if made_from is not None else None
        return (type(made_from).__name__, loss) if loss is not None else None

    @staticmethod
    def _note_scaled(s: _StepState, root: int, made_from: str) -> None:
        """Root ``root`` of the step is ``scaler.scale(loss)`` of a loss whose grad_fn is
        ``made_from``: the doctor judges that loss's scale (P15), not the scaler's multiply."""
        note = next((e for e in s.events if e.get("what") == "scaled_roots"), None)
        if note is None:
            note = {"what": "scaled_roots", "roots": [], "made_from": []}
            s.events.append(note)
        cast(list[int], note["roots"]).append(root)
        cast(list[str], note["made_from"]).append(made_from)

    def _on_clip(self) -> None:
        """Gradients clipped while the GradScaler has not unscaled them: the threshold is
        compared with scaled gradients (P14)."""
        s = self._s
        opt = self._optimizer() if self._optimizer is not None else None
        states = getattr(self._scaler, "_per_optimizer_states", None)
        if opt is None or not isinstance(states, dict) or not getattr(self._scaler, "_enabled", True):
            return
        entry = states.get(id(opt))  # absent until unscale_()/step() touch it in this step
        stage = entry.get("stage", 0) if isinstance(entry, dict) else 0
        # OptState.READY (0): neither unscale_() nor step() ran for this optimizer in this step
        if int(getattr(stage, "value", stage)) == 0 and not s.clip_flagged:
            s.clip_flagged = True
            s.events.append({"what": "clip_before_unscale", "src": user_src()})

    def _on_scale_update(self) -> None:
        """GradScaler.update() after a step whose backward ran and no optimizer.step() read the
        gradients: the scaler skipped it (inf/NaN).  They are read now, unscaled and still there
        -- at the step's end the loop's zero_grad() would have cleared them, and the step would
        read as one whose parameters got no gradient."""
        s = self._s
        if s.micro > 0 and s.stats is None:
            s.stats = self._grad_stats(s, [r() for r in self._params])
            # the step ends at the next forward, after the loop's scheduler.step(): its learning
            # rates are the ones in force now
            s.lr = _lrs(self._optimizer() if self._optimizer is not None else None)
            # ... and its gradients' bytes are those there now: the loop's zero_grad() frees them
            s.grad_st = grad_storages([p for r in self._params if (p := r()) is not None])

    def _on_loss_check(self, t: torch.Tensor) -> None:
        self._s.checked = weakref.ref(t)

    def _skipped_loss(self, s: _StepState) -> None:
        """The loss of the step's latest forward, when the loop checked it and no backward used
        that forward: a batch skipped for a non-finite loss (one read, on such batches only).
        A non-finite one arms the NaN checks of the next captured step, as a backward's would."""
        t = s.checked() if s.checked is not None else None
        s.checked = None
        if t is None or not s.forwards:
            return
        _reached(s)
        fwd = s.forwards[-1]
        if not fwd.get("built_graph") or fwd.get("backward"):
            return
        value = float(t.detach())
        fwd["loss"] = value
        if not math.isfinite(value):
            if not self._nan_armed:
                self._inputs_at_bad_loss(s)
            self._nan_armed = True
            self._capture_next = self._capture_next or self.mode == "default"

    def _on_clip_norm(self, total: torch.Tensor, frame: Any) -> None:
        """A norm ``clip_grad_norm_`` took of the watched parameters' gradients (``frame``: the
        code that asked for it): the last one it takes is the total it returns, the gradients'
        norm before it scaled them to ``max_norm``.  Kept with the step (a 0-dim tensor, read
        with the gradient statistics, no sync of its own) so the doctor and the gradients view
        see the norm the loss made, not the one clipping left (P3 on a run that clips)."""
        loc = self._our_clip(frame)
        if loc is None or not self._clip_after_backward(total):
            return
        self._set_clip(total, float(loc.get("max_norm", math.nan)), float(loc.get("norm_type", 2.0)))

    def _on_clip_nothing(self, frame: Any) -> None:
        """``clip_grad_norm_`` of the watched parameters when none has a gradient: torch returns
        ``torch.tensor(0.0)`` without taking a norm.  Before the step's first backward -- after
        a ``zero_grad()``, which sets them to None -- it is the clipping before backward() that
        P3 names (QA 51b: only ``zero_grad(set_to_none=False)``'s zeros, which get a norm, were
        seen).  Never the step's clipping: there was nothing to clip."""
        if self._our_clip(frame) is not None:
            self._clip_after_backward()

    def _our_clip(self, frame: Any) -> dict[str, Any] | None:
        """The locals of the ``clip_grad_norm_`` call that ``frame`` (the code that took a norm,
        or made clip_grad_norm_'s zero) runs for, when it clips the watched parameters."""
        f = frame
        for _ in range(4):  # _get_total_norm (or a comprehension in it) -> wrappers -> clip_grad_norm_
            if f is None or f.f_code.co_name == "clip_grad_norm_":
                break
            f = f.f_back
        if f is None or f.f_code.co_name != "clip_grad_norm_":
            return None  # get_total_norm called by the user: no clipping
        loc = f.f_locals
        params = loc.get("parameters")
        if not isinstance(params, list) or not any(id(p) in self._param_names for p in params):
            return None  # another model's clipping (a GAN's other network)
        return loc

    def _clip_after_backward(self, total: torch.Tensor | None = None) -> bool:
        """Whether a clipping of the watched gradients follows a backward of its step.  One
        before the step's first backward (or after its optimizer.step(), the next step's state)
        clips gradients no optimizer.step() of this step reads -- last step's, or zeros -- and
        leaves this step's unclipped: noted once with its line, and its norm (0 after a
        zero_grad(set_to_none=False)) is not the step's (it read as P3's "vanished", QA 37a).
        Noted ``after_step`` when it came before any forward of the step, on gradients of a
        non-zero norm (``total``): the last step's, after its optimizer.step() -- a clip in a
        helper defined above the loop, or on step()'s line, read as "before backward()" (QA 52c;
        one read of the norm, only in such a loop)."""
        s = self._s
        if s.micro > 0:
            return True
        if not any(e.get("what") == "clip_before_backward" for e in s.events):
            note: dict[str, Any] = {"what": "clip_before_backward", "src": user_src()}
            if total is not None and not s.forwards and self._step > 0 and float(total.detach()) != 0.0:
                note["after_step"] = True
            s.events.append(note)
        return False

    def _on_clip_with_norm(self, frame: Any) -> None:
        """``clip_grads_with_norm_(parameters, max_norm, total_norm)`` of the watched parameters'
        gradients, clamping its coefficient: a total taken apart (``get_total_norm``, as
        accelerate's ``clip_grad_norm_`` and so the HF Trainer do) is clipped here, where the
        total and ``max_norm`` meet.  ``clip_grad_norm_``'s own call comes here too, with the
        total already kept from its norm."""
        if frame.f_code.co_name != "_clip_grads_with_norm_":
            return
        loc = frame.f_locals
        total, grads = loc.get("total_norm"), loc.get("grads")
        if not isinstance(total, torch.Tensor) or not isinstance(grads, list):
            return
        if self._s.clip is not None and self._s.clip[0] is total:
            return
        ours = {id(p.grad) for r in self._params if (p := r()) is not None and p.grad is not None}
        if not any(id(g) in ours for g in grads):
            return  # another model's clipping (a GAN's other network)
        if not self._clip_after_backward(total):
            return
        f, norm_type = frame.f_back, 2.0  # the norm's type is the caller's (accelerate's norm_type)
        for _ in range(3):
            if f is None:
                break
            if isinstance(f.f_locals.get("norm_type"), (int, float)):
                norm_type = float(f.f_locals["norm_type"])
                break
            f = f.f_back
        self._set_clip(total, float(loc.get("max_norm", math.nan)), norm_type)

    def _set_clip(self, total: torch.Tensor, max_norm: float, norm_type: float) -> None:
        """The step's clipping; a hand-written update's statistics, read already, are read
        again at the update (``_restat``)."""
        s = self._s
        s.clip = (total, max_norm, norm_type)
        # (inside step(), by a step pre-hook of the optimizer: at its update, else as it returns)
        inside = s.step_began is not None and s.micro == s.step_began
        s.restat = s.stats is not None and (inside or self._unhooked())

    def _on_move(self, inp: torch.Tensor, out: Any, same_place: bool = False, to_device: bool = True) -> None:
        """``same_place``: ``clone()`` or ``torch.tensor(t)``, a copy on the same device in the
        same dtype, counted only when the same tensor is copied again in a later step.
        ``to_device``: the call names a device (``.to(device)``, ``.cuda()``, ``.cpu()``): one
        that finds its tensor there already is placement code run every step; a no-op dtype
        conversion (``.float()`` of a float32 gradient, for its norm) is a safeguard, not counted."""
        s = self._s
        if out is inp:
            if to_device:
                s.noop_to += 1
                if not s.noop_src:
                    s.noop_src = user_src()
            return
        if not isinstance(out, torch.Tensor) or out.layout != torch.strided or inp.layout != torch.strided:
            return
        nbytes = out.numel() * out.element_size()
        if same_place and (inp.requires_grad or nbytes < _BIG_COPY):
            # a small clone every step is often meant (an initial hidden state, a mask the step
            # writes into), and one of a tensor that needs grad is part of the graph: a
            # dataset copied over every step is the pitfall
            return
        src = user_src()
        if not same_place:
            if out.device != inp.device:
                s.copies += 1
                s.copy_bytes += nbytes
            origin = s.conversions.get(_first_storage(inp))
            if origin is not None and origin[:2] == (out.dtype, out.device) and origin[2]() is not None:
                _bump(s.moves, ("round_trip", src), nbytes)  # converted there and back within the step
        # the same tensor object converted again in a later step, its values unchanged: work that
        # belongs before the loop.  Keyed by the object (held weakly), not its address, which a
        # new batch may reuse; its version counter tells a tensor written in place since (a
        # parameter the optimizer updated, a .grad accumulated into) from the same data.
        if self._depth and (inp.element_size() == 1 or isinstance(inp, nn.Parameter)):
            # a weight cast in the forward -- an int8/float8 (or packed 4-bit) weight dequantized,
            # as weight-only quantization and QLoRA do on purpose to keep it small; a parameter
            # cast to its input's dtype -- is the model's design, not data moved again
            return
        if inp.device.type == "cpu" and not inp.untyped_storage().resizable():
            # memory torch does not own -- a numpy array's, ``torch.from_numpy(X_np).float()``:
            # a new tensor object over the same data every step (QA 46a: missed); told by its
            # address and a sample of its values, which no version counter watches
            self._repeat_external(("tensor", inp.untyped_storage().data_ptr(), inp.storage_offset(), tuple(inp.shape),
                                   inp.dtype, out.dtype, out.device), inp, src, nbytes)
            return
        key = (id(inp), out.dtype, out.device)
        seen = self._converted.get(key)
        version = -1 if inp.is_inference() else inp._version  # an inference tensor has no counter
        if seen is not None and seen[0]() is inp and seen[1] < self._step and seen[2] == version:
            _bump(s.moves, ("repeat_copy", src), nbytes)
        self._converted[key] = (weakref.ref(inp), self._step, version)
        _forget_oldest(self._converted, 4096)
        if not same_place:
            s.conversions[_first_storage(out)] = (inp.dtype, inp.device, weakref.ref(out))

    def _on_array_copy(self, array: Any, out: torch.Tensor) -> None:
        """``torch.tensor(X_np)`` / ``torch.as_tensor(X_np, dtype=...)`` of a numpy array: the
        same array's data copied again in a later step is a repeat (P12), as a tensor's is."""
        nbytes = out.numel() * out.element_size()
        if self._depth or nbytes < _BIG_COPY or out.layout != torch.strided:
            return
        try:
            view = torch.from_numpy(array)  # (no copy: the array's own memory)
        except (TypeError, ValueError, RuntimeError):
            return  # not a numpy array of a dtype torch reads
        face = array.__array_interface__
        self._repeat_external(("array", face["data"][0], tuple(view.shape), view.dtype, out.dtype, out.device),
                              view, user_src(), nbytes)

    def _repeat_external(self, key: tuple[Any, ...], data: torch.Tensor, src: str, nbytes: int) -> None:
        """A conversion of memory torch does not own (``data``: a CPU tensor over it): a repeat
        when a conversion of an earlier step had the same address, shape and types and the same
        values at 64 places spread over it (a sample, not a hash of it all: a new batch at a
        reused address differs there)."""
        if not data.is_contiguous() or not data.numel():
            return
        with _native.unrecorded(), torch.no_grad():
            flat = data.reshape(-1)
            sample = flat[:: max(1, flat.numel() // 64)][:64]
            mark = (float(sample.double().sum()), float(sample.double().abs().sum()), float(flat[-1].double()))
        seen = self._converted_ext.get(key)
        if seen is not None and seen[0] < self._step and seen[1] == mark:
            _bump(self._s.moves, ("repeat_copy", src), nbytes)
        self._converted_ext[key] = (self._step, mark)
        _forget_oldest(self._converted_ext, 1024)

    def _on_graph_copy(self, target: torch.Tensor, func: Any, fresh: bool) -> None:
        """A tensor without a graph (``fresh``), updated in place outside the forward while
        autograd records, now has one: when it leads back (a few nodes away) to a watched
        parameter of its own shape, it may be a copy of the weights -- an EMA, a target
        network -- updated without ``no_grad``.  It is one when the same tensor, its graph still
        on, is updated again in a later step (a penalty built in a fresh tensor each step and
        added to the loss is not): it holds a graph that each update extends (P7).  Said once
        a line."""
        if not fresh:
            self._copy_again(target)
        else:
            self._maybe_copy(target, func, user_src())

    def _on_eval_dropout(self, module: nn.Module | None, src: str, name: str) -> None:
        """A dropout function called at ``src`` with ``training`` at its default, in ``module``
        (None: a helper of the forward's) while it evaluates: once a line."""
        if src in self._eval_dropouts:
            return
        self._eval_dropouts.add(src)
        path = next((p for p, r in self._modules if r() is module), "") if module is not None else ""
        s = self._s
        s.events.append({"what": "eval_dropout", "fn": name, "module": path, "src": src, "forward": len(s.forwards) - 1})

    def _on_copy_arith(self, out: Any, args: tuple[Any, ...], func: Any) -> None:
        """The out-of-place form, between optimizer.step() and the next forward while autograd
        records: ``shadow = 0.99 * shadow + 0.01 * p`` makes a new tensor each step whose graph
        holds the last one's.  A result leading back to a watched parameter of its shape is
        remembered; one taken into such a call again in a later step is a copy of the weights
        whose graph each update extends (P7)."""
        for a in args:
            for t in a if isinstance(a, (list, tuple)) else (a,):
                if isinstance(t, torch.Tensor) and id(t) in self._weight_copies and self._copy_again(t):
                    return
        src = user_src(1)
        for t in out if isinstance(out, (list, tuple)) else (out,):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                self._maybe_copy(t, func, src)

    def _copy_again(self, t: torch.Tensor) -> bool:
        """``t``, remembered by ``_maybe_copy`` in an earlier step, its graph still on, is updated
        again: a copy of the weights (said once a line)."""
        copies = self._weight_copies
        seen = copies.get(id(t))
        if seen is None or seen[0]() is not t or seen[1] >= self._step:
            return False
        del copies[id(t)]
        if seen[3] not in self._graph_copies:
            self._graph_copies.add(seen[3])
            self._s.events.append({"what": "graph_copy", "param": seen[2], "op": seen[4], "src": seen[3]})
        return True

    def _maybe_copy(self, t: torch.Tensor, func: Any, src: str) -> None:
        """Remember ``t`` when its graph leads back, a few nodes away, to a watched parameter of
        its own shape."""
        names = self._param_names
        todo: list[tuple[Any, int]] = [(t.grad_fn, 0)]
        seen_nodes, found = 0, None
        while todo and seen_nodes < 32 and found is None:
            node, depth = todo.pop()
            seen_nodes += 1
            var = getattr(node, "variable", None)
            if var is not None:
                if id(var) in names and var.shape == t.shape:
                    found = names[id(var)]
                continue
            if depth < 4:
                todo.extend((n, depth + 1) for n, _ in node.next_functions if n is not None)
        if found is None:
            return
        copies = self._weight_copies
        if len(copies) > 4096:  # bounded: forget the oldest
            for k in list(copies)[:2048]:
                del copies[k]
        copies[id(t)] = (weakref.ref(t), self._step, found, src, getattr(func, "__name__", ""))

    # ------------------------------------------------------------------ backward
    def _run_backward(self, func: Any, kind: str, args: Any, kwargs: dict[str, Any]) -> Any:
        if not self._active:
            return call_as_user(func, args, kwargs)
        self._last_event = time.monotonic()
        if self._s.in_backward and self._s.micro > 0 and self._unhooked():
            # optimizers stepped inside the last backward and no forward hook ended that step
            # (a compiled model's hooks do not run): this backward begins the next one
            self._safe("step", self._close_step, False)
        ours = self._safe("backward", self._before_backward, kind, args, kwargs)
        if not ours:
            return self._unwatched_backward(func, args, kwargs)
        t0 = time.perf_counter()
        self._backward_running = True
        try:
            out = call_as_user(func, args, kwargs)
        except BaseException:
            # not bound to a name here: this frame would hold the exception, whose traceback
            # holds this frame -- a cycle that keeps the failed backward's graph (``args``)
            # alive until a collection, after the loop has caught the error and moved on (P7)
            self._safe("backward", self._backward_failed, sys.exc_info()[1])
            raise  # the user's own exception, unchanged
        finally:
            self._backward_running = False
            self._last_event = time.monotonic()
            self._safe("backward", self._after_backward, t0)
        if kind == "grad":
            self._safe("grads", self._returned, args, kwargs, out)
        return out

    def _run_grad(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """``torch.autograd.grad``: with ``create_graph=True`` the nodes it builds are marked;
        without, a call for gradients of the watched parameters is a backward pass of the step
        (a loop that computes its gradients so and assigns ``p.grad`` itself)."""
        create = kwargs.get("create_graph", args[4] if len(args) > 4 else False)
        if not self._active:
            return call_as_user(func, args, kwargs)
        inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
        of_params = self._safe("backward", self._of_params, inputs)
        if not create and of_params:
            return self._run_backward(func, "grad", args, kwargs)
        # gradients for inputs only (a gradient penalty's, an attack's): what they send into
        # the module outputs is no gradient of the loss (a WGAN-GP critic's last layer read
        # the penalty's ones vector, QA 45b); the statistics are the step's backward()'s
        s = self._s
        rows = None if of_params else self._safe("activation_grads", _hold_activation_rows, s)
        if not create:
            retain = kwargs.get("retain_graph", args[3] if len(args) > 3 else None)
            self._safe("backward", _reached, s)  # (what earlier passes reached: theirs)
            out = call_as_user(func, args, kwargs)
            if not retain:  # the graph is freed: no backward of the step can follow through it
                self._safe("backward", _reached, s, True)
            self._safe("grad_consts", self._keep_grad_consts, out)
        else:
            outputs = args[0] if args else kwargs.get("outputs")
            before = self._safe("higher_order", _walk_of, outputs)  # held: node ids stay valid
            out = call_as_user(func, args, kwargs)
            if before is not None:
                self._safe("higher_order", _stamp_higher_order, before, out)
        if rows is not None:
            self._safe("activation_grads", _restore_activation_rows, s, rows)
        return out

    def _returned(self, args: Any, kwargs: dict[str, Any], grads: Any) -> None:
        """The gradients a ``torch.autograd.grad`` pass returned for the watched parameters
        among its ``inputs``: the step's statistics, unless ``optimizer.step()`` reads them
        later from ``.grad`` (where the loop puts them) -- a hand-written update (``p -= lr * g``,
        MAML's inner loop) leaves ``.grad`` empty, and its gradients would read as missing."""
        inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
        ts = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs or ())
        outs = [grads] if isinstance(grads, torch.Tensor) else list(grads or ())
        of = {id(t): g for t, g in zip(ts, outs, strict=True)}
        params: list[torch.Tensor | None] = [r() for r in self._params]
        s = self._s
        self._note_inputs(s, ts)
        s.stats = self._grad_stats(s, params, [of.get(id(p)) if p is not None else None for p in params])

    def _on_grad_cleared(self, p: Any) -> None:
        """A watched parameter's ``.grad`` set to None after the step's backward (a zero_grad()
        before optimizer.step() clears what the backward made; a layer frozen by hand): the
        first such line of the step, and the parameters (an event ``grads_cleared``)."""
        name = self._param_names.get(id(p))
        if name is not None:
            self._cleared([name])

    def _on_grad_assigned(self, p: Any) -> None:
        """``p.grad = g`` of a watched parameter after a backward of the step: the gradients
        optimizer.step() reads are the loop's own (PCGrad's merged gradient after it cleared
        each task's pass; an event ``grads_assigned``, once a step)."""
        s = self._s
        if id(p) in self._param_names and not any(e.get("what") == "grads_assigned" for e in s.events):
            s.events.append({"what": "grads_assigned", "src": user_src(), "micro": s.micro})

    def _on_grads_zeroed(self, t: Any) -> None:
        """``zero_()`` (or ``_foreach_zero_``) of watched parameters' ``.grad``: zero_grad(
        set_to_none=False), ``p.grad.zero_()`` to keep a layer fixed; as _on_grad_cleared."""
        ts = list(t) if isinstance(t, (list, tuple)) else [t]
        s = self._s
        if s.grad_names is None or s.grad_names[0] != s.micro:  # (once per backward: a zero_() per parameter)
            s.grad_names = (s.micro, {id(p.grad): n for r in self._params if (p := r()) is not None
                                      and p.grad is not None and (n := self._param_names.get(id(p))) is not None})
        grads = s.grad_names[1]
        names = [n for g in ts if (n := grads.get(id(g))) is not None]
        if names:
            self._cleared(names)

    def _cleared(self, names: list[str]) -> None:
        """One event per backward it follows (``micro``: the passes before it): a clearing after
        the step's last one is what optimizer.step() sees; one before a later backward (a SAC
        loop's critic zero_grad() after the policy's backward) is the usual reset."""
        s = self._s
        event = next((e for e in reversed(s.events) if e.get("what") == "grads_cleared"), None)
        if event is None or event.get("micro") != s.micro:
            event = {"what": "grads_cleared", "src": user_src(), "micro": s.micro, "params": []}
            s.events.append(event)
        held = cast("list[str]", event["params"])
        if len(held) < 4096:
            held.extend(n for n in names if n not in held)

    def _keep_grad_consts(self, grads: Any) -> None:
        """The results of a ``torch.autograd.grad`` for inputs without ``create_graph``, taken
        with autograd on outside a forward: constants, with no graph back to the parameters.  A
        gradient penalty made from them (WGAN-GP's ``((g.norm(2, dim=1) - 1) ** 2).mean()``)
        trains nothing; the mode follows them to where one joins the loss (_on_grad_const)."""
        if not torch.is_grad_enabled() or self._depth:
            return
        src = user_src()
        for g in [grads] if isinstance(grads, torch.Tensor) else list(grads or ()):
            if isinstance(g, torch.Tensor) and g.grad_fn is None and len(self._grad_consts) < _GRAD_CONSTS:
                self._grad_consts[id(g)] = (weakref.ref(g), src)

    def _on_grad_const(self, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        """A call of the user's on such a constant: a result without a graph is one too; a
        one-value sum with a graph, of a one-value constant -- ``d_loss + 10 * gp`` -- is the
        penalty added to the loss as a constant, when a backward() is called on it (an event
        ``grad_constant``, P9: the call lacked ``create_graph=True``; _joined_roots).  An
        attack's step (``x + eps * g.sign()``), many values, is neither, nor a loss weighed by a
        constant (``loss / g_norm``)."""
        if self._grad_joins:
            self._on_joined(func, args, out)
        consts = self._grad_consts
        found: tuple[torch.Tensor, str] | None = None
        for a in (*args, *kwargs.values()):
            for t in (a if isinstance(a, (list, tuple)) else (a,)):
                entry = consts.get(id(t)) if isinstance(t, torch.Tensor) else None
                if entry is not None and isinstance(t, torch.Tensor) and entry[0]() is t:
                    found = (t, entry[1])
                    break
            if found:
                break
        if found is None or not isinstance(out, torch.Tensor):
            return
        const, src = found
        if out.grad_fn is None:
            if not out.requires_grad and len(consts) < _GRAD_CONSTS:
                consts[id(out)] = (weakref.ref(out), src)
        elif func in _ADDS and const.numel() == 1 and out.numel() == 1 and not self._depth:
            # a sum a backward() may be called on: told if one is (a sum only printed, or a
            # constant target subtracted inside a penalty -- ``(sg.norm() - t_norm) ** 2`` -- is
            # not the loss; QA 46d)
            self._grad_joins[id(out)] = (weakref.ref(out), src, user_src())

    def _on_joined(self, func: Any, args: Any, out: Any) -> None:
        """A sum of a loss and a constant penalty (_on_grad_const) added to more, or scaled by a
        number, is still that sum."""
        if not isinstance(out, torch.Tensor) or out.numel() != 1 or len(self._grad_joins) >= _GRAD_CONSTS:
            return
        if func not in _ADDS and not (func in _SCALES and not any(isinstance(a, torch.Tensor) for a in args[1:])):
            return
        for a in args:
            entry = self._grad_joins.get(id(a)) if isinstance(a, torch.Tensor) else None
            if entry is not None and entry[0]() is a:
                self._grad_joins[id(out)] = (weakref.ref(out), entry[1], entry[2])
                return

    def _joined_roots(self, roots: list[torch.Tensor]) -> None:
        """A backward of such a sum: the penalty in it is a constant (an event ``grad_constant``, P9)."""
        for t in roots:
            entry = self._grad_joins.get(id(t))
            if entry is not None and entry[0]() is t:
                event: dict[str, object] = {"what": "grad_constant", "grad_src": entry[1], "src": entry[2]}
                if event not in self._s.events:
                    self._s.events.append(event)

    def _of_params(self, inputs: Any) -> bool:
        """Whether ``inputs`` (a tensor or several) hold any of the watched parameters."""
        ts = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs or ())
        ids = {id(p) for r in self._params if (p := r()) is not None}
        return any(id(t) in ids for t in ts)

    def _before_backward(self, kind: str, args: Any, kwargs: dict[str, Any]) -> bool:
        if self._depth and not self._forward_running(None):  # a backward after a forward cut short
            self._end_cut_forward()
        if kind == "tensor":
            roots = [args[0]]
        else:
            r = args[0] if args else kwargs.get("outputs" if kind == "grad" else "tensors")
            roots = [r] if isinstance(r, torch.Tensor) else list(r or [])
        at = 3 if kind == "grad" else 2  # torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph, ...)
        retain = kwargs.get("retain_graph", args[at] if len(args) > at else None)
        create = kwargs.get("create_graph", args[at + 1] if len(args) > at + 1 else False)
        weights = _root_weights(kind, args, kwargs, len(roots))
        if weights is not None:
            weights = [w for t, w in zip(roots, weights, strict=True) if isinstance(t, torch.Tensor)]
        roots = [t for t in roots if isinstance(t, torch.Tensor)]
        if self._grad_joins:
            self._safe("grad_consts", self._joined_roots, roots)
        s = self._s
        # light and default mode may reuse the last walk for a backward with this key (see _reuse_walk)
        walk_key = self._walk_key(s, roots) if self.mode != "full" else None
        # an earlier step's graph alive may be inside this one (P7): walked, to tell them apart
        nested = self._earlier_alive()
        reuse = self._reuse_walk(s, walk_key, bool(create)) if walk_key is not None and not nested else None
        walk: AutogradWalk | None = None
        if s.capture:
            # reading a captured graph makes thousands of objects (node records, saved-tensor
            # wrappers): without the collector's passes over them (dozens a step on a deep
            # model); it resumes when the backward returns (_after_backward), as after a
            # recorded backward
            self._pause_gc()
        if reuse is not None:
            sig, n_nodes = reuse
        else:
            walk = AutogradWalk([t.grad_fn for t in roots])
            sig, n_nodes = walk.signature(), walk.interior()
            if walk_key is not None:
                if len(self._walked) >= _MAX_STRUCTURES:
                    self._walked.clear()
                self._walked[walk_key] = (sig, n_nodes)
        if walk is not None and walk.nodes:
            hit = walk.touching_node(self._param_names, self._touches.get(sig, -1))
            if hit < 0 and not _through_outputs(walk, s):
                return False  # another model's backward (several watches in one process)
            if len(self._touches) > 64:
                self._touches.clear()
            self._touches[sig] = hit
            if self.mode == "light":  # no graph records: the leaves the backward reaches, told
                reached, outside, through = walk.leaves(self._param_names, self._held_as)
                s.unregistered += outside
                # (one reached otherwise by another backward of the step is not through it)
                s.through_fn = {n: fn for n, fn in {**s.through_fn, **through}.items() if n in through or n not in reached}
                s.reached = reached if s.reached is None else s.reached | reached
        self._owner = threading.get_ident()
        if kind != "grad":  # Tensor.backward(gradient, retain_graph, create_graph, inputs); autograd.backward(..., grad_variables, inputs)
            at = 4 if kind == "tensor" else 5
            self._note_inputs(s, kwargs.get("inputs", args[at] if len(args) > at else None))
        if self._capturing_ops:
            self._stop_recorder()
        if not s.started:
            self._start_step(s)
        if not s.forwards and not _forward_pending(s):
            # no forward of the root module this step (compiled, or parts of the model called
            # directly, or an earlier step's graph retained), be the loss's graph walked or not (a
            # leaf made anew from a number has none): only the function mode sees such a
            # backward, so it stays on (a second backward through one forward, retain_graph, is
            # not that)
            self._mode_always = True
        if (walk is not None and walk.nodes and not _forward_pending(s)
                and not self._compiled_forward(s, walk) and not s.forwards and not s.transformed
                and not _through_a_forward(walk, self._param_names)):
            # (a backward through an earlier step's forward, its graph retained -- an
            # actor-critic's value loss after the actor's optimizer.step() ended the step -- is no
            # sign of a model called past its hooks)
            self._note_direct_calls()
        if s.scale_version is None and self._scaler is not None:
            self._snapshot_scale(s)  # GradScaler creates its scale lazily, in its first scale()
        params = [r() for r in self._params]
        # a closure's second evaluation inside optimizer.step() (LBFGS): the step's loss stays
        # the first's, which step(closure) returns and the loop logs
        later_closure = s.passes_in_step() > 0
        if kind == "grad":
            # the gradients are returned, not accumulated into .grad: what .grad holds now says
            # nothing about zero_grad, and the doctor does not count this pass as accumulation
            s.events.append({"what": "autograd_grad", "micro": s.micro})
        elif s.micro == 0:
            s.pre_nonzero, all_none, all_zero = nonzero_grads(params)
            if s.pre_nonzero:
                s.pre_grads = [(i, weakref.ref(g), g._version) for i in s.pre_nonzero
                               if (p := params[i]) is not None and (g := p.grad) is not None and not g.is_sparse]
            if self._orphans:
                self._outside_grads(s)
            s.zero_grad = 1 if (all_zero or all_none) else 0
            s.set_to_none = all_none
            s.accumulated = 1
            s.summed = []
        elif self._grads_reset(params):
            s.zero_grad += 1  # grads were reset between micro-batches (an LBFGS closure does)
            s.accumulated = 1
            if later_closure:
                s.closure_reset = True
            else:
                s.summed = []
        else:
            s.accumulated += 1
        s.pass_summed = len(s.summed)
        fns = []
        # the line of a call that took a root in before this backward (probing, _on_holder)
        holder_src = {id(t): src for ref, src in s.holders if (t := ref()) is not None} if s.holders else {}
        held_at = [holder_src.get(id(t), "") for t in roots] if holder_src else [""] * len(roots)
        for i, t in enumerate(roots):
            fn = t.grad_fn
            s.roots.append(type(fn).__name__ if fn is not None else "None")
            if t.numel() == 1 and len(s.losses) < 1024:
                if kind != "grad" and not (later_closure and s.closure_reset):
                    if later_closure and s.tentative_from is None:
                        s.tentative_from = len(s.summed)
                    s.summed.append(len(s.losses))
                with _unseen():  # the loop's dispatch modes do not see the alias
                    w = weights[i] if weights is not None else None
                    # read with the gradients at the boundary; a root backpropagated with an
                    # explicit gradient (``backward([l1, l2], [1, 0.01])``) counts as weighted;
                    # a GradScaler's scaled loss as the loss it scaled
                    scaled = self._before_scaling(s, fn) if s.unscaled is not None else None
                    value = t.detach() if scaled is None else scaled[1]
                    if scaled is not None:
                        self._note_scaled(s, len(s.roots) - 1, scaled[0])
                    s.losses.append(value if w is None else (value * w.detach()).reshape(t.shape))
            fns.append(fn)
        s.backward_src.append(user_src(3))  # 3: past this method and _safe, ours
        s.sigs.append(sig)
        key = (sig, s.in_shapes)
        cached = self._saved_cache.get(key)
        if cached is None or s.capture:
            # same structure and input shapes -> same saved tensors: walk them once per shape
            assert walk is not None  # a reused walk requires its cached saved bytes
            records_next = s.capture and s.graph is None and "graph" not in self._disabled
            with _unseen():  # unpacking a saved output detaches it
                by_storage, unreadable = walk.saved(self._not_activations, keep=records_next)
            cached = (sum(by_storage.values()), unreadable)
            if s.in_st:
                s.in_saved = max(s.in_saved, sum(n for ptr, n in by_storage.items() if ptr in s.in_st))
            if len(self._saved_cache) >= _SAVED_SHAPES:
                self._saved_cache.clear()
            if not unreadable:  # a graph with unreadable saved tensors is re-examined every time
                self._saved_cache[key] = cached
        saved, broken = cached
        own_nodes, own_saved = n_nodes, saved
        outputs: list[tuple[_Sentinel, int, int]] = []
        if nested and walk is not None:
            with _unseen():
                inner = _nested(walk, self._step, self._not_activations, not retain)
            own_nodes, own_saved, outputs = max(n_nodes - inner.nodes, 0), max(saved - inner.saved, 0), inner.outputs
        s.saved_peak = max(s.saved_peak, own_saved)
        for b in broken:
            s.events.append({"what": "saved_unreadable", "node": b, "micro": s.micro})
        kept_saved = own_saved if retain else 0  # what the graph holds once this backward returns
        for ref in s.out_sentinels:  # the forward outputs' graphs: about this size
            # (not an evaluation's, sized as it ended: this backward did not go through it, QA 43)
            if (out := ref()) is not None and out.nodes == 1 and not out.sized:
                out.nodes, out.saved, out.usable = own_nodes, kept_saved, bool(retain)
        for out_sent, out_nodes, out_saved in outputs:  # or, nested in earlier steps' graphs, just this size
            out_sent.nodes, out_sent.saved = out_nodes, out_saved if retain else 0
        for t, fn, held in zip(roots, fns, held_at, strict=True):
            if fn is not None:
                fn.metadata.pop("torchscope_out_sentinel", None)  # the output is the loss: one sentinel
                sentinel = _Sentinel(self._step, own_nodes, s.backward_src[-1] if s.backward_src else "")
                sentinel.saved, sentinel.usable, sentinel.held_at = kept_saved, bool(retain), held
                sentinel.loss = weakref.ref(t)
                fn.metadata["torchscope_sentinel"] = sentinel  # type: ignore[index]
                self._sentinels.append(weakref.ref(sentinel))
        if retain:
            s.retained = True
        if create:
            s.events.append({"what": "create_graph", "micro": s.micro})
            s.before_create = walk  # held until the pass returns, so node ids stay valid
        s.saved_now = saved
        if (self.mode == "full" and s.capture and s.recorder is None and s.forwards and s.forwards[-1].get("compiled")
                and "ops" not in self._disabled):
            # a compiled forward ran no hook of ours, so no recorder began there: full mode
            # records the step from its backward on, the optimizer's ops included (QA 43a F5)
            s.recorder = self._safe("ops", self._new_recorder, s, (), {})
            _compile.follow(_pause_for_compile)
        if s.capture and walk is not None and s.graph is None and "graph" not in self._disabled:
            rec = s.recorder
            ops_of, tids_of = rec.node_links(walk) if rec is not None else ({}, {})
            nodes = walk.records(self._param_names, rec.op_module if rec is not None else _no_module, s.micro, s.sid, ops_of,
                                 self._held_as, rec.near if rec is not None else None)
            s.unregistered = walk.unregistered
            casts = rec.cast_ops() if rec is not None else set()
            if casts:
                for n in nodes:
                    if n.get("op") in casts:
                        n["autocast_cast"] = True
            if rec is not None:
                for i, tids in tids_of.items():
                    for tid in tids:
                        rec.set_grad_fn(tid, i)
                rec.flag_inplace_saved(_saved_by_op(nodes))
            s.graph = {
                "kind": "graph",
                "step": self._step,
                "rank": self._rank.rank,
                "micro": s.micro,
                "nodes": nodes,
                "edges": walk.edges,
                "root": 0,
                "retained": bool(retain),
            }
            # full mode's native recorder, which records the backward, times most nodes itself
            timed = rec.time_nodes(walk) if isinstance(rec, NativeRecorder) and self.mode == "full" else set()
            started = self._node_started(s, nodes, rec) if isinstance(rec, OpRecorder) and self.mode == "full" else None
            s.timer = BackwardTimer(walk.nodes, timed, started)
            if s.check_nan:
                s.nan_origin = NonFiniteOrigin(walk.nodes)
            s.walk = walk  # nodes stay alive until this backward returns (hooks removed then)
        if walk is not None:
            walk.forget_saved()  # what saved(keep=True) read, if records() did not take it
        if self.mode == "full" and s.recorder is not None:
            self._untracked_frees(s)
            self._pause_gc()
            s.recorder.phase = "backward"
            s.recorder.__enter__()
            self._rec_thread = threading.get_ident()
            self._capturing_ops = True
        s.micro += 1
        return True

    def _node_started(self, s: _StepState, nodes: list[NodeRecord], rec: OpRecorder) -> Callable[[int], None]:
        """For the Python recorder of a full-mode backward: the ops a node runs are the backward
        of the module whose forward op made it (the native recorder does this itself)."""
        made: dict[int, tuple[str, int, bool]] = {}
        for n in nodes:
            o = n.get("op", rec.near.get(n["id"]))  # (a custom Function's node: its module's op)
            if o is not None and 0 <= o < len(rec.ops):
                op = rec.ops[o]
                made[n["id"]] = (str(op["module"]), int(op["call"]), "outside_model" not in op.get("flags", ()))

        def started(i: int) -> None:
            s.node_module = made.get(i)

        return started

    def _walk_key(self, s: _StepState, roots: list[torch.Tensor]) -> tuple[Any, ...]:
        """What a backward's graph is known by between walks (``_reuse_walk``): with the
        extension, its structure itself -- node classes and edges, walked in C++ -- so a graph
        is walked in Python once per structure; else the roots' classes and the number of nodes
        made since the previous backward (``_nodes_since``)."""
        if s.native is not None:
            try:
                key, self._walked_nodes = s.native.graph_key(roots, self._walked_nodes)
                return (key, self._walked_nodes, s.micro)
            except (TypeError, RuntimeError):  # not expected: the cheap key, not the backward's capture off
                pass
        return (tuple(type(t.grad_fn) for t in roots), s.micro, self._nodes_since(roots))

    def _nodes_since(self, roots: list[torch.Tensor]) -> int:
        """Autograd nodes this thread made since the previous backward's root was made -- the
        forward and loss of this micro-batch (from the roots' sequence numbers: one counter per
        thread, one number per node made): a loop whose length or branches change changes it."""
        seq = _sequence_nr(roots[0].grad_fn if roots else None)
        since, self._last_seq = seq - self._last_seq, seq
        return since

    def _reuse_walk(self, s: _StepState, key: tuple[Any, ...], create: bool) -> tuple[str, int] | None:
        """(signature, node count) of an earlier walk when this backward's graph can be taken to
        have its structure: the same walk key (``_walk_key``), a root-module forward pending, one
        watch in the process, and the saved bytes of that structure at these input shapes known
        (a new shape -- dynamic padding's next length -- is walked once); captured steps walk.
        With the extension the key is the structure, so a change is seen at the step it happens.
        Without, the key is cheap facts, and the graph is walked anyway every GRAD_STATS_EVERY
        steps: a change that keeps them -- one activation function swapped for another -- is
        seen within that many steps.  (A walk is O(nodes) Python, 1-1.5 us a node: on deep
        models the largest per-step cost; graph_key's C++ walk, ~30 ns a node.)"""
        w = self._walked.get(key)
        if (
            w is None
            or create
            or s.capture
            or Watch._n_active != 1
            or (s.native is None and self._step % GRAD_STATS_EVERY == 0)
            or (w[0], s.in_shapes) not in self._saved_cache
            or not _forward_pending(s)
        ):
            return None
        return w

    def _compiled_forward(self, s: _StepState, walk: AutogradWalk) -> bool:
        """A backward through our parameters with no forward of ours pending: a forward compiled
        by ``torch.compile`` (Dynamo traced our hooks away) shows up here, as the graph's
        ``CompiledFunctionBackward`` node; it gets its ``forwards`` entry now.  Whether it was one."""
        if not any(type(n).__name__ == "CompiledFunctionBackward" for n in walk.nodes):
            return False
        self._fast.compiled_forward()  # no more global module hooks of ours (see _fastpath)
        model = self._model()
        s.forwards.append(
            {
                "micro": len(s.forwards),
                "grad_mode": True,
                "inference_mode": False,
                "training": bool(model is not None and model.training),
                "built_graph": True,
                "backward": True,
                "compiled": True,
            }
        )
        return True

    def _note_direct_calls(self) -> None:
        """Once: the model's parameters got gradients from a step without a call of the model
        itself -- ``model.forward(x)``, ``model.encode(x)`` or its submodules called directly.
        Module hooks only run in ``model(x)``, so that step is recorded without ops; from the
        next one on, its direct submodules' calls are its forwards (_enter_by_children)."""
        if self._direct_noted:
            return
        self._direct_noted = True
        model = self._model()
        entered = model is not None and self._safe("forward", self._enter_by_children, model) is True
        names = ", ".join(p for p in self._entries.values() if "." not in p)
        no_forward = model is not None and getattr(type(model), "forward", None) is getattr(nn.Module, "forward", None)
        level = "warning"
        if no_forward and not isinstance(model, (nn.ModuleDict, nn.ModuleList)):
            # a class of its own whose methods call its parts (CleanRL's agent: get_value(x),
            # get_action_and_value(x)): one model, its calls recorded from the next step on; the
            # GAN's "watch each model" read as advice to split it (QA 49a)
            level = "info"
            msg = (
                f"torchscope: {self._model_name} has no forward of its own: its methods call its submodules "
                + (f"directly, and from the next step on their calls ({names}) are recorded as its forwards; "
                   "this step has no forward ops" if entered else "directly, and these steps have no forward ops")
            )
        elif no_forward:
            # an nn.ModuleDict / ModuleList of models (a GAN's {"G": ..., "D": ...}): no model(x)
            msg = (
                f"torchscope: {self._model_name} has no forward of its own, so its submodules are "
                "called directly: "
                + (f"from the next step on their calls ({names}) are recorded as its forwards. To see "
                   "each model's steps apart, " if entered else "these steps are recorded without their "
                   "forward ops: ")
                + "watch each model the loop calls (torchscope.watch(models['G'], opt_g); "
                "torchscope.watch(models['D'], opt_d))"
            )
        else:
            msg = (
                f"torchscope: a backward through {self._model_name}'s parameters came without a call of "
                "the model itself (model.forward(x) or its submodules called directly skip its hooks): "
                + (f"from the next step on, calls of its submodules {names} are recorded as its forward; "
                   "this step has no forward ops" if entered else "these steps have no forward ops (call model(x))")
                + (". Under torch.compile(backend=\"eager\") no module hook runs: compile with the default "
                   "backend, whose compiled forward is one node" if _compiled_any() else "")
            )
        self._tell(msg, level)

    def _tell(self, msg: str, level: str, step: int | None = None, fields: dict[str, Any] | None = None,
              quiet: bool = False) -> None:
        """A line for the person at the terminal that the session keeps as a log event too
        (``quiet``: the log event only -- a line said before)."""
        if not quiet:
            say(msg)
        self._transport.emit({"kind": "log", "t": time.time(), "level": level, "message": msg,
                              "step": self._step if step is None else step, **(fields or {})})

    def _backward_failed(self, exc: BaseException) -> None:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        self._s.backward_errors.append(msg[:500])
        if self.mode == "default" and not self._s.capture and self._failure_tries < _FAILURE_TRIES:
            self._failure_wanted = True  # a loop that skips the batch fails again later, maybe captured
        self._s.accumulated = max(self._s.accumulated - 1, 0)  # it raised before accumulating
        del self._s.summed[self._s.pass_summed:]  # nor is its loss in the gradients

    def _frozen_moved(self, params: list[torch.Tensor | None], s: _StepState, not_trained: list[int]) -> None:
        """Which parameters no optimizer trains -- that require no grad, or that the step's
        optimizer does not step (``not_trained``) -- changed since step 0: a momentum copy's (an
        EMA teacher, MoCo's key encoder, BYOL's target, or a teacher watched in place of the
        student), not a fixed network's (a distillation teacher, a pretrained backbone, a linear
        probe's backbone).  One element of each is read, at steps 0, 10 and 20 only (an update
        through ``.data`` leaves the version counter alone, so values are compared):
        ``{what: "frozen_moved", params}`` from step 10 on, empty for none."""
        untrained = set(not_trained)
        frozen = [(i, p) for i, p in enumerate(params) if p is not None and (not p.requires_grad or i in untrained)
                  and p.numel() and p.layout == torch.strided][:_FROZEN_MAX]
        if not frozen:
            return
        with _unseen(), torch.no_grad():
            firsts = [p.detach().reshape(-1)[0].float() for _, p in frozen]
            on = firsts[0].device  # one copy to the host for all of them
            values = dict(zip([i for i, _ in frozen], torch.stack([v.to(on) for v in firsts]).tolist(), strict=True))
        if self._frozen_values is None:
            self._frozen_values = values
            return
        before = self._frozen_values
        s.events.append({"what": "frozen_moved", "params": [i for i, v in values.items() if i in before and v != before[i]]})

    def _versions(self) -> int:
        return sum(p._version for r in self._params if (p := r()) is not None)

    def _restat(self) -> None:
        """A hand-written update's first touch of a parameter (``p.data``, ``p -= ...``) after a
        clipping of the step's gradients: their statistics, read as the backward returned (the
        loop clears them before the next forward), are read again, as the update uses them,
        with the clipping's total (QA 43b: the word_language_model example's norms were 2.57x
        its clipped ``.grad``, and the step had no ``clip``)."""
        s = self._s
        s.restat = False
        params: list[torch.Tensor | None] = [r() for r in self._params]
        with _native.unrecorded():  # (full mode records the update since the clipping)
            s.stats = self._grad_stats(s, params)
            s.grad_st = grad_storages([p for p in params if p is not None])

    def _unhooked(self) -> bool:
        """No torch optimizer ends the steps: one without step hooks was given, or none was
        given, none has stepped the parameters yet and the loop does not call ``watch.step()``
        (a hand-written update: ``p -= lr * p.grad``, the tutorials' ``p.data.sub_(...)``)."""
        return self._auto_steps or (self._optimizer is None and not self._manual)

    def _updated_by_hand(self) -> bool:
        """Whether the parameters changed since the last backward without a torch optimizer:
        their version counters moved, or (``p.data`` has a version counter of its own) the
        loop took a parameter's ``.data``.  Then the next forward starts a new step."""
        if not self._unhooked():
            return False
        if self._s.in_backward:  # optimizers stepped them inside the backward
            return True
        return self._param_data_taken or self._versions() != self._param_version

    def _after_backward(self, t0: float) -> None:
        s = self._s
        if self._capturing_ops:
            self._stop_recorder()  # before the statistics below: their ops are not the user's
        if self._unhooked():
            self._param_version = self._versions()
            self._param_data_taken = False
            # no optimizer.step() to read the gradients at: read them as this backward left
            # them (the step ends at the next forward, after the loop has used and cleared them),
            # and their storages (the memory categories' gradients: QA 43b's 0 B after the
            # loop's `model.zero_grad()` before that forward)
            params: list[torch.Tensor | None] = [r() for r in self._params]
            s.stats = self._safe("grads", self._grad_stats, s, params)
            s.grad_st = grad_storages([p for p in params if p is not None])
            del params
        returned = time.perf_counter()
        s.backward_us += (returned - t0) * 1e6
        if s.pre_grads:
            self._safe("grads", self._added_onto, s)
        s.grad_mark = self._grad_mark()
        if self._gc_paused:
            self._resume_gc()
        if s.recorder is not None:
            s.recorder.phase = "forward"
        s.node_module = None
        if s.timer is not None:
            recorder = s.recorder
            s.timer.remove(returned, recorder.take_node_times() if isinstance(recorder, NativeRecorder) else ())
            if s.graph is not None:
                order, dur = s.timer.order, s.timer.dur_us  # set together, node by node
                for rec in s.graph["nodes"]:
                    o = order.get(rec["id"])
                    if o is not None:
                        rec["order"] = o
                        rec["dur_us"] = round(dur[rec["id"]], 2)
            s.timer = None
        if s.nan_origin is not None:
            s.nan_origin.remove()
            if s.graph is not None:
                for i in s.nan_origin.made:
                    s.graph["nodes"][i]["made_nonfinite"] = True
            s.nan_origin = None
        s.walk = None
        if s.before_create is not None:  # a create_graph=True backward: the gradients' graphs are new
            params = [r() for r in self._params]
            _stamp_higher_order(
                s.before_create, [p.grad for p in params if p is not None and p.grad is not None]
            )
            s.before_create = None
        _reached(s)
        for fwd in s.forwards:
            if fwd.get("backward") and "saved_bytes" not in fwd:
                fwd["saved_bytes"] = s.saved_now

    # ------------------------------------------------------------------ step boundary
    def _compile_proof_hooks(self) -> None:
        """Wrap the global optimizer step hooks in ``torch.compiler.disable`` once Dynamo is
        imported.  A compiled ``optimizer.step()`` (``torch.compile(opt.step)``, a compiled train
        step) calls them as Dynamo traces it: wrapped, they run uncompiled (one graph break,
        theirs, not several of every call of ours and a recompile each step -- and the step is
        recorded).  Wrapping imports ``torch._dynamo`` (~1 s and ~830 modules: QA 49a's
        ``watch(model)`` of a loop that updates its parameters by hand took 1.7 s), so it waits
        until something else has imported it -- creating any torch.optim optimizer does, as does
        ``torch.compile`` -- and is asked again at each root forward.  Each hook is replaced in
        place in torch's hook dict: its order among the user's global hooks stays as it was."""
        if "torch._dynamo" not in sys.modules:
            return
        self._opt_hooks_plain = False
        for handle in self._opt_hooks:
            hooks = handle.hooks_dict_ref()
            if hooks is not None and handle.id in hooks:
                hooks[handle.id] = torch.compiler.disable(hooks[handle.id])

    def _any_opt_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # a global hook of every optimizer's step() in the process: nothing of ours may raise
        # into it (QA 48a's optimizer made anew every epoch met a bug of ours in _adopt)
        if "step" in self._disabled:
            return
        grad = torch.is_grad_enabled()
        try:
            self._opt_seen(optimizer, args, kwargs)
            if self._active and (self._optimizer is None or optimizer is not self._optimizer()) and not _inner_step(optimizer):
                self._safe("ops", self._pause_for_step, optimizer)
        except Exception as exc:  # noqa: BLE001 - the step part turns off, the training goes on
            self._turn_off("step", self._step, exc)
        finally:
            # a Ctrl-C at the exit of a no_grad block of ours left grad mode off, and step()'s own
            # _use_grad would restore that (QA 48e: 4 of ~8,300 interrupts, full mode)
            _restore_grad_mode(grad)

    def _opt_seen(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Any optimizer's step() is about to run: the watched one's begins the step's end; another's
        is followed, adopted or noted."""
        if _inner_step(optimizer):
            if self._s.step_began is not None and self._optimizer is not None and optimizer is self._optimizer():
                # the subclass's own step() ran first (a clipping before super().step()): the
                # gradients are read again as its base's update will find them
                self._s.stats = self._safe("grads", self._grad_stats, self._s, [r() for r in self._params])
            return
        watched = self._optimizer() if self._optimizer is not None else None
        self._note_stepped(optimizer)
        if (
            optimizer is not watched
            and _in_a_backward()
            and self._active
            and self._safe("step", self._of_ours, optimizer)
        ):
            # a step inside the backward: not a step boundary (the backward's end is)
            self._safe("grads", self._stepped_in_backward, optimizer)
        elif optimizer is watched:
            if optimizer not in self._steps_ours:  # once: does it train parameters added since watch()?
                self._safe("step", self._of_ours, optimizer)
            self._opt_pre(optimizer, args, kwargs)
        elif self._active and self._safe("step", self._of_ours, optimizer):
            if watched is None:  # watch(model): this optimizer's steps are the steps from now on
                if self._manual:
                    return  # ... unless the loop calls watch.step() itself
                self._adopt(optimizer)
                self._followed = True
                self._opt_pre(optimizer, args, kwargs)
            else:
                self._co_opts[optimizer] = self._step
                if self._s.micro > 0:
                    # another optimizer of these parameters while the watched one has not stepped
                    # since the backward: a second optimizer of the same loop, or the watched
                    # one's replacement -- told apart at the next forward
                    self._stray_again = self._stray is not None and self._stray() is optimizer
                    self._stray = weakref.ref(optimizer)
                    # the gradients as this step() found them: a replacement's step is ended at the
                    # next forward, after the loop's zero_grad() (the watched one's step reads
                    # them again if it comes)
                    self._s.stats = self._safe("grads", self._grad_stats, self._s, [r() for r in self._params])
        elif watched is None and self._active and self._s.micro > 0:
            # watch(model), and the loop's optimizer steps none of the model's parameters
            # after a backward into them (built over another instance of the model): P5
            # (a GAN's discriminator stepping before the generator's optimizer is first seen
            # counts once: that one is adopted at its first step)
            s = self._s
            ev = next((e for e in s.events if e.get("what") == "foreign_step"), None)
            if ev is None:
                ev = {"what": "foreign_step", "optimizer": type(optimizer).__name__, "count": 0}
                s.events.append(ev)
            ev["count"] = int(ev["count"]) + 1  # type: ignore[call-overload]
            if ev["count"] == 3 and not self._told_foreign:
                self._told_foreign = True
                self._tell(f"torchscope: {type(optimizer).__name__} steps none of {self._model_name}'s parameters: "
                           "the model is not trained by it (was it built over another instance of the model?)",
                           "warning")
        elif watched is not None and self._active and self._s.micro > 0:
            # an optimizer of other parameters stepped between backward passes into the watched
            # ones: the passes before it were its loss's (a GAN's discriminator loss on fakes
            # not detached), and they stay in the watched .grad unless zero_grad() runs (P5)
            s = self._s
            if not any(e.get("what") == "other_step" and e.get("micro") == s.micro for e in s.events):
                s.events.append({"what": "other_step", "micro": s.micro, "optimizer": type(optimizer).__name__})

    def _note_stepped(self, optimizer: torch.optim.Optimizer) -> None:
        """Remember the tensors ``optimizer`` steps (_owned_elsewhere): read again only when it is
        new or its groups changed (add_param_group) -- per step one lookup and the group sizes."""
        groups = [g for g in getattr(optimizer, "param_groups", None) or () if isinstance(g, dict)]
        key = tuple(len(g.get("params", ())) for g in groups)
        if self._stepped_keys.get(optimizer) == key:
            return
        self._stepped_keys[optimizer] = key
        if len(self._stepped) > 2 * self._stepped_live + 1024:  # optimizers (and models) made anew: the dead go
            self._stepped = {i: r for i, r in self._stepped.items() if r() is not None}
            self._stepped_live = len(self._stepped)
        for g in groups:
            for p in g.get("params", ()):
                if isinstance(p, torch.Tensor):
                    self._stepped[id(p)] = weakref.ref(p)

    def _any_opt_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._paused_for is not None and self._paused_for[0] == id(optimizer):
            self._paused_for[1].paused = False
            self._paused_for = None
        if self._optimizer is not None and optimizer is self._optimizer() and not _inner_step(optimizer) \
                and "step" not in self._disabled:
            grad = torch.is_grad_enabled()
            try:
                self._opt_post(optimizer, args, kwargs)
            except Exception as exc:  # noqa: BLE001 - as in _any_opt_pre
                self._turn_off("step", self._step, exc)
            finally:
                _restore_grad_mode(grad)

    def _forward_recording(self) -> Any:
        """The op recorder while it records the watched step's forward (not paused), else None."""
        rec = self._s.recorder
        return rec if self._capturing_ops and rec is not None and rec.phase == "forward" and not rec.paused else None

    def _pause_for_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Another optimizer's step() between the watched forward and its backward (a GAN's
        discriminator, stepped before the generator's loss): its update is no op of the
        forward, and is not recorded -- its post-hook resumes the recorder."""
        rec = self._forward_recording()
        if rec is not None:  # (one whose step() raised, its post-hook never run, paused an earlier recorder)
            rec.paused = True
            self._paused_for = (id(optimizer), rec)

    def _unwatched_backward(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """A backward that reaches none of the watched parameters (a GAN's discriminator loss on
        detached fakes), run inside the watched step's forward: its kernels are no forward
        ops, and are not recorded."""
        rec = self._forward_recording()
        if rec is None:
            return call_as_user(func, args, kwargs)
        rec.paused = True
        try:
            return call_as_user(func, args, kwargs)
        finally:
            rec.paused = False

    def _stepped_in_backward(self, optimizer: torch.optim.Optimizer) -> None:
        """PyTorch's "optimizer in backward": an optimizer per parameter stepped (and its
        gradient cleared) in a post-accumulate-grad hook, to free each gradient as soon as it is
        used.  No optimizer.step() follows the backward: each backward is a step (the next
        forward begins the next, see _updated_by_hand, or, where module hooks do not run, the
        next backward: _run_backward), and the gradients are read here, as each one is
        stepped -- after the hook they are gone."""
        where = self._in_backward.get(optimizer)
        if where is None:
            index = {id(p): i for i, r in enumerate(self._params) if (p := r()) is not None}
            where = [index[id(p)] for g in optimizer.param_groups for p in g["params"] if id(p) in index]
            self._in_backward[optimizer] = where
            if len(self._in_backward) == 1:
                self._tell(
                    f"torchscope: {type(optimizer).__name__} steps inside the backward (a post-accumulate-grad "
                    "hook): its gradients are read as it steps them; without an optimizer.step() in the loop, "
                    f"each backward is a step of {self.name}",
                    "info",
                )
        params = [self._params[i]() for i in where]
        s = self._s
        s.in_backward.append((where, GradRead(params, [], self._full_stats(s), defer=not self._nan_armed)))
        # the step's learning rates, theirs when no watched optimizer has any: one per optimizer
        # and group, or one for all when they agree (QA 44a: the chart was empty)
        lrs = _lrs(optimizer) or []
        s.lr = lrs if s.lr is None else s.lr + lrs

    def _of_ours(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` steps any of the watched parameters (asked once per optimizer)."""
        ours = self._steps_ours.get(optimizer)
        if ours is None:
            groups = getattr(optimizer, "param_groups", None) or []
            stepped = [p for g in groups if isinstance(g, dict) for p in g.get("params", ())]
            new = self._of_new_params(optimizer, stepped)  # told even when old ones come with them
            ours = self._of_params(stepped) or new
            self._steps_ours[optimizer] = ours
        return ours

    def _of_new_params(self, optimizer: torch.optim.Optimizer, stepped: list[Any]) -> bool:
        """Whether ``stepped`` holds parameters the model gained after ``watch()`` (adapters such
        as LoRA added to a frozen model): that optimizer trains the model, so its steps are the
        steps; the new parameters are not in the gradient statistics (their columns follow the
        session's parameter list), which the user is told once."""
        model = self._model()
        if model is None:
            return False
        self._rebind()  # new objects under the old names are the same parameters, not gained ones
        new = {id(p): n for n, p in model.named_parameters() if id(p) not in self._param_names}
        names = [new[id(p)] for p in stepped if id(p) in new]
        if not names:
            return False
        if self._told_new >= set(names):
            return True  # said already (asked again when the optimizer's groups change)
        self._told_new.update(names)
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        msg = (
            f"torchscope: {type(optimizer).__name__} trains parameters {self._model_name} gained after "
            f"watch() ({shown}): its steps are the steps, but those parameters are not in the gradient "
            "statistics; call torchscope.watch() after adding them"
        )
        self._tell(msg, "warning")
        return True

    def _rebind(self) -> None:
        """Follow the parameters by name: ``model.to_empty()`` of a model built on the meta
        device, ``load_state_dict(..., assign=True)`` (a resume, a mmap'd checkpoint) put new
        tensor objects under the names ``watch()`` found.  Their columns of the gradient
        statistics, their memory and their names in captured graphs are those of the new
        ones from now on -- never a dead one's, whose ``id()`` a new tensor may reuse."""
        self._dead[0] = False
        model = self._model()
        if model is None:
            return
        if self._dead[1]:
            self._relist_modules(model)
        now = dict(model.named_parameters())
        for i, name in enumerate(self._names):
            new = now.get(name)
            if new is not None and self._params[i]() is not new:
                self._params[i] = weakref.ref(new, self._on_dead)
        # the dead ones' ids go too (a layer deleted)
        live = [(n, p) for n, r in zip(self._names, self._params, strict=True) if (p := r()) is not None]
        self._param_names = {id(p): n for n, p in live}
        self._set_param_ptrs(set(storages(p for _, p in live)), self._model())
        # which of them the optimizer holds: asked again (its id kept: groups it gained since are
        # still looked through for parameters the model gained, _not_stepped)
        self._held_key = (self._held_key[0], ()) if self._held_key is not None else None

    def _relist_modules(self, model: nn.Module) -> None:
        """A submodule assigned after ``watch()`` (a new task head, a block swapped): the modules
        listed again, so the new one gets its module context and output rows, and its
        parameters under the old names are followed (the optimizer may still hold the old
        ones, which then never die); the hooks of the modules gone are removed, the new ones
        hooked where the next recorded forward begins (_start_recorder)."""
        self._dead[1] = False
        named = list(model.named_modules())
        self._modules = [(path, weakref.ref(m)) for path, m in named]
        self._module_ids.clear()  # (the same set the hooks read)
        self._module_ids.update(id(m) for _, m in named)
        self._remove_module_hooks()
        self._modes_key = None  # train/eval flags read again
        self._hooked = None  # and the user hooks (P13)

    def _shares_params(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` steps a parameter the watched optimizer steps."""
        watched = self._optimizer() if self._optimizer is not None else None
        if watched is None:
            return True
        shares = self._shares.get(optimizer)
        if shares is None:
            mine = {id(p) for g in watched.param_groups for p in g["params"]}
            shares = self._shares[optimizer] = any(id(p) in mine for g in optimizer.param_groups for p in g["params"])
        return shares

    def _adopt(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = weakref.ref(optimizer)
        # the session event named no optimizer (watch(model)), or another: its class for the
        # doctor (P15 tells an SGD step k times too large from an Adam one)
        self._s.events.append({"what": "optimizer", "optimizer": type(optimizer).__name__})
        self._mem_key = None  # its state is the optimizer state from now on
        self._shares = weakref.WeakKeyDictionary()  # asked of the watched one
        msg = f"torchscope: following {type(optimizer).__name__}: each of its steps is a step of {self.name}"
        # an optimizer made anew every epoch is followed each time: said once on the console
        # (QA 48a: five lines), every time in the run's log
        self._tell(msg, "info", quiet=type(optimizer).__name__ in self._told_following)
        self._told_following.add(type(optimizer).__name__)

    def _opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._s.opt_t0 = time.perf_counter()
        self._s.opt_fb0 = self._s.forward_us + self._s.backward_us
        if self._s.before_fwd_us is None:  # the step's forwards run inside step() (a closure's): the wait ends here
            self._s.before_fwd_us = (self._s.opt_t0 - self._s.t0) * 1e6
        self._owner = threading.get_ident()
        self._last_event = time.monotonic()
        self._s.step_began = self._s.micro  # passes after it ran inside step(): its closure's (LBFGS)
        if self._s.clipping:  # recorded since the clipping (_record_clip): not our reads below
            self._end_clip()
        # the optimizer's own step pre-hooks run after this global one: one may clip the
        # gradients (QA 43a F6), so the mode stays on through step() to see it (_set_clip)
        self._keep_mode = bool(getattr(optimizer, "_optimizer_step_pre_hooks", None))
        if self._tls.pushed and not self._keep_mode:
            self._safe("mode", self._mode_off)
        if self._deferred is not None:
            # the previous step's statistics first: a non-finite one makes this read exact
            self._safe("step", self._finish_deferred)
        if self._s.micro > 0:
            # the gradients as backward left them, read while they are still in the CPU's
            # caches: after optimizer.step() has streamed parameters and state through, the
            # same reads cost several times more
            self._s.stats = self._safe("grads", self._grad_stats, self._s, [r() for r in self._params])
            if not self._nan_armed:  # the step before was finite
                self._safe("grads", self._params_at_bad_loss, self._s)
        # (light keeps to the fewest passes); a step(closure) optimizer (LBFGS) steps before
        # the step's first forward, which decides whether it is captured: decided ahead here
        s = self._s
        if self.mode != "light" and (self._full_stats(s) or (not s.started and self._captures(self._step))):
            self._safe("updates", self._before_update, s)
        # (``args``: step()'s, the optimizer itself first)
        if self.mode == "full" and kwargs.get("closure") is None and not any(callable(a) for a in args[1:]):
            self._safe("ops", self._record_update, s)

    def _record_clip(self) -> None:
        """Full mode records gradient clipping's ops (``clip_grad_norm_``, ``clip_grad_value_``)
        between a step's backward and its ``optimizer.step()``, with the update's (phase
        "optimizer"): their temporaries are the step's memory too (QA 45b: no op of theirs was
        recorded).  Recording stops as ``optimizer.step()``'s pre-hook reads the gradients, and
        starts again for the step's own ops; a hand-written update after it is recorded with it."""
        s = self._s
        rec = s.recorder
        if rec is None or s.micro == 0 or "ops" in self._disabled or self._rec_thread != threading.get_ident():
            return
        if self._backward_running or self._depth:
            return  # a clipping inside a backward hook or a forward: not the update's
        rec.phase = "optimizer"
        rec.__enter__()
        self._capturing_ops = True
        s.clipping = self._clip_open = True

    def _end_clip(self) -> None:
        """The clipping's ops are over: the recorder stops until optimizer.step()'s own."""
        self._clip_open = False
        if self._s.clipping:
            self._s.clipping = False
            self._stop_recorder()

    def _record_update(self, s: _StepState) -> None:
        """Full mode records optimizer.step()'s own ops too (phase "optimizer", after ours
        above): the state Adam makes on its first step, the temporaries of each update -- the
        step's memory does not end at the backward.  Not a ``step(closure)`` (LBFGS: its
        forward and backward run inside), nor a step in a thread other than the forward's."""
        rec = s.recorder
        if rec is None or self._capturing_ops or "ops" in self._disabled or self._rec_thread != threading.get_ident():
            return
        s.opt_from = rec.n_ops
        rec.phase = "optimizer"
        rec.__enter__()
        self._capturing_ops = True

    def _before_update(self, s: _StepState) -> None:
        """A strided sample of each parameter that requires grad, before the optimizer changes
        it: one copy of them all on the device (torch.cat), the update's size read from it after
        the step.  Not only those with a gradient now: a ``step(closure)`` optimizer (LBFGS)
        makes the gradients inside step(); one left without (listed in ``none``) has no ratio.
        And one frozen (``requires_grad_(False)``) that keeps a ``.grad``: Adam's momentum, or
        weight decay, still moves it (QA 44a: its ratio read None, as if it were not updated)."""
        opt = self._optimizer() if self._optimizer is not None else None
        params: list[torch.Tensor | None] = [r() for r in self._params]
        self._not_stepped(opt, params)  # (read again only when its groups change)
        unheld = set(self._unheld)  # what the watched optimizer does not step: no update of its (None, not 0.0)
        with _native.unrecorded():
            of = [(i, p) for i, p in enumerate(params) if i not in unheld
                  and p is not None and (p.requires_grad or p.grad is not None) and _dense(p)
                  and (p.is_floating_point() or p.is_complex())
                  and p.numel()]
            del params
            if of:
                s.upd_before = ([i for i, _ in of], _samples([_real(p) for _, p in of]))

    def _updates(self, s: _StepState) -> tuple[list[int], torch.Tensor] | None:
        """After optimizer.step(): per sampled parameter, the norm of its sample's change, of
        its sample before, and of the parameter now, as one tensor (read with the step's
        statistics; the ratio is taken on the host)."""
        before, s.upd_before = s.upd_before, None
        if before is None:
            return None
        of, old = before
        params = [self._params[i]() for i in of]
        if any(p is None for p in params):
            return None
        with _native.unrecorded():
            live = [_real(p) for p in cast("list[torch.Tensor]", params)]
            sizes = [_strided(p.numel())[1] for p in live]
            change = torch._foreach_norm(list(torch.split(_samples(live) - old, sizes)))
            size = torch._foreach_norm(list(torch.split(old, sizes)))
            # bfloat16/float16 weights' norms in float32: rounded to bfloat16 they read one value
            # for many steps (QA 39a); float64 ones keep their own
            wide = None if any(p.dtype in _WIDE for p in live) else torch.float32
            weight = torch._foreach_norm([p.detach() for p in live], 2, dtype=wide)
            return of, torch.stack([*change, *size, *weight])  # (one dtype, or promoted: one op)

    def _params_at_bad_loss(self, s: _StepState) -> None:
        """On the first step whose loss is NaN/Inf after finite ones: which parameters its forward
        read non-finite (an event ``params_nonfinite``, [] for none).  Non-finite ones were
        written by the previous optimizer.step() -- a float16 model's Adam update, a NaN learning
        rate --, finite ones leave the batch or an op of the forward.  Read here, before this
        step's optimizer.step() changes them, where the loss is on the host already (statistics
        read at once: not deferred on CUDA)."""
        read = s.stats
        if read is None or read.deferred or not s.losses:
            return
        if all(math.isfinite(v) for v in read.result()[1][: len(s.losses)]):
            return
        self._params_nonfinite(s)
        self._inputs_at_bad_loss(s)

    def _added_onto(self, s: _StepState) -> None:
        """After a backward: the stale gradients it added onto (their tensor's version moved)
        stay in ``pre_nonzero``; the others leave the list for good.  A head trained by its own
        optimizer on alternate steps keeps the gradient of its last turn, which the step's
        backward never reaches: no zero_grad() is missing there (QA 36a: an error on a clean
        multi-task loop).  Read as each backward returns, before clipping or an unscale can
        change the gradients in place; its version alone, no tensor op."""
        untouched = []
        for i, ref, version in s.pre_grads:
            p = self._params[i]()
            g = ref()
            if p is not None and g is not None and p.grad is g and g._version == version:
                untouched.append((i, ref, version))
        s.pre_grads, s.pre_checked = untouched, True

    def _params_nonfinite(self, s: _StepState) -> None:
        with _native.unrecorded(), torch.no_grad():
            params = [(i, p) for i, r in enumerate(self._params) if (p := r()) is not None]
            bad = [i for i, p in params if p.is_floating_point() and p.numel() and not bool(torch.isfinite(p).all())]
        s.events.append({"what": "params_nonfinite", "params": bad})

    def _inputs_at_bad_loss(self, s: _StepState) -> None:
        """With a first NaN/Inf loss: which of the latest forward's floating-point inputs the
        loop still holds, and which of those hold NaN/Inf (an event ``inputs_nonfinite``, their
        positions among the forward's tensor inputs): a batch that brought it in with the data,
        or finite inputs that leave an op of the forward or the loss's target."""
        with _native.unrecorded(), torch.no_grad():
            held = [t for ref in s.in_refs if (t := ref()) is not None]
            bad = [k for k, t in enumerate(held) if t.numel() and not bool(torch.isfinite(t).all())]
        if held:
            s.events.append({"what": "inputs_nonfinite", "inputs": bad, "read": len(held)})

    def _grad_stats(
        self, s: _StepState, params: list[torch.Tensor | None], grads: list[torch.Tensor | None] | None = None
    ) -> StatsRead:
        scale = getattr(self._scaler, "_scale", None) if self._scaler is not None else None
        extra = list(s.losses)
        if isinstance(scale, torch.Tensor):
            extra.append(scale)
        if s.clip is not None:
            extra.append(s.clip[0])  # after the scale: see _finish
        # read later on CUDA (no host sync), except right after a non-finite step: exact counts
        read = GradRead(params, extra, self._full_stats(s), defer=not self._nan_armed, grads=grads)
        return PiecewiseRead(read, list(s.in_backward)) if s.in_backward and grads is None else read

    def _full_stats(self, s: _StepState) -> bool:
        """Whether this step's gradient statistics are the full columns or the norms only."""
        return self.mode == "full" or s.capture or self._step % GRAD_STATS_EVERY == 0 or self._nan_armed

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        rec = self._s.recorder
        if self._capturing_ops and rec is not None and rec.phase == "optimizer":
            self._safe("ops", self._stop_recorder)  # before any op of ours
        if self._s.restat:  # clipped by a step pre-hook, updated by an op the mode does not see (fused)
            self._safe("grads", self._restat)
        self._safe("step", self._close_step, False)
        if self._counts_copies(self._step):
            self._safe("mode", self._mode_on)
            self._after_update = True
        else:
            self._s.track_copies = False
            if self._keep_mode and self._tls.pushed:
                self._safe("mode", self._mode_off)

    def _counts_copies(self, step: int) -> bool:
        """Whether the next step is watched from optimizer.step() to its forward (host<->device
        copies, P12): the first COPY_STEPS steps (a pitfall shows from the start), then every
        GRAD_STATS_EVERY steps, captured steps, full mode, and every step of a loop whose
        backward came without a forward of the root module (only the mode sees that backward)."""
        if self.mode == "full" or self._mode_always or self._probing or step < COPY_STEPS or step % GRAD_STATS_EVERY == 0:
            return True
        return self.mode == "default" and (step % self.sample_every == 0 or self._capture_next)

    def _note_inputs(self, s: _StepState, inputs: Any) -> None:
        """``backward(inputs=...)`` accumulates into those tensors only: which of the watched
        parameters this step's backwards asked for (None once one asked for all)."""
        if inputs is None:
            s.asked = None
            s.unrestricted = True
            return
        if s.unrestricted:
            return
        ts = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
        index = {id(p): i for i, r in enumerate(self._params) if (p := r()) is not None}
        s.asked = (s.asked or set()) | {index[id(t)] for t in ts if id(t) in index}

    def _outside_grads(self, s: _StepState) -> None:
        """Before the step's first backward: the tensors the watched optimizer steps that are not
        the model's (a learnable loss weight, an ArcFace head kept beside it) whose gradient is
        not zero -- ``model.zero_grad()`` leaves them to pile up (P5)."""
        outside = [p for r in self._orphans if (p := r()) is not None]
        nonzero = nonzero_grads(outside)[0] if outside else []
        if nonzero:
            s.events.append({"what": "outside_params", "count": len(outside), "pre_nonzero": len(nonzero),
                             "shapes": [list(outside[i].shape) for i in nonzero[:3]]})

    def _not_trained(self, opt: torch.optim.Optimizer | None, params: list[torch.Tensor | None], s: _StepState) -> list[int]:
        """``_not_stepped`` and the parameters every backward(inputs=...) of the step left out.
        A parameter another optimizer of the loop steps (this step or the one before) is trained."""
        out = self._not_stepped(opt, params)
        if out and self._orphans:
            # the optimizer steps tensors that are not the model's and get no gradient while some
            # of the model's get one it never uses: a layer assigned anew after it was built
            stale = sum(1 for r in self._orphans if (p := r()) is not None and p.grad is None)
            if stale:
                s.events.append({"what": "stale_params", "count": stale})
        if out and self._co_opts:
            held = self._co_held(self._step - 1)
            co = [i for i in out if id(params[i]) in held]
            if co != self._co_trained:
                # the parameters another optimizer of the loop steps (an actor-critic's critic):
                # said when they change, so the doctor knows whose step applies their gradient
                self._co_trained = co
                s.events.append({"what": "co_trained", "params": co})
            out = [i for i in out if id(params[i]) not in held]
        if s.asked is not None:
            left = [i for i, p in enumerate(params) if p is not None and p.requires_grad and i not in s.asked]
            out = sorted(set(out) | set(left))
        return out

    def _co_held(self, since: int) -> set[int]:
        """The ids of the tensors the loop's other optimizers that stepped since step ``since`` hold."""
        return {id(p) for o, at in self._co_opts.items() if at >= since for g in o.param_groups for p in g["params"]}

    def _not_stepped(self, opt: torch.optim.Optimizer | None, params: list[torch.Tensor | None]) -> list[int]:
        """Indices of parameters that require grad but that ``opt`` does not update (a linear
        probe's backbone, run under no_grad): their missing gradient is by design.  The
        optimizer's parameter set is read again only when its groups change."""
        groups = getattr(opt, "param_groups", None) if opt is not None else None
        if not groups:
            return []
        key = (id(opt), tuple(len(g["params"]) for g in groups))
        if key != self._held_key:
            held = {id(p) for g in groups for p in g["params"]}
            if opt is not None and self._held_key is not None and self._held_key[0] == key[0]:
                # its groups changed mid-run (add_param_group): parameters the model gained since?
                self._of_new_params(opt, [p for g in groups for p in g["params"]])
            self._held_key = key
            self._unheld = [i for i, p in enumerate(params) if p is not None and id(p) not in held]
            ours = {id(p) for p in params if p is not None}
            self._orphans = [weakref.ref(p) for g in groups for p in g["params"]
                             if id(p) not in ours and isinstance(p, torch.Tensor)]
        if not self._unheld:  # the optimizer holds them all (the usual loop): no list to filter
            return []
        return [i for i in self._unheld if (p := params[i]) is not None and p.requires_grad]

    def _grads_reset(self, params: list[Any]) -> bool:
        """Whether ``zero_grad()`` ran since the step's last backward: every gradient of the
        parameters the watched optimizer steps is None.  Only those: a GAN watched whole, its
        discriminator's optimizer watched, clears the discriminator's after the generator's
        backward and leaves the generator's (no gradient read: no host sync on CUDA)."""
        opt = self._optimizer() if self._optimizer is not None else None
        other: set[int] = set()
        if opt is not None and getattr(opt, "param_groups", None):
            self._not_stepped(opt, params)  # (reads its parameter set again where its groups changed)
            # every parameter it does not step, frozen ones too: a CycleGAN freezes its
            # discriminators (requires_grad False) around the generators' backward, and their
            # .grad left from their own update is theirs (QA 44d: read as no zero_grad(), P5)
            other = set(self._unheld)
        held = [p for i, p in enumerate(params) if p is not None and i not in other]
        if all(p.grad is None for p in held):
            return True
        # zero_grad(set_to_none=False) (an LBFGS closure's, Opacus's): the gradients are zeros
        # written in place, which moved one's version counter; read them only then (a sync)
        mark = self._s.grad_mark
        p = params[mark[0]] if mark is not None and mark[0] < len(params) else None
        g = p.grad if p is not None else None
        if mark is None or g is None or g._version == mark[1]:
            return False
        return nonzero_grads(held)[2]

    def _grad_mark(self) -> tuple[int, int] | None:
        """The first parameter with a gradient, and that gradient's version counter."""
        for i, r in enumerate(self._params):
            p = r()
            g = p.grad if p is not None else None
            if g is not None:
                return i, g._version
        return None

    def _state_holder(self) -> Any:
        """Whose state is the optimizer state: the watched optimizer's, and that of the
        optimizers stepping inside the backward and of the loop's other optimizers of the
        model's parameters (a SparseAdam of its embeddings beside an Adam), all together."""
        opt = self._optimizer() if self._optimizer is not None else None
        if not self._in_backward and not self._co_opts:
            return opt
        return _Together([o for o in (opt, *self._in_backward, *self._co_opts.keys()) if o is not None])

    def _live_bytes(self) -> tuple[int, set[int]]:
        """Bytes of the parameters, gradients and optimizer state now, and their storages."""
        params: list[torch.Tensor] = [p for r in self._params if (p := r()) is not None]
        p_st, o_st, g_st, live = self._union(params, self._state_holder(), False)
        return live, p_st.keys() | o_st.keys() | g_st.keys()

    def _union(
        self, live_params: list[torch.Tensor], opt: Any, periodic: bool, grads: dict[int, int] | None = None
    ) -> tuple[dict[int, int], dict[int, int], dict[int, int], int]:
        """The parameters', optimizer state's and gradients' storages (pointer -> bytes) and the
        bytes of their union; ``grads``: the gradients' as read earlier in the step."""
        p_st, o_st, static, static_live = self._static_storages(live_params, opt, periodic)
        # gradients set to None come back as new tensors each step: nothing to remember
        g_st = grad_storages(live_params) if grads is None else grads
        # a gradient sharing a parameter's or the state's storage counts once (found by a set
        # intersection in C: most steps have none to subtract)
        shared = g_st.keys() & static.keys()
        if shared:
            # ... or a gradient at the address of a state tensor that is gone: state replaced by
            # as many new tensors (``state.clear()``, ``load_state_dict``) keeps the cache's key,
            # and the allocator hands the old tensors' memory to the next gradients
            p_st, o_st, static, static_live = self._static_storages(live_params, opt, periodic, fresh=True)
            shared = g_st.keys() & static.keys()
        live = static_live + sum(g_st.values()) - (sum(g_st[ptr] for ptr in shared) if shared else 0)
        return p_st, o_st, g_st, live

    def _static_storages(
        self, live_params: list[torch.Tensor], opt: Any, periodic: bool, fresh: bool = False
    ) -> tuple[dict[int, int], dict[int, int], dict[int, int], int]:
        """Storages (pointer -> bytes) of the parameters, of the optimizer state, their union
        and its bytes.  They keep their storages from step to step: re-read when a parameter's
        data pointer (``p.data = ...``) or the count of state tensors (lazily created state, a
        new param group) changes, and with ``periodic`` every GRAD_STATS_EVERY steps (state
        replaced by ``load_state_dict``), not at every boundary; ``fresh``: now."""
        state = getattr(opt, "state", None)
        if not isinstance(state, dict):  # no optimizer, or a hand-rolled one without state
            state = {}
        # state that keeps lists of tensors (LBFGS's history grows for its first steps): their
        # lengths too, counted only for an optimizer whose state had any at the last reading
        key = (_ptr_sum(live_params), len(state), _entries(state), _listed(state) if self._state_lists else 0)
        if fresh or self._mem_key != key or (periodic and self._step % GRAD_STATS_EVERY == 0):
            p_st, o_st = self._param_storages(live_params), self._sizes(optimizer_tensors(opt))
            static = {**p_st, **o_st}  # their union and its bytes, kept with them
            listed = _listed(state)
            self._state_lists = listed > 0
            self._mem_key, self._mem_static = (*key[:3], listed), (p_st, o_st, static, sum(static.values()))
        return self._mem_static

    def _late_reached(self, s: _StepState, forwards: list[ForwardInfo]) -> list[list[int]]:
        """The previous step's forwards that a backward of this step reached, as [step, micro];
        this step's forwards no backward reached yet are watched through the next one (ones
        in ``forwards``): a GAN's generator output made before the critic's optimizer.step()
        ended the step, and used by the generator's backward after it. Told in the next step's
        event (its ``late_backward``), since this one's is written now."""
        reached = []
        for step, micro, token, mark, hooks in self._late:
            if (mark[0] if mark is not None else token is not None and _token_reached(token)):
                reached.append([step, micro])
            for h in hooks:
                h.remove()
        if not s.used and not s.marks:  # every forward reached (the usual step): no lists built
            self._late = []
            return reached
        mine = {id(f) for f in forwards}
        self._late = [(self._step, f["micro"], t, None, []) for t, f in s.used.items() if id(f) in mine]
        self._late += [(self._step, f["micro"], None, m, hooks) for m, f, hooks in s.marks if id(f) in mine]
        s.used, s.marks = {}, []
        return reached

    def _close_step(self, skipped: bool) -> None:
        # The step number moves on and the next step's state begins however the record ends:
        # a KeyboardInterrupt (Ctrl-C, a notebook's Stop) landing in it loses at most this
        # step's record.  Made first, the next state is put in place by one line that calls
        # nothing (a signal is raised only at a call or a loop's jump back), so the next
        # step never merges into the number already written.
        fresh = _StepState(0.0)
        grad = torch.is_grad_enabled()
        try:
            self._record_step(skipped)
        finally:
            self._step, self._s = self._step + 1, fresh
            fresh.t0 = time.perf_counter()
            # a Ctrl-C at the exit of a block of ours left its guards on -- and a torch.no_grad()
            # of ours, stopped at its __exit__ (a Python call), grad mode off for the user's loop
            _restore_grad_mode(grad)
            _native.settle()
            if self._gc_paused:
                self._resume_gc()

    def _record_step(self, skipped: bool) -> None:
        s = self._s
        self._seen_error = id(getattr(sys, "last_value", None))  # shown before this step's end: not how the run ends
        if s.checked is not None:
            self._skipped_loss(s)
        self._stray, self._stray_again = None, False  # the watched optimizer (or a boundary) ended the step after all
        # 3: past this method and its caller (_safe, or a hook of ours); one walk of the stack
        self._step_site = user_site(3)
        step_src = site_src(self._step_site) if self._step_site is not None else user_src(3)
        self._grad_consts.clear()
        self._grad_joins.clear()
        if self._capturing_ops:
            self._stop_recorder()
        for h in s.node_hooks:
            h.remove()
        if self.mode != "full" and self._module_hooks:
            self._remove_module_hooks()
        params: list[torch.Tensor | None] = [r() for r in self._params]
        opt = self._optimizer() if self._optimizer is not None else None
        scale = getattr(self._scaler, "_scale", None) if self._scaler is not None else None
        if s.stats is not None and s.passes_in_step():
            # backward passes ran inside step() after the gradients were read at its start:
            # Lightning's accumulation does the last micro-batch in the closure it hands to
            # optimizer.step(closure) (and clips there): read again, all of them in
            s.stats = None
        read = s.stats if s.stats is not None else self._safe("grads", self._grad_stats, s, params)
        if read is None:  # gradient statistics failed (and are off): the step keeps its losses
            read = self._grad_stats(s, [])
        not_trained = self._safe("grads", self._not_trained, opt, params, s) or []
        if self._step in _FROZEN_CHECKS:
            self._safe("grads", self._frozen_moved, params, s, not_trained)
        _reached(s)
        late = self._late_reached(s, s.forwards)
        now = time.perf_counter()
        ev: StepEvent = {
            "kind": "step",
            "step": self._step,
            "rank": self._rank.rank,
            "t": time.time(),
            "duration_us": int((now - s.t0) * 1e6),
            "forward_us": int(s.forward_us),
            "backward_us": int(s.backward_us),
            **({"before_forward_us": int(s.before_fwd_us)} if s.before_fwd_us is not None else {}),
            # (less a closure's forward and backward inside step(), LBFGS's, counted there: QA 48e)
            **({"optimizer_us": max(int((now - s.opt_t0) * 1e6 - (s.forward_us + s.backward_us - s.opt_fb0)), 0)}
               if s.opt_t0 is not None else {}),
            "micro_batches": s.micro,
            "accumulated": s.accumulated,
            "zero_grad": s.zero_grad,
            "zero_grad_set_to_none": s.set_to_none,
            "forwards": s.forwards,
            "no_backward_forwards": sum(
                1 for f in s.forwards if f.get("built_graph") and not f.get("backward")
            ),
            "backward_roots": s.roots,
            "backward_src": s.backward_src,
            "step_src": step_src,
            "backward_errors": s.backward_errors,
            "graph_captured": s.graph is not None,
        }
        if late:
            ev["late_backward"] = late
        if s.track_copies:
            ev["copies"] = {"count": s.copies, "bytes": s.copy_bytes}
        elif s.micro == 0 and not s.forwards:
            self._mode_always = True  # a backward we did not see: the mode stays on from now on
        ev["memory"] = mem = self._memory(params, self._state_holder(), s)
        ev["graphs_alive"], kept_bytes, kept = self._graphs_alive()
        self._probe(kept)
        if kept_bytes:  # saved tensors of earlier steps' graphs: held all through this step
            mem["kept"] = kept_bytes
            mem["peak"] = max(mem["peak"], mem["live"] + mem["saved"] + kept_bytes)
        if kept is not None:
            ev["graphs_kept"] = kept
        model = self._model()
        if model is not None:
            ev["training"] = model.training
            ev["modes"] = dict(self._modes_now(model)[2])
            held = self._hook_bytes()
            if self._step % GRAD_STATS_EVERY == 0:  # the modules' hooks were looked at again
                pruned = self._newly_pruned()
                if pruned:
                    s.events.append({"what": "pruned", "params": pruned})
                hooks = self._gradient_hooks()
                if hooks != self._grad_hooks:  # said when they change
                    self._grad_hooks = hooks
                    s.events.append({"what": "gradient_hooks", "params": hooks[0], "modules": hooks[1]})
            ev["hooks"] = held.bytes
            if held.shared:
                ev["hooks_shared"] = held.shared
            if held.src:
                ev["hooks_src"] = held.src
            if held.changed:
                s.events.append({"what": "hook_kept_changed", "modules": held.changed})
        lr = s.lr if s.lr is not None and not (s.in_backward and opt is not None) else _lrs(opt)
        if lr is not None:
            ev["lr"] = lr[:1] if s.in_backward and opt is None and len(set(lr)) == 1 else lr
        if self._scaler is not None:
            ev["scaler"] = {"skipped": bool(skipped)}
        # at the root forward's start; a region begun inside the forward shows on captured steps
        ev["autocast"] = s.autocast or (s.recorder is not None and s.recorder.autocast_seen)
        if s.autocast_dtype is not None:
            ev["autocast_dtype"] = s.autocast_dtype
        # (each its own part: one that fails turns itself off, not the step's record)
        acts: list[ActivationGrad] | None = None
        if s.act_grads or s.act_slots:  # none on a step that watched no activation gradient
            with _unseen():  # reads only
                acts = self._safe("activation_grads", self._activation_grads, s)
        if acts:
            ev["activation_grads"] = acts
        if s.out_stats:
            with _unseen():
                outputs = self._safe("activations", self._activations, s)
            if outputs:
                ev["activations"] = outputs
        events = list(s.events)
        if s.passes_in_step():
            events.append({"what": "closure", "passes": s.passes_in_step()})
        if s.noop_to:
            events.append({"what": "noop_to", "count": s.noop_to, "src": s.noop_src})
        for (what, src), (count, nbytes) in s.moves.items():
            events.append({"what": what, "count": count, "bytes": nbytes, "src": src})
        if s.reached is not None:
            # which trainable parameters the backward's graph does not reach (P1 tells a layer
            # the forward never uses from a gradient cleared between backward and step())
            # (and a parameter frozen since watch(): its stale zero .grad of a zero_grad(set_to_none=False)
            # loop is no dead branch, P2; QA 44a)
            events.append({"what": "unreached", "params": [i for i, n in enumerate(self._names) if n not in s.reached
                                                           and self._params[i]() is not None]})
            if s.through_fn:  # (which tells a custom Function's None from a cleared .grad: P1)
                index = {n: i for i, n in enumerate(self._names)}
                events[-1]["through"] = [[index[n], fn] for n, fn in s.through_fn.items() if n in index]
        if events:
            ev["events"] = events
        sig = "+".join(dict.fromkeys(s.sigs)) if s.sigs else ""
        ev["graph_signature"] = sig
        self._follow_structure(sig, s.graph is not None)
        self._follow_failure(s)
        graph = dict(self._graph_event(s)) if s.graph is not None else None
        clip = s.clip[1:] if s.clip is not None else None
        if s.pre_checked and s.pre_grads:  # stale gradients no backward of this step reached
            untouched = {i for i, _, _ in s.pre_grads}
            s.pre_nonzero = [i for i in s.pre_nonzero if i not in untouched]
        # a closure's passes after its first are its first evaluation's micro-batches only where
        # it reset the gradients to evaluate again (see tentative_from)
        summed = s.summed if s.closure_reset or s.tentative_from is None else s.summed[:s.tentative_from]
        upd = self._safe("updates", self._updates, s) if s.upd_before is not None else None
        pending = (ev, read, len(s.losses), summed, isinstance(scale, torch.Tensor), clip, s.pre_nonzero, not_trained, graph,
                   s.unregistered, upd)
        if self._deferred is not None:
            self._finish_deferred()  # the previous step's values, long on the host by now
        if not_trained and self._step == 0 and not self._co_opts and s.asked is None:
            # on the first step, parameters the watched optimizer does not hold that have a
            # gradient: a second optimizer stepping after it trains them (QA 42a: step 0 named
            # a head that `opt_h.step()` trains every step), asked at the next boundary.  One
            # with none stays: a GAN's generator, whose backward comes after the watched
            # critic's step, got no gradient by design
            self._co_candidates = {i for i in not_trained if (p := params[i]) is not None and p.grad is not None}
        if read.deferred or s.unregistered or self._co_candidates:
            # Parameters outside the model in the captured graph: another optimizer may step
            # them after the watched one (an encoder's, then its decoder's), so whether one
            # does is asked at the next boundary
            self._deferred = pending
        else:
            self._finish(*pending)

    def _owned_elsewhere(self, unregistered: list[tuple[NodeRecord, weakref.ref[torch.Tensor]]]) -> None:
        """A Parameter outside the model that an optimizer steps (a GAN's other model, an
        encoder's decoder, stepped after the watched optimizer: asked at the next boundary) is
        trained, not unregistered: its mark goes; so
        does one sharing its storage with the model's or those parameters (FSDP's FlatParameter,
        whose views the model's parameters are)."""
        # an optimizer seen stepping them, alive or not: one collected before this was asked (a
        # train() returning its models, its optimizers locals, the watch closed after) stepped
        # them all the same -- the live ones alone read a GAN's other model as untrained (QA 53a)
        held = [p for r in list(self._stepped.values()) if (p := r()) is not None]
        ids = {id(p) for p in held}
        shared = {ptr for p in (*held, *(r() for r in self._params)) if p is not None
                  for ptr, _ in storage_parts(p)}
        for rec, ref in unregistered:
            var = ref()
            if var is None or id(var) in ids or any(ptr in shared for ptr, _ in storage_parts(var)):
                rec.pop("unregistered", None)

    def _follow_structure(self, sig: str, captured: bool) -> None:
        """Default mode captures a graph structure it has not captured yet: the step after one
        appears is captured -- and, when that step's structure is another one (two structures
        taking turns), the next, up to _STRUCTURE_TRIES steps.  A structure captured once is not
        captured again for changing back, and after _MAX_STRUCTURES structures only the schedule
        captures: a model whose graph changes every step (variable-length sequences) would
        otherwise capture every other step, at several times a step's cost.  Those captures
        are also held to a budget, _CHANGE_CAPTURES_FIRST and then one in
        _CHANGE_CAPTURES_EVERY steps: a hundred structures (lengths times depths) cost a tenth
        of the steps, not a third."""
        if not sig or self.mode != "default":
            return
        room = len(self._structures) < _MAX_STRUCTURES
        if captured and room:
            self._structures.add(sig)
        # the first structure is new too while none is captured: a run whose step 0 had no
        # backward (an optimizer.step() before the loop) would wait sample_every steps
        first = self._last_sig is None and not self._structures
        changed = not captured and sig != self._last_sig and (self._last_sig is not None or first)
        if changed and room and sig not in self._structures and self._wanted is None:
            self._wanted, self._tries = sig, 0  # a new structure: capture until it is seen
        self._last_sig = sig
        if self._wanted is not None:
            budget = _CHANGE_CAPTURES_FIRST + self._step // _CHANGE_CAPTURES_EVERY
            if self._wanted in self._structures or self._tries >= _STRUCTURE_TRIES or self._change_captures >= budget:
                self._wanted = None
            else:
                self._tries += 1
                self._change_captures += 1
                self._capture_next = True

    def _follow_failure(self, s: _StepState) -> None:
        """At a boundary: capture the next step while a failing backward is wanted, until a
        captured step has one (a loop that skips the failing batch: every third batch's
        in-place write) or the tries are spent."""
        if not self._failure_wanted:
            return
        if s.capture and s.backward_errors:
            self._failure_wanted, self._failure_tries = False, _FAILURE_TRIES  # caught: once is enough
        elif self._failure_tries < _FAILURE_TRIES:
            self._failure_tries += 1
            self._capture_next = True
        else:
            self._failure_wanted = False

    def _put_updates(self, stats: GradStats, of: list[int], values: torch.Tensor) -> None:
        read = values.tolist()  # on CUDA a step later (_finish): long computed by then
        n, m = len(self._params), len(of)
        ratio: list[float | None] = [None] * n
        weight: list[float | None] = [None] * n
        moved: list[float | None] = [None] * n
        none = set(stats["none"])  # sampled, but the step made no gradient for it: not updated
        for k, i in enumerate(of):
            if i < n and i not in none:
                change, size = read[k], read[m + k]
                # (a parameter that was all zeros, a bias initialised so: no ratio)
                ratio[i] = change / size if size > 0 and math.isfinite(change / size) else None
                weight[i] = read[2 * m + k]
                p = self._params[i]()
                if p is not None:  # the sample's change as the whole parameter's (exact up to UPDATE_SAMPLE elements)
                    numel = p.numel() * (2 if p.is_complex() else 1)
                    moved[i] = change * math.sqrt(numel / max(1, _strided(numel)[1]))
        stats["update_ratio"], stats["weight_norm"], stats["update_norm"] = ratio, weight, moved

    def _finish_deferred(self) -> None:
        if self._deferred is not None:
            pending, self._deferred = self._deferred, None
            ev, not_trained, maybe = pending[0], pending[7], self._co_candidates
            self._co_candidates = set()
            if maybe and self._co_opts:  # (see _record_step) another optimizer stepped since
                held = self._co_held(ev["step"])
                kept = [i for i in not_trained if i not in maybe or (p := self._params[i]()) is None or id(p) not in held]
                pending = (*pending[:7], kept, *pending[8:])
            self._finish(*pending)

    def _finish(
        self,
        ev: StepEvent,
        read: StatsRead,
        n_losses: int,
        summed: list[int],
        has_scale: bool,
        clip: tuple[float, float] | None,
        pre_nonzero: list[int],
        not_trained: list[int],
        graph: dict[str, Any] | None,
        unregistered: list[tuple[NodeRecord, weakref.ref[torch.Tensor]]],
        updates: tuple[list[int], torch.Tensor] | None = None,
    ) -> None:
        """Complete a step event with its gradient statistics and losses, then emit it (and its
        graph).  On CUDA, and after a captured step with parameters outside the model, this
        runs one step boundary later: a non-finite step arms the capture of the step after
        the next."""
        if unregistered:
            self._safe("graph", self._owned_elsewhere, unregistered)
            if self.mode == "light":
                # distinct: each backward pass of the step that walked its graph named them
                out = frozenset(id(v) for rec, ref in unregistered if rec.get("unregistered") and (v := ref()) is not None)
                held = sorted({str(rec["held_as"]) for rec, _ in unregistered if rec.get("unregistered") and "held_as" in rec})
                # told when they change: without the extension a structure is walked again at
                # step 1 (its cheap key counts step 0's nodes from the thread's first) and every
                # GRAD_STATS_EVERY steps, and the doctor read each walk as another step using them
                n_out, told = len(out), self._outside_told
                self._outside_told = out
                if n_out and out != told:
                    ev.setdefault("events", []).append({"what": "unregistered_params", "count": n_out,
                                                        **({"held_as": held} if held else {})})
        stats, values = read.result()
        losses = values[:n_losses]
        stats["pre_nonzero"] = pre_nonzero
        if not_trained:
            stats["not_trained"] = not_trained
        # the losses of the backward passes since the gradients were last reset, added up
        # (with `loss / accum_steps`, their mean), as the loop logs it -- of a closure called
        # several times inside step(), the first; with none (autograd.grad passes) the last
        picked = [losses[i] for i in summed if i < len(losses)]
        ev["loss"] = (picked[0] if len(picked) == 1 else sum(picked)) if picked else losses[-1] if losses else None
        ev["losses"] = losses
        ev["grads"] = stats
        if updates is not None:
            self._safe("updates", self._put_updates, stats, *updates)
        if has_scale:  # the scaler's scale tensor was read after the losses
            ev["scaler"]["scale"] = values[n_losses]
        at = n_losses + int(has_scale)
        if clip is not None and len(values) > at:  # (a read taken before the clip has no value)
            stats["clip"] = {"norm": values[at], "max_norm": clip[0], "norm_type": clip[1]}
        nonfinite = any(not math.isfinite(x) for x in losses) or any(stats["nan"]) or any(stats["inf"])
        # a step the GradScaler skipped had non-finite scaled gradients, read by the scaler, not
        # here (the loop's zero_grad clears them before the boundary): the next step is checked
        # too, so a recurring overflow is traced to the op or backward node that makes it (P14)
        skipped = bool(ev.get("scaler", {}).get("skipped"))
        self._nan_armed = bool(nonfinite) or skipped
        # the next step captured with its ops checked, unless this one was: a NaN made at a
        # step the schedule captured (unchecked, nothing armed yet) was traced two steps later
        # (QA 50b: NaN at 100, captured 102); a NaN that lasts is checked every other step
        checked = graph is not None and self._checked_step == ev["step"]
        if self._nan_armed and not checked and self.mode != "light":
            self._capture_next = True
        if graph is not None and self._transport.sheds(graph):
            ev["graph_captured"] = False  # shed under back-pressure: counted in the end event
        self._transport.emit(dict(ev))
        if graph is not None:
            self._transport.emit(graph)

    # A captured pass makes a few small records per op; the cyclic collector would run (and
    # promote them towards costly full collections) every few hundred ops.  It is paused for
    # the length of one recorded forward or backward pass, no longer: garbage made meanwhile
    # waits until the pass ends, and a loop that never steps (inference) is not affected.
    def _pause_gc(self) -> None:
        if not self._gc_paused and gc.isenabled():
            gc.disable()
            self._gc_paused = True

    def _resume_gc(self) -> None:
        if self._gc_paused:
            self._gc_paused = False
            gc.enable()

    # A model of hundreds of modules would pay a scan of all of them at every forward and step
    # boundary (~1 us a module): the modules' train/eval flags and which modules carry user
    # forward hooks are read again when the root's mode changed and every GRAD_STATS_EVERY
    # steps, so a submodule switched to training or evaluation on its own, or a new hook, is
    # seen within that many steps.
    def _recalibrating(self, train_modules: list[str]) -> bool:
        """Whether the batch norms a no_grad forward runs in train mode all keep a cumulative
        average (``momentum=None``): their statistics recomputed on purpose, as
        ``torch.optim.swa_utils.update_bn`` does -- no evaluation (QA 48a).  Read only for a
        no_grad forward with such modules."""
        wanted = set(train_modules)
        norms = [m for p, r in self._modules if p in wanted and isinstance(m := r(), nn.modules.batchnorm._BatchNorm)]
        # (its dropout on beside them is update_bn's model.train(), not the point: QA 48e)
        return bool(norms) and all(m.momentum is None for m in norms)

    def _modes_now(self, model: nn.Module) -> tuple[list[str], list[str], dict[str, bool]]:
        """Paths of the modules in eval mode, of dropout and batch-norm modules in training
        mode, and path -> training of those not in the root's mode (shared: copy to keep)."""
        key = (model.training, self._step // GRAD_STATS_EVERY)
        if key != self._modes_key:
            self._modes_key = key
            live = [(p, m) for p, r in self._modules if (m := r()) is not None]
            modes = [(p, m.training, isinstance(m, _MODE_SENSITIVE) and not _mode_inert(m)) for p, m in live]
            # ``module.requires_grad = False`` set after watch() (the session event has those
            # set before): a plain attribute, which freezes nothing (P17)
            flags = {p: f for p, m in live if isinstance(f := vars(m).get("requires_grad"), bool)}
            if flags != self._grad_attrs:
                self._grad_attrs = flags
                self._s.events.append({"what": "requires_grad_attr", "off": sorted(p for p, f in flags.items() if not f)})
            self._mode_facts = (
                [p for p, training, _ in modes if not training],
                [p for p, training, sensitive in modes if training and sensitive],
                {p: training for p, training, _ in modes if training != model.training},
            )
        return self._mode_facts

    def _hook_bytes(self) -> Retained:
        """Bytes kept by user module hooks -- forward, forward pre-, backward and backward pre-
        hooks (a full backward hook appending grad_output) -- per module that has any (P13)."""
        if self._hooked is None or self._step % GRAD_STATS_EVERY == 0:
            self._find_hooked()
        if not self._hooked:  # the usual case, every step
            return Retained({}, [], {})
        hooked: list[tuple[str, list[Any]]] = []
        for path, ref in self._hooked:
            m = ref()
            if m is None:
                continue
            hooks = [*m._forward_hooks.values(), *m._forward_pre_hooks.values(),
                     *m._backward_hooks.values(), *m._backward_pre_hooks.values()]
            user = [h for h in hooks if not isinstance(h, ModuleHook)]
            if user:
                hooked.append((path, user))
        return retained(hooked, self._s.out_versions)

    def _find_hooked(self) -> None:
        """The modules with user hooks (P13), looked for every GRAD_STATS_EVERY steps and at the
        first step's start; after those with forward hooks, _out_version notes their outputs."""
        self._hooked = [(p, r) for p, r in self._modules if (m := r()) is not None and (
            m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)]
        for _, ref in self._hooked:
            m = ref()
            if m is not None and id(m) not in self._versioned and any(
                    not isinstance(h, ModuleHook) for h in m._forward_hooks.values()):
                self._versioned.add(id(m))
                self._handles.append(hook_forward(m, self._safe, "hook_versions", self._out_version))

    def _out_version(self, m: nn.Module, args: Any, out: Any) -> None:
        """After the forward of a module with a user forward hook: its output's version counter
        now, which a hook keeping the output sees (P13: an in-place op after it changes what
        the hook kept)."""
        if _compiling() or _tracing():
            return
        t = _first_tensor(out)
        if t is not None and _dense(t) and not t.is_inference():
            version = t._version
            for ptr, _ in storage_parts(t):
                self._s.out_versions[ptr] = version

    def _newly_pruned(self) -> list[int]:
        """Parameters ``torch.nn.utils.prune`` began masking since the last look (its forward
        pre-hook renames ``weight`` to ``weight_orig`` and multiplies it by a mask): their
        gradient is zero wherever the mask is, by design (P2).  Pruned after ``watch()``, they
        keep the session's name."""
        if not self._hooked:  # the usual case: no module has a hook
            return []
        index = {id(p): i for i, r in enumerate(self._params) if (p := r()) is not None}
        found = []
        for _, ref in self._hooked or ():
            m = ref()
            for h in m._forward_pre_hooks.values() if m is not None else ():
                name = getattr(h, "_tensor_name", None) if isinstance(h, prune.BasePruningMethod) else None
                i = index.get(id(getattr(m, f"{name}_orig", None))) if name else None
                if i is not None and i not in self._pruned:
                    self._pruned.add(i)
                    found.append(i)
        return found

    def _held_as(self, leaf: torch.Tensor) -> str | None:
        """The model's module attribute ("path.attr") holding ``leaf``, a leaf of a walked graph
        that requires grad and is no parameter (``self.cls = torch.zeros(1, 1, d,
        requires_grad=True)``, not an ``nn.Parameter``): ``parameters()`` misses it, so the
        optimizer never steps it (P1).  None for one no module holds (an input the loop made to
        read its gradient).  Looked up only when a walk meets such a leaf: they are rare."""
        if isinstance(leaf, nn.Parameter) or not leaf.requires_grad:
            return None
        for path, ref in self._modules:
            m = ref()
            for attr, v in vars(m).items() if m is not None else ():
                if v is leaf:
                    return f"{path}.{attr}" if path else attr
        return None

    def _gradient_hooks(self) -> tuple[list[int], list[str]]:
        """The parameters with a tensor hook of the user's (``p.register_hook``) and the modules
        with a backward hook (``register_full_backward_hook`` / ``_pre_hook``): what can change
        or zero a gradient on its way (P2 names them)."""
        params = [i for i, r in enumerate(self._params) if (p := r()) is not None and p._backward_hooks]
        modules = [path for path, ref in self._hooked or () if (m := ref()) is not None and any(
            not isinstance(h, ModuleHook) for h in (*m._backward_hooks.values(), *m._backward_pre_hooks.values()))]
        return params, modules

    def _activation_grads(self, s: _StepState) -> list[ActivationGrad]:
        _take_native_rows(s)
        _reached_first(s)
        return [_activation_row(path, rows) for path, rows in _module_rows(s.act_grads, s.act_numel).items()]

    def _activations(self, s: _StepState) -> list[ActivationStats]:
        return [_output_row(path, rows) for path, rows in _module_rows(s.out_stats, s.out_numel).items()]

    def _graph_event(self, s: _StepState) -> GraphEvent:
        g = s.graph
        assert g is not None
        rec = s.recorder
        if rec is not None:
            rec.finish()
            # the recorder's records hold tuples where the schema has lists: JSON arrays alike
            ops, tensors = rec.payload()  # lists of records, or the native recorder's JSON of them
            g["ops"] = cast("list[OpRecord]", ops)
            g["tensors"] = cast("list[TensorMeta]", tensors)
            g["memory_timeline"] = cast("list[list[int]]", rec.timeline)
            g["shed_ops"] = rec.shed
            if rec.shed and not self._told_cap:
                self._told_cap = True
                self._tell(
                    f"torchscope: step {self._step} ran {rec.shed + self.max_ops:,} ops; its graph holds the "
                    f"first {self.max_ops:,} (a step's graph records at most max_ops={self.max_ops:,} ops: the "
                    "rest are counted, not recorded, on every such step)", "warning",
                    fields={"ops_cut": rec.shed + self.max_ops})
            g["complete"] = rec.shed == 0 and rec.failed is None
            g["recorder"] = "native" if isinstance(rec, NativeRecorder) else "python"
        else:
            g["ops"], g["tensors"], g["complete"] = [], [], False
        return g

    def _memory(self, params: list[torch.Tensor | None], opt: Any, s: _StepState) -> MemoryStats:
        live_params = [p for p in params if p is not None]
        p_st, o_st, g_st, live = self._union(live_params, opt, True, s.grad_st)
        saved = s.saved_peak
        mem: MemoryStats = {
            "params": sum(p_st.values()),
            "grads": sum(g_st.values()),
            "optimizer": sum(o_st.values()),
            "saved": saved,
            "live": live,
            "peak": live + saved,  # an estimate, replaced by the ledger's peak on captured steps
        }
        rec = s.recorder
        if rec is not None and rec.n_ops:
            # the op ledger saw every allocation of the recorded phases: its highest point is
            # the measured peak, and what it holds beyond state and saved activations at that
            # point are the step's temporaries (outputs not saved for backward, workspaces)
            top = rec.peak_live(0, s.opt_from)
            # the ledger's highest point where it saw the whole step (full mode, optimizer.step()
            # recorded), else the higher of it and the estimate (QA 43a: the estimate adds Adam's
            # first-step state to activations the backward had freed before it was made: +57%)
            mem["peak"] = top if s.opt_from is not None else max(mem["peak"], top)
            mem["temporaries"] = max(top - (rec.baseline - s.untracked) - saved + s.in_saved, 0)
            top_update = rec.peak_live(s.opt_from) if s.opt_from is not None else 0
            if top_update > top:
                # the step's peak inside optimizer.step() (full mode; Adam's first step makes its
                # state): the backward freed the saved activations by then, and the gradients
                # and the state, new ones too, are what the step ends with
                mem["peak"] = max(mem["peak"], top_update)
                mem["temporaries"] = max(top_update - live - sum(n for ref, _, n in s.in_held if ref() is not None), 0)
            # what the step ends with was held in it: a ledger that missed an allocation made
            # outside any op (gradients set by hand as views of one flat buffer) is not below it
            mem["peak"] = max(mem["peak"], live)
        # an uncaptured step's peak is an estimate without temporaries, and a captured step of the
        # same structure measured them: its excess over the state counts for the steps after it
        # (QA 42b: the peak chart jumped at every sample_every-th step, as a spike that is not)
        # (light captures nothing: no key is made there, every step)
        made = max(mem["optimizer"] - self._o_prev, 0) if self._o_prev is not None else 0
        self._o_prev = mem["optimizer"]
        if rec is not None and rec.n_ops:
            if len(self._excess) >= _SAVED_SHAPES:
                self._excess.clear()
            # less the optimizer state this step made in optimizer.step(), after the ledger's peak
            # (default mode's ledger ends with the backward): the next steps hold it throughout
            # (QA 48b: steps 1-49 repeated step 0's peak, and step 50 jumped by Adam's state)
            top_then = rec.peak_live(0, s.opt_from) + made if s.opt_from is None else 0
            self._excess[(tuple(s.sigs), s.in_shapes)] = max(mem["peak"], top_then) - live
        elif self._excess and (excess := self._excess.get((tuple(s.sigs), s.in_shapes))) is not None:
            mem["peak"] = max(mem["peak"], live + excess)
        first = live_params[0] if live_params else None
        if first is not None and first.is_cuda:  # is_cuda: no torch.device made on the CPU
            dev = _cuda.device_memory(first.device)
            if dev is not None:
                mem["device"] = dev
                # allocator bytes no storage the capture can name accounts for (other
                # models, caches, tensors the user keeps): "other"
                mem["other"] = max(dev.get("allocated", 0) - live, 0)
        return mem

    def _set_param_ptrs(self, ptrs: set[int], model: nn.Module | None) -> None:
        """The parameters' storages and, with them, the buffers' (BatchNorm's running
        statistics, which batch_norm saves for backward): what a backward saves of these is the
        model's own state, not activations (``saved``)."""
        self._param_ptrs = ptrs
        buffers = set(storages(list(model.buffers()))) if model is not None else set()
        self._not_activations = ptrs | buffers

    def _param_storages(self, live_params: list[torch.Tensor]) -> dict[int, int]:
        """The parameters' storages (data pointer -> bytes).  When they are not the ones known
        (``model.to(device)`` or ``.half()`` after ``watch()``, ``p.data = ...``), what a
        backward saves is told from parameters by the new ones from now on."""
        p_st = self._sizes(live_params)
        if p_st.keys() != self._param_ptrs:
            self._set_param_ptrs(set(p_st), self._model())
            self._saved_cache.clear()
        return p_st

    def _probe(self, kept: GraphsKept | None) -> None:
        """At a boundary: probe for what holds a kept loss while one is alive, until a holder is
        seen, for at most _PROBE_STEPS steps in all (a Python list's append is no torch call)."""
        if kept and "held_at" in kept:
            self._probe_left = 0  # found: the doctor reads it from this event
        self._probing = bool(kept and kept["of"] == "loss" and self._probe_left > 0)
        self._probe_left -= self._probing
        if kept and kept["of"] == "loss" and "held_at" not in kept and not self._probing:
            if self._held_in is None:
                self._safe("kept", self._find_holder)
            if self._held_in:
                kept["held_in"] = self._held_in
        if kept and kept["of"] == "output":
            self._probe_outputs(kept)

    def _probe_outputs(self, kept: GraphsKept) -> None:
        """Outputs of two or more earlier steps kept alive: the list holding them, one that grew
        since the boundary before (``all_probs.append(torch.sigmoid(out))`` for an epoch's
        accuracy), for P7 to name."""
        if self._outputs_held_in is None and self._outputs_probes > 0:
            steps = {sent.step for ref in self._sentinels if (sent := ref()) is not None and sent.output}
            if len(steps - {self._step}) >= 2:
                self._outputs_probes -= 1
                found = self._safe("kept", graph_lists, self._graph_lists)
                if found is not None:
                    self._graph_lists, held = found
                    self._outputs_held_in = held or None
        if self._outputs_held_in:
            kept["held_in"] = self._outputs_held_in

    def _find_holder(self) -> None:
        """Once, when the probe saw no torch call keep them and losses of two or more earlier
        steps are alive: the user's named container (or variable) holding the oldest of those
        whose tensor is alive (``history.append(loss)``), found through the garbage collector's
        referrers.  Not the latest step's, which the loop's own variable still names until the
        next iteration rebinds it (QA 46a: "held by 'cur' (a variable)" for an EMA of losses
        whose earlier tensors are gone, their graphs held by the average's); with no older one
        alive, nothing is named."""
        losses = [sent for ref in self._sentinels if (sent := ref()) is not None and not sent.output
                  and sent.step < self._step and sent.loss is not None]
        if len({sent.step for sent in losses}) < 2:
            return  # one step's loss (``loss = train_step()`` keeps the last): not yet
        latest = max(sent.step for sent in losses)
        alive = sorted(((sent.step, t) for sent in losses if sent.step < latest
                        and (t := cast("weakref.ref[torch.Tensor]", sent.loss)()) is not None), key=lambda a: a[0])
        self._held_in = container_of(alive[0][1]) if alive else ""

    def _on_holder(self, args: tuple[Any, ...]) -> None:
        """While probing: a call of the user's outside the forward made a tensor with a graph.
        Each one-value tensor with a graph among its arguments (a loss) is held from this line
        on: its sentinel's ``held_at`` when a backward came first, else a candidate the next
        backward's roots are matched with."""
        if self._depth:
            return
        s = self._s
        for a in args:
            if not isinstance(a, torch.Tensor) or a.grad_fn is None or a.numel() != 1:
                continue
            sent = getattr(a.grad_fn, "metadata", {}).get("torchscope_sentinel")
            if isinstance(sent, _Sentinel):
                sent.held_at = sent.held_at or user_src(1)
            elif len(s.holders) < 16:
                s.holders.append((weakref.ref(a), user_src(1)))

    def _earlier_alive(self) -> bool:
        """Whether a graph of an earlier step that a backward can still go through is alive (a
        few weak references, looked at only when the last boundary saw such a graph alive: a
        clean loop's are freed by their backward, ``loss = train_step()``'s kept loss too)."""
        if not self._nest_check:
            return False
        step = self._step
        return any(sent is not None and sent.usable and sent.step < step for sent in (ref() for ref in self._sentinels))

    def _graphs_alive(self) -> tuple[int, int, GraphsKept | None]:
        """Autograd nodes of earlier steps' graphs still reachable and the bytes they hold
        saved for backward: per step, its backward roots' graphs, or (none alive) its forward
        outputs' -- a root's graph holds the output's, which is not counted twice -- and what
        the latest step's kept graph hangs from: the loss a backward was called on (``total +=
        loss``), a forward's output (``preds.append(out)``) or a state fed into a later forward
        (an RNN's hidden state not detached), with that call's line (P7's place)."""
        roots: dict[int, tuple[int, int]] = {}
        outputs: dict[int, tuple[int, int]] = {}
        kept: GraphsKept | None = None
        keep: list[weakref.ref[_Sentinel]] = []
        usable = False
        for ref in self._sentinels:
            sent = ref()
            if sent is None:
                continue
            keep.append(ref)
            usable = usable or sent.usable
            if sent.step >= self._step:
                continue
            if sent.output:  # outputs share one graph: the largest
                outputs[sent.step] = max(outputs.get(sent.step, (0, 0)), (sent.nodes, sent.saved))
            else:
                had = roots.get(sent.step, (0, 0))
                roots[sent.step] = (had[0] + sent.nodes, had[1] + sent.saved)
            if kept is None or sent.step > kept["step"] or (sent.step == kept["step"] and not sent.output):
                of: Literal["loss", "output", "state"] = "loss" if not sent.output else "state" if sent.fed else "output"
                kept = {"step": sent.step, "of": of, "src": sent.src}
                if sent.held_at:
                    kept["held_at"] = sent.held_at
        self._sentinels = keep
        self._nest_check = usable
        held = [*roots.values(), *(v for step, v in outputs.items() if step not in roots)]
        return sum(n for n, _ in held), sum(b for _, b in held), kept


def _restore_grad_mode(grad: bool) -> None:
    """Grad mode as it was before a hook of ours ran (a Ctrl-C stopping a no_grad block of ours
    at its exit leaves it off).  Set only where it changed, and out of the loop's function modes'
    sight either way: ``torch._C._set_grad_enabled`` is a torch function, and a mode of the user's
    counted two calls of ours a step (QA 53a)."""
    if torch.is_grad_enabled() is not grad:
        with torch._C.DisableTorchFunction():
            torch._C._set_grad_enabled(grad)


_compiling = torch.compiler.is_compiling
# torch.jit.is_tracing() without its is_scripting() check, a second Python call at every root
# forward's two hooks: these hooks never run as TorchScript (ModuleHook cannot be scripted)
_tracing = torch._C._is_tracing
_functorch_level = getattr(torch._C._functorch, "maybe_current_level", lambda: None)


def _transformed() -> bool:
    """Inside a torch.func transform (vmap, grad, jvp...)."""
    return _functorch_level() is not None


_data_ptr = torch.Tensor.data_ptr


def _ptr_sum(tensors: list[torch.Tensor]) -> int:
    """Sum of the tensors' data pointers: changes when one gets new data (``p.data = ...``)."""
    native: int | None = _native.ask("ptr_sum", tensors)
    if native is not None:  # every tensor owns its storage
        return native
    try:
        return sum(map(_data_ptr, tensors))
    except RuntimeError:  # a wrapper subclass (DTensor) has no data pointer: its shards' then
        return sum(ptr for t in tensors for ptr, _ in storage_parts(t))


def _entries(state: dict[Any, Any]) -> int:
    """Entries of an optimizer's per-parameter state dicts, counted in C (``map``): a
    generator over 300 parameters' states costs ~0.2 ms a step."""
    try:
        return sum(map(len, state.values()))
    except TypeError:  # a hand-rolled optimizer's state holding other values than dicts
        return sum(len(v) for v in state.values() if isinstance(v, dict))


def _listed(state: dict[Any, Any]) -> int:
    """Items of the lists and tuples in an optimizer's per-parameter state dicts."""
    return sum(len(v) for st in state.values() if isinstance(st, dict) for v in st.values() if isinstance(v, (list, tuple)))


def _first_storage(t: torch.Tensor) -> int:
    """The data pointer of ``t``'s (first) storage; 0 when it has none that can be read."""
    parts = storage_parts(t)
    return parts[0][0] if parts else 0
# the active watch of each model (weak keys: a watch never keeps its model alive)
_watching: weakref.WeakKeyDictionary[nn.Module, Watch] = weakref.WeakKeyDictionary()
_every: weakref.WeakSet[Watch] = weakref.WeakSet()  # every watch not closed (atexit holds them), its model gone or not


def _multiprocessing_exit(close: Callable[[], None]) -> Any:
    """In a worker process multiprocessing started (``mp.Process``, a ``Pool``: mnist_hogwild's
    workers), ``close`` as the worker ends: a forked worker leaves by ``os._exit``, which runs no
    ``atexit`` -- only multiprocessing's own finalizers -- so its run read "ended unexpectedly"
    and lost its last steps.  The finalizer (None elsewhere) is cancelled by ``close()``."""
    mp = sys.modules.get("multiprocessing")
    if mp is None or mp.parent_process() is None:
        return None
    from multiprocessing import util

    return util.Finalize(None, close, exitpriority=10)


def _forked() -> None:
    """In a child forked from a watching process: the parent's watches are the parent's (their
    writer thread and file are not here), so they capture nothing in the child."""
    for w in list(_every):
        w._active = False


os.register_at_fork(after_in_child=_forked)


def _writing(path: str | os.PathLike[str]) -> list[Watch]:
    """This process's running watches that write ``path``."""
    want = os.path.abspath(path)
    return [w for w in list(_every) if w._active and w.path is not None and os.path.abspath(w.path) == want]


def flush_writers(path: str | os.PathLike[str]) -> None:
    """``Watch.flush()`` of this process's running watches that write ``path``."""
    for w in _writing(path):
        w.flush()
_paused_before: dict[int, bool] = {}  # id(recorder) -> its pause before a compile (_pause_for_compile)


def _pause_for_compile(on: bool) -> None:
    """torch.compile compiles on this thread (``_compile``): its ops are not the model's.  The
    native recorder pauses per thread; a Python recorder recording here pauses and then
    resumes as it was (a forward's recorder left on another thread's stack stays paused)."""
    _native.pause_thread(on)
    me = threading.get_ident()
    for w in list(_every):
        rec = w._s.recorder
        if not isinstance(rec, OpRecorder) or not w._capturing_ops or w._rec_thread != me:
            continue
        if on:
            _paused_before[id(rec)] = rec.paused
            rec.paused = True
        else:
            rec.paused = _paused_before.pop(id(rec), False)


# the function torch wraps every optimizer class's step() in (Optimizer.__init__ patches each
# class once), which runs the step hooks: one code object for all of them
_STEP_WRAPPER = torch.optim.Optimizer.profile_hook_step(lambda self: None).__code__
_subclassed_steps: dict[type, bool] = {}  # (a plain dict: asked twice a step, a weak one costs more)


def _calls_on_stack(code: types.CodeType, owner: Any) -> int:
    """How many frames of ``code`` whose ``self`` is ``owner`` are on this thread's stack: a
    module's ``_call_impl``, an optimizer's wrapped ``step()`` (asked only off the hot path)."""
    calls = 0
    frame: Any = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code and frame.f_locals.get("self") is owner:
            calls += 1
        frame = frame.f_back
    return calls


def _inner_step(optimizer: torch.optim.Optimizer) -> bool:
    """Whether this step call is inside another of the same optimizer: a subclass whose
    ``step()`` calls ``super().step()`` (clipping first, a SAM-style second pass) runs two
    wrapped steps, its class's and its base's, and torch runs the step hooks in each -- one
    optimizer step, not two.  The stack is looked at only for such a subclass."""
    cls = type(optimizer)
    own = _subclassed_steps.get(cls)
    if own is None:
        # a step of its own over a base's own (not Optimizer's abstract one)
        bases = [c for c in cls.__mro__[1:] if issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer]
        own = _subclassed_steps[cls] = "step" in cls.__dict__ and any("step" in c.__dict__ for c in bases)
    return own and _calls_on_stack(_STEP_WRAPPER, optimizer) > 1


def _hookable(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer whose step hooks mark step boundaries: ``optimizer`` itself, or the
    one a wrapper holds (accelerate's ``.optimizer``, Lightning's ``._optimizer``, Opacus's
    ``.original_optimizer``, whose step sees the clipped and noised gradients the update
    applies); None for a hand-rolled optimizer.  A subclass that never ran
    ``Optimizer.__init__`` has no hooks."""
    inner = ("optimizer", "_optimizer", "original_optimizer")
    for o in (optimizer, *(getattr(optimizer, name, None) for name in inner)):
        if isinstance(o, torch.optim.Optimizer) and hasattr(o, "_optimizer_step_pre_hooks"):
            return o
    return None


def _class_name(model: nn.Module) -> str:
    """The model's class: a TorchScript module's original one, not ``RecursiveScriptModule``."""
    if isinstance(model, torch.jit.ScriptModule):
        return str(getattr(model, "original_name", "") or type(model).__name__)
    return type(model).__name__


def _ending(exc: BaseException) -> tuple[str, str]:
    """(end status, message) for a run that stopped on ``exc``: "interrupted" by the user's
    Ctrl-C, "finished" by a clean ``sys.exit()``, else an error."""
    first = (str(exc).strip().splitlines() or [""])[0]
    first = first if len(first) <= 300 else first[:299] + "…"  # cut, and said to be
    message = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", f"stopped by Ctrl-C ({message})"
    if isinstance(exc, SystemExit) and exc.code in (None, 0):
        return "finished", f"exited early ({message})"
    return "error", message


def _note_ending(ending: tuple[str, str], thread: int | None) -> None:
    """Mark the active watches (those trained by ``thread``, if given) as ended so."""
    with contextlib.suppress(Exception):
        for w in list(_every):
            if w._active and w._ended_by is None and (thread is None or thread == w._owner):
                w._ended_by = ending


def _end_on_sigterm(dying: bool) -> None:
    """SIGTERM (``_sigterm``): the runs ended "interrupted"; ``dying``: end them now."""
    _note_ending(("interrupted", "stopped by SIGTERM (kill, a scheduler's preemption, docker stop)"), None)
    if dying:
        for w in list(_every):
            w._end_now()


def _install_excepthook() -> None:
    """An uncaught exception ends a script's run before atexit closes its watches: note it on
    them first, so the session says "error" and why, then let the previous hook print it."""
    prev = sys.excepthook
    if not getattr(prev, "_torchscope", False):

        def hook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
            _note_ending(_ending(value), None)
            prev(tp, value, tb)

        hook._torchscope = True  # type: ignore[attr-defined]
        sys.excepthook = hook
    # asked apart: IPython puts its own sys.excepthook back around every cell, so a notebook's
    # watch() finds ours gone each time, while threading's stays -- wrapped once, not per cell
    prev_thread = threading.excepthook
    if getattr(prev_thread, "_torchscope", False):
        return

    def thread_hook(args: Any) -> None:
        # a loop run in a thread of its own: only the watches that thread trained end with it
        if args.thread is not None and args.exc_value is not None:
            _note_ending(_ending(args.exc_value), args.thread.ident)
        prev_thread(args)

    thread_hook._torchscope = True  # type: ignore[attr-defined]
    threading.excepthook = thread_hook


def _input_tensors(args: Any, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors a forward was called with, where ``_input_shapes`` looks for them."""
    out: list[torch.Tensor] = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple, Mapping)):  # (a Mapping: Hugging Face's BatchEncoding, a UserDict)
            out.extend(v for v in (a.values() if isinstance(a, Mapping) else a) if isinstance(v, torch.Tensor))
    return out


def _input_shapes(
    args: Any, kwargs: dict[str, Any], refs: list[weakref.ref[torch.Tensor]]
) -> tuple[tuple[int, ...], ...]:
    """Shapes of the tensors a forward was called with -- positional, keyword (``model(**batch)``)
    and one level inside a list, tuple or dict argument (``model(batch)``): the key under which
    a graph's saved bytes are reused, so every input whose size changes them must be in it.
    Weak references to the floating-point ones go to ``refs``."""
    tensors = _input_tensors(args, kwargs)
    refs.extend(weakref.ref(t) for t in tensors if t.is_floating_point())
    return tuple(tuple(t.shape) for t in tensors)


def _walk_of(outputs: Any) -> AutogradWalk:
    roots = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs or [])
    return AutogradWalk([t.grad_fn for t in roots if isinstance(t, torch.Tensor)])


def _stamp_higher_order(before: AutogradWalk, tensors: Any) -> None:
    """Mark the nodes reachable from ``tensors`` that were not in ``before`` (a walk held alive
    across the create_graph pass, so its node ids are still those objects')."""
    _walk_of(list(tensors or ())).stamp_new({id(n) for n in before.nodes})


def _bump(table: dict[tuple[str, str], list[int]], key: tuple[str, str], nbytes: int) -> None:
    entry = table.setdefault(key, [0, 0])
    entry[0] += 1
    entry[1] += nbytes


def _root_weights(kind: str, args: Any, kwargs: dict[str, Any], n: int) -> list[torch.Tensor | None] | None:
    """The gradients a backward was given for its roots, one-element tensors or None each
    (``Tensor.backward(gradient)``, ``autograd.backward(tensors, grad_tensors)``); None when none."""
    if kind == "tensor":
        given = args[1] if len(args) > 1 else kwargs.get("gradient")
    elif kind == "autograd":
        given = args[1] if len(args) > 1 else kwargs.get("grad_tensors", kwargs.get("grad_variables"))
    else:
        return None
    if given is None:
        return None
    listed = [given] if isinstance(given, torch.Tensor) else list(given)
    if len(listed) != n:
        return None
    return [g if isinstance(g, torch.Tensor) and g.numel() == 1 else None for g in listed]


def _torch_module(m: nn.Module) -> bool:
    """Whether ``m``'s forward is torch's own code (nn.Linear...), not the user's: read without
    running descriptors (a ScriptModule's raises), through decorators (``@torch.autocast(...)``
    on the user's forward wraps it in torch's code)."""
    try:
        fn = inspect.unwrap(inspect.getattr_static(type(m), "forward", None))
    except ValueError:  # a cycle of __wrapped__
        return False
    code = getattr(fn, "__code__", None)
    return code is not None and _is_internal(code.co_filename)


def _in_a_backward() -> bool:
    """Whether this thread runs inside an autograd backward pass (a checkpoint's recompute)."""
    return torch._C._current_graph_task_id() != -1


def _compiled_any() -> bool:
    """Whether torch.compile has compiled anything in this process (without importing dynamo)."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    try:
        return bool(dynamo_utils is not None and dynamo_utils.counters["stats"]["unique_graphs"])
    except (AttributeError, KeyError, TypeError):
        return False


def _raise(message: str) -> None:
    raise RuntimeError(message)


# ``torchscope.watch(model, optimizer, ...)`` is the class itself: one signature, one docstring.
watch = Watch
