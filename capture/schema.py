"""The one event schema of torchscope.

Every record that flows capture -> session file / wire -> server -> browser is one of the
events below: a JSON object whose ``kind`` names its type.  The capture writer builds them,
the session-file reader and the server validate them against these definitions (the server
through ``pydantic.TypeAdapter`` over these very TypedDicts), the doctor reads them and the
tests check them.  ``frontend/schema.js`` mirrors the field names; ``tests`` keep the two in
step.  Standard library only: this module is imported inside the training process.

Conventions
- Columnar where a record repeats per parameter: ``StepEvent.grads`` holds arrays aligned
  with ``SessionEvent.params`` (index i is parameter i), so a step of a 1,000-parameter
  model stays a few kB.
- Ids inside a ``GraphEvent`` (op ids, tensor ids, node ids) are small integers local to
  that event.
- Times are seconds since the epoch (``t``) or durations in microseconds (``*_us``).
- Bytes are plain ints.  Optional fields may be absent; readers must not assume them.
"""

from __future__ import annotations

from typing import Literal, TypedDict

# Major changes break readers (they refuse a newer major with a clear message); minor
# changes only add optional fields.
SCHEMA_VERSION: tuple[int, int] = (1, 15)  # 1.2: StepEvent.accumulated; 1.3: GradStats.not_trained; 1.4: NodeRecord.made_nonfinite, GradStats.clip, ForwardInfo.loss; 1.5: NodeRecord.unregistered; 1.6: MemoryStats.kept, GraphsKept.of "state" and .held_at, StepEvent.hooks_shared and .hooks_src; 1.7: StepEvent.activations, GradStats.update_ratio and .weight_norm; 1.8: ModuleInfo.extra_repr and .requires_grad_attr, StepEvent.autocast_dtype, LogEvent.metrics and .capture_off; 1.9: NodeRecord.attrs, OpRecord.freed; 1.10: ForwardInfo.input_grad; 1.11: ForwardInfo.checkpoint, LogEvent.ops_cut; 1.12: NodeRecord.checkpointed, EndEvent.late_backward, ForwardInfo.bn_recalibration, StepEvent.before_forward_us and .optimizer_us; 1.13: LogEvent.labels; 1.14: LogEvent.source; 1.15: GradStats.update_norm
# how a LogEvent of level "error" begins when a part of the capture turned itself off after an
# internal error (what follows: the part, the step, the error; since 1.8 also its capture_off
# field): the doctor and `torchscope info` tell the session is incomplete by it (capture_off()),
# apart from the loop's own errors
CAPTURE_OFF = "torchscope: capture of "

# Bounds that keep a hostile or runaway file/payload from exhausting memory.
MAX_FRAME_BYTES = 64 * 1024 * 1024  # compressed payload of one frame
MAX_FRAME_EVENTS = 1_000_000
MAX_EVENT_BYTES = 256 * 1024 * 1024  # decompressed payload of one frame

EventKind = Literal["session", "step", "graph", "log", "end"]


# ----------------------------------------------------------------------------- session
class ModuleInfo(TypedDict, total=False):
    path: str  # dotted path as in model.named_modules(); "" is the root module
    type: str  # class name, e.g. "Linear"
    n_params: int  # parameters directly owned (not recursive)
    training: bool
    # a dropout with p=0 or a batch norm without running statistics: True, where set; an RNN
    # (RNN/LSTM/GRU) or MultiheadAttention: always set (forty-second session), False when its own
    # dropout acts in train mode (dropout > 0, and for an RNN more than one layer)
    mode_inert: bool
    extra_repr: str  # what the module's extra_repr() says (``in_features=8, out_features=4, bias=True``), where not empty; at most 240 characters
    # `module.requires_grad = <bool>` set as a plain attribute (not `requires_grad_()`): it
    # freezes nothing, its parameters' flags are their own (P17); absent where not set
    requires_grad_attr: bool


class ParamInfo(TypedDict, total=False):
    name: str  # qualified name as in model.named_parameters(), e.g. "encoder.0.weight"
    module: str  # dotted path of the owning module
    shape: list[int]
    dtype: str  # "float32"
    device: str  # "cpu", "cuda:0"
    requires_grad: bool
    numel: int
    nbytes: int


class SessionEvent(TypedDict, total=False):
    kind: Literal["session"]
    schema: list[int]  # SCHEMA_VERSION
    session_id: str  # shared by all ranks of one distributed run
    name: str
    started_at: float
    pid: int
    host: str
    rank: int
    world_size: int
    mode: Literal["default", "full", "light"]
    torch_version: str
    device: str  # device of the model's first parameter
    argv: list[str]
    script: str  # path of the user's script, when known
    model: str  # class name of the watched model
    modules: list[ModuleInfo]
    params: list[ParamInfo]
    optimizer: str  # class name, when an optimizer is watched
    # the parameters carry per-sample gradients (Opacus's GradSampleModule): the update is made
    # from those, clipped and summed by the optimizer itself, not from what .grad accumulates
    per_sample_grads: bool
    settings: dict[str, object]  # capture settings in force (sample_every, ...)


# ----------------------------------------------------------------------------- step
class ClipInfo(TypedDict):
    """``torch.nn.utils.clip_grad_norm_`` of the watched parameters during the step (the last call)."""

    norm: float  # the total gradient norm it returned: before clipping (grads.norm are after)
    max_norm: float
    norm_type: float


class GradStats(TypedDict, total=False):
    """Columnar gradient statistics; every list is aligned with SessionEvent.params.  Of a
    complex gradient, max_abs, mean and std are those of its magnitudes |g|."""

    norm: list[float | None]  # L2 norm of .grad (a sparse one: of its dense form); None where .grad is None (see none) or empty
    max_abs: list[float | None]
    mean: list[float | None]
    std: list[float | None]  # sample std: NaN for a one-value gradient
    zero_frac: list[float | None]  # fraction of exact zeros
    nan: list[int]  # count of NaN entries (0 where .grad is None)
    inf: list[int]
    none: list[int]  # indices of trainable parameters whose .grad is None at optimizer step
    pre_nonzero: list[int]  # indices whose .grad was already non-zero before this step's first backward and that a backward of the step added onto (P5)
    not_trained: list[int]  # indices that require grad but were not trained this step: in none of the stepping optimizer's param groups (a part run under no_grad on purpose), or left out of every backward(inputs=...): not P1
    clip: ClipInfo  # clip_grad_norm_ ran on the watched parameters (the other columns are after it)
    # what the watched optimizer's step() then did to each parameter (1.7), in modes default and
    # full on the steps with full statistics (every 10th, captured ones); None where it had no
    # gradient: |update| / |weight before| -- the RMS of the change over the RMS of the values
    # before, on a strided sample of at most 4096 elements (all of a smaller parameter) -- and
    # the parameter's L2 norm after the step
    update_ratio: list[float | None]
    weight_norm: list[float | None]
    # ‖Δw‖, the L2 norm of what the step changed (1.15): the sample's, as the whole parameter's
    # -- a module's ratio is sqrt(Σ‖Δw‖² / Σ‖w before‖²), a parameter zero before (a bias) has
    # no ratio of its own yet moved the module
    update_norm: list[float | None]


class MemoryStats(TypedDict, total=False):
    """Bytes by category at the step boundary (after optimizer.step)."""

    params: int
    grads: int
    optimizer: int  # optimizer state tensors, all of them (exp_avg, momentum buffers, step counters, ...)
    saved: int  # activations saved for backward (peak during the step)
    temporaries: int  # captured steps: the ledger's peak less its starting state and the saved activations (see docs/capture.md)
    other: int  # CUDA: allocator bytes that no named storage accounts for
    live: int  # the union of the parameters', gradients' and optimizer state's storages (not the process's)
    # bytes saved for backward by earlier steps' graphs still alive at the boundary (P7: a
    # graph kept with retain_graph=True, or built in eval mode and kept); absent when none
    kept: int
    # live + saved: an estimate on steps without a graph; on captured steps at least the op
    # ledger's highest point over the recorded ops; in full mode, whose ledger runs through the
    # forward, the backward and optimizer.step(), that highest point itself
    peak: int
    device: dict[str, int]  # CUDA allocator view: allocated, reserved, active, inactive, peak, num_alloc_retries...


class ActivationGrad(TypedDict, total=False):
    module: str
    norm: float
    max_abs: float
    zero_frac: float
    nan: int  # counted on steps after a non-finite one; 0 when norm is finite; absent otherwise
    inf: int
    calls: int  # the module's calls in the step these gather (up to 32), when more than one


class ActivationStats(TypedDict, total=False):
    """A module's output on a captured step: its values as the forward made them (1.7)."""

    module: str
    norm: float
    rms: float  # norm / sqrt(numel): the typical magnitude of its elements
    min: float
    max: float
    zero_frac: float  # exact zeros: ~1 for a ReLU that never fires
    numel: int  # elements, all its calls together
    nan: int  # counted on steps after a non-finite one; 0 when norm is finite; absent otherwise
    inf: int
    calls: int  # the module's calls in the step these gather (up to 32), when more than one


class ForwardInfo(TypedDict, total=False):
    """One call of the watched model's root forward since the previous step boundary (P6, P11)."""

    micro: int
    grad_mode: bool  # torch.is_grad_enabled() during the call
    inference_mode: bool
    training: bool  # root module's .training
    eval_modules: list[str]  # modules in eval mode (when the root is training), at its start or (sampled) its end
    train_modules: list[str]  # dropout / batch-norm modules in train mode (when grad mode is off)
    bn_recalibration: bool  # those are all batch norms with momentum=None: statistics recomputed on purpose, as swa_utils.update_bn does (1.12)
    built_graph: bool  # its output had a grad_fn
    backward: bool  # a backward() later ran through its graph
    # ... and that was a torch.autograd.grad for inputs only, its graph then freed: an adversarial
    # attack's gradient of the input (FGSM, PGD), which trains nothing (1.10)
    input_grad: bool
    # it ran inside torch.utils.checkpoint(model, x, use_reentrant=True): under no_grad by
    # design, its graph built again by the backward's recompute -- no evaluation; with no input
    # that requires grad, no graph at all (1.11)
    checkpoint: bool
    saved_bytes: int  # bytes saved for backward by its graph
    src: str  # user's call site "file.py:123"
    compiled: bool  # seen only in the backward graph: a torch.compile'd forward (its hooks were traced away)
    loss: float  # no backward used it: the loss the loop checked (isfinite/isnan/isinf) before skipping it
    # its call made the parameters of the model's lazy modules (nn.LazyLinear...): the dry run
    # PyTorch's docs have before the optimizer is built, not an evaluation
    materialized: bool


class GraphsKept(TypedDict, total=False):
    step: int  # the latest earlier step whose graph is still alive
    # a backward's loss; or (no loss kept) a forward's output, "state" when a later forward
    # took it in (an RNN's hidden state carried over without .detach())
    of: Literal["loss", "output", "state"]
    src: str  # the user's line of that backward (or forward) call
    # a kept loss: the user's line of the call that took it into a graph of its own (`total +=
    # loss`), watched for from the boundary that first finds a loss kept; absent when unseen
    held_at: str
    # no such call seen and losses of two or more earlier steps alive: the user's named container
    # or variable holding the latest, "'history' (a list)" (`history.append(loss)`), "'.losses' (a
    # list)" (an instance's attribute), "'best' (a variable)"; kept outputs (or tensors computed
    # from them): the list that grew since the boundary before holding tensors with a grad_fn
    # (`all_probs.append(torch.sigmoid(out))`): "'.outputs' (a list)" (an attribute), "a list of
    # the loop's (9 of them, one more each step)" (a function's local: not read from its frame)
    held_in: str


class StepEvent(TypedDict, total=False):
    kind: Literal["step"]
    step: int  # 0-based optimizer step index
    rank: int
    t: float  # wall time at the end of the step
    duration_us: int  # from the previous step boundary (or watch start) to this one
    forward_us: int
    backward_us: int
    # from the step's start (the previous optimizer.step(); the first step's: watch()) to its first
    # forward: the next batch's fetch, zero_grad(), the loop's own code (1.12)
    before_forward_us: int
    optimizer_us: int  # the watched optimizer's step(), from its pre-hooks to the step's record (1.12)
    micro_batches: int  # backward() calls in this step (gradient accumulation count)
    accumulated: int  # of those, the ones summed into .grad since its last reset (P15; LBFGS's closure resets it each pass)
    # value of the tensor backward() was called on; the sum of those of the step's micro-batches
    # (every backward since the gradients were last reset: with `loss / accum_steps`, their mean)
    loss: float | None  # the step's loss as the loop logs it: the backward losses since .grad was last reset, added up (a closure called several times inside step(): its first evaluation's, micro-batches summed where it resets the gradients between evaluations; under a GradScaler, before scaling)
    losses: list[float]  # every micro-batch loss
    graph_signature: str  # cheap hash of the step's graph structure (M1)
    graph_captured: bool  # a GraphEvent exists for this step
    grads: GradStats
    activation_grads: list[ActivationGrad]  # sampled module-output gradient stats
    activations: list[ActivationStats]  # captured steps: module outputs' values (forward), in forward order of their ends
    memory: MemoryStats
    lr: list[float]  # per param group, as in force during the step (a step the GradScaler skipped: before the scheduler stepped)
    # gradient resets seen by the step's backward passes, read from the gradients (zero_grad() is
    # not hooked): every watched .grad None or zero before its first pass (zero_grad(), or none
    # yet on the first step), and again between passes (an LBFGS closure's)
    zero_grad: int
    zero_grad_set_to_none: bool  # those gradients were None, not zeros, before the first pass
    modes: dict[str, bool]  # module path -> training flag, only modules that differ from the root
    training: bool  # root module's mode
    scaler: dict[str, float | bool]  # GradScaler: scale (the one this step's loss was scaled by), skipped (bool)
    autocast: bool  # an autocast region was on at the forward's start (captured steps: anywhere in it)
    autocast_dtype: str  # the dtype that region casts to ("float16", "bfloat16"), where known
    copies: dict[str, int]  # host<->device copies: count, bytes (P12); absent on steps not counted (see docs/capture.md)
    graphs_alive: int  # autograd nodes from earlier steps still reachable at this boundary (P7)
    graphs_kept: GraphsKept  # what the latest of them hangs from, when any is alive
    no_backward_forwards: int  # forwards that built a graph that no backward consumed (P6)
    late_backward: list[list[int]]  # [step, micro] of the previous step's such forwards that this step's backward consumed
    forwards: list[ForwardInfo]  # each root-module forward since the previous step boundary
    backward_roots: list[str]  # grad_fn class of each backward() root, e.g. "DivBackward0" (P15)
    backward_src: list[str]  # user's call site of each backward()
    step_src: str  # user's call site of optimizer.step()
    backward_errors: list[str]  # e.g. "Trying to backward through the graph a second time" (P10)
    hooks: dict[str, int]  # module path -> bytes retained by user module hooks: forward, backward and their pre-hooks (P13)
    # modules whose hooks keep tensors in one container (a dict all their hooks append to): its
    # bytes count once, under the first of them in `hooks`, the others 0
    hooks_shared: list[list[str]]
    hooks_src: dict[str, str]  # module path -> file:line where its first hook keeping any tensor is defined
    events: list[dict[str, object]]  # other in-process facts the doctor judges (free form, 'what' key)


# ----------------------------------------------------------------------------- graph
class TensorMeta(TypedDict, total=False):
    id: int
    shape: list[int]  # -1 for a ragged dimension (a jagged nested tensor's sequence lengths)
    dtype: str
    device: str
    requires_grad: bool
    is_leaf: bool
    stride: list[int]
    storage: int  # storage identity (stable within the event); views share it
    offset: int  # storage offset
    version: int  # tensor._version
    nbytes: int  # bytes of the storage
    param: str  # qualified parameter name, when the tensor is a parameter
    grad_fn: int  # node id of its grad_fn, when it has one


class OpRecord(TypedDict, total=False):
    id: int
    name: str  # "aten::addmm", or a torch-level name for function-mode capture
    module: str  # dotted module path the op ran in ("" = root)
    call: int  # which call of that module (0-based) within the step, to tell repeats apart
    phase: Literal["forward", "backward", "optimizer", "other"]
    micro: int  # micro-batch index within the step
    inputs: list[int]  # tensor ids
    outputs: list[int]  # tensor ids
    grad_mode: bool  # torch.is_grad_enabled() when it ran
    inference_mode: bool
    inplace: bool
    src: str  # "file.py:123" of the top user frame
    dur_us: float
    alloc: int  # bytes of storages newly allocated by this op
    free: int  # bytes of storages freed during this op
    # the storages (TensorMeta.storage) whose last tensor died during this op: with the op that
    # made each (its output's storage, where ``alloc`` counted it), each allocation's lifetime,
    # so what is alive at the step's peak is known (1.9; left out when none)
    freed: list[int]
    live: int  # live bytes after the op
    # e.g. "breaks_graph" (numpy/.item()), "new_leaf", "copy_h2d", "non_differentiable", "nan",
    # "autocast" (ran inside an autocast region), "autocast_cast" (a dtype cast autocast inserted),
    # "inplace_saved" (a forward in-place op writing a storage a graph node saved earlier: P8)
    flags: list[str]


# Ops whose output is uninitialised memory until a later op fills it (dropout's mask before its
# bernoulli_, an out= buffer): whatever bits it holds mean nothing, so it is never flagged "nan"
# (and a file written before this rule is read so by the doctor).
UNINITIALISED_OPS = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                               "aten::new_empty_strided"})

# Ops whose outputs are checked for NaN/Inf in every captured forward, not only when a NaN armed
# the check (capture/native/recorder.cpp mirrors this list): where a finite input turns
# non-finite (log of 0, division by 0, exp overflow), so a NaN born on a captured step is
# traced to its op even when the batch that caused it never comes back.  Their in-place forms
# (log_, div_) are in the set too; the backward's (twice as many ops) are left to armed steps.
NAN_SOURCE_OPS = frozenset(f"aten::{n}{inplace}" for inplace in ("", "_") for n in (
    "log", "log2", "log10", "log1p", "div", "sqrt", "rsqrt", "pow", "exp", "reciprocal", "acos", "asin", "atanh",
    "acosh", "xlogy", "logit", "erfinv",
    # a row masked wholly with -inf (an empty sequence's attention) comes out NaN
    "softmax", "_softmax", "log_softmax", "_log_softmax",
    # the unbiased spread of one element (a one-step episode's returns normalised) is NaN
    "std", "var", "std_mean", "var_mean",
))  # fmt: skip


class SavedTensor(TypedDict, total=False):
    name: str  # e.g. "_saved_self"
    shape: list[int]
    dtype: str
    # bytes the graph holds for it: its storage's; for a view of data that needs no gradient
    # (a batch sliced out of a dataset kept in memory), the part of the storage it spans
    nbytes: int
    storage: int
    offset: int  # storage offset, in elements (as TensorMeta's)
    stride: list[int]


class NodeRecord(TypedDict, total=False):
    id: int
    name: str  # grad_fn class name: "AddmmBackward0", "AccumulateGrad"
    param: str  # for AccumulateGrad: the parameter's qualified name
    module: str  # module path of the forward op that created it (a custom Function's: where its forward ran)
    op: int  # OpRecord.id of that forward op
    saved: list[SavedTensor]
    saved_bytes: int
    # names without their ``_saved_`` prefix; tuples as lists, dtypes and devices by name, an
    # int64 as its signed value (PyTorch reads a dim of -1 back as 2**64 - 1); at most 16 names,
    # 16 items a list (the first), 80 characters a string; None and other kinds left out.  float
    # before int: the server's graph check tries a union's members in order (an eps of 1e-05 is no int)
    attrs: dict[str, float | int | bool | str | list[float | int | bool | str]]  # what a built-in node saved for backward besides tensors (1.9), as torchviz's show_attrs: ConvolutionBackward0's {"stride": [2, 2], "padding": [1, 1], "groups": 1, ...}, SumBackward1's {"dim": [1], "keepdim": true}
    order: int  # position in backward execution (0 = first run), absent if never run
    dur_us: float
    micro: int
    higher_order: bool  # created by a create_graph=True backward
    autocast_cast: bool  # made by a cast autocast inserted (a ToCopyBackward0 of its dtype change)
    reduction: Literal["none", "mean", "sum"]  # a loss node's (MseLossBackward0, NllLossBackward0...)
    scalar: float  # DivBackward0 / MulBackward0 by a number (a 0-dim CPU tensor), Div/MulBackward1 by a Scalar: its value
    made_nonfinite: bool  # turned finite incoming gradients into NaN/Inf (on steps checked for NaN)
    unregistered: bool  # AccumulateGrad of an nn.Parameter neither of the model nor of an optimizer seen stepping (a module in a plain list)
    checkpointed: bool  # its saved tensors were packed by torch.utils.checkpoint (non-reentrant): its forward op runs again in the backward's recompute (1.12)
    held_as: str  # with unregistered: a plain tensor that requires grad, held as this attribute of a module ("path.attr"), not an nn.Parameter


class GraphEvent(TypedDict, total=False):
    kind: Literal["graph"]
    step: int
    rank: int
    micro: int  # micro-batch the autograd graph belongs to: a captured step's first backward (the ops are the whole step's, every micro-batch's forward with its OpRecord.micro; the nodes, that first backward's graph -- the later micro-batches' graphs have the same structure unless the signature changed)
    complete: bool  # False when ops were shed under back-pressure
    shed_ops: int
    ops: list[OpRecord]
    tensors: list[TensorMeta]
    nodes: list[NodeRecord]
    edges: list[list[int]]  # [from_node, to_node, input_nr]: to_node is in from_node.next_functions
    root: int  # node id of the loss's grad_fn
    retained: bool  # retain_graph=True on this backward
    memory_timeline: list[list[int]]  # [op_id, live_bytes] through the recorded ops: forward (and in full mode backward and optimizer.step())
    # which recorder saw the ops: "native" (full mode's C++ observer: no aten::detach that
    # autograd redispatches, allocations by storage lifetime) or "python" (a dispatch mode)
    recorder: Literal["native", "python"]
    # the ops of the step a run failed in before any backward (an error raised on its NaN loss):
    # no step event has this step number, and the graph holds no nodes
    failed: bool


# ----------------------------------------------------------------------------- log / end
class LogEvent(TypedDict, total=False):
    kind: Literal["log"]
    t: float
    level: Literal["info", "warning", "error"]
    message: str
    step: int
    # the numbers of a torchscope.log() call (name -> value), of ``step``; its message shows them
    # ("step 3: acc=0.91"), so a reader without this field still lists them as a line of the log
    metrics: dict[str, float]
    capture_off: CaptureOff  # an error line of a part of the capture that turned itself off
    # the warning that ``step``'s graph was cut at the session's max_ops: the ops that step ran
    # (told once a run; every later step that runs more is cut alike) (1.11)
    ops_cut: int
    # never written by the capture: a server's download appends it as the file's last record
    labels: RunLabels  # the name and tags a user gave the run on a torchscope server (1.13); a file's last wins
    # (in a frame of its own, right after the session event's: no step, so step(n) never decodes it)
    source: ScriptSource  # the text of the run's script (its `__main__` file), recorded once by watch() unless `save_code=False` or `TORCHSCOPE_SAVE_CODE=0`: the doctor reads the lines the capture cannot see from it, on any host (1.14)


class ScriptSource(TypedDict, total=False):
    path: str  # the script's absolute path where it ran (session.script's file, or the -m module's)
    sha256: str  # hex digest of its bytes
    bytes: int  # its size (at most 2 MiB: a bigger one is not recorded)
    text: str  # its text, decoded as Python reads it (undecodable bytes as U+FFFD)


class RunLabels(TypedDict, total=False):
    name: str  # the run's name as renamed in the dashboard
    tags: list[str]  # its tags there


class CaptureOff(TypedDict, total=False):
    part: str  # the part ("step", "graph", "activations", ...): what the session lacks from ``step`` on
    error: str  # the internal error, repr'd


def capture_off(ev: dict[str, object]) -> tuple[str, str] | None:
    """``(part, error)`` of a log event telling that a part of the capture turned itself off after
    an internal error; None for any other event.  Files before 1.8 say it in the message alone
    (``CAPTURE_OFF`` + "<part> turned off at step N after an internal error: <error>; ...")."""
    if ev.get("kind", "log") != "log" or ev.get("level") != "error":
        return None
    off = ev.get("capture_off")
    if isinstance(off, dict) and isinstance(off.get("part"), str):
        return off["part"], str(off.get("error", ""))
    msg = str(ev.get("message", ""))
    if not msg.startswith(CAPTURE_OFF):
        return None
    return (msg[len(CAPTURE_OFF):].split(" ", 1)[0],
            msg.split("internal error: ", 1)[-1].split("; your training", 1)[0])


def script_source(ev: dict[str, object]) -> ScriptSource | None:
    """The ``source`` of a log event that records the run's script (its ``path`` and ``text``
    strings at least), None for any other event."""
    src = ev.get("source") if ev.get("kind") == "log" else None
    if isinstance(src, dict) and isinstance(src.get("path"), str) and isinstance(src.get("text"), str):
        return src  # type: ignore[return-value]
    return None


# How a run ended: "interrupted" is the user's Ctrl-C (KeyboardInterrupt) or a SIGTERM during training.
EndStatus = Literal["finished", "interrupted", "error"]
END_STATUSES: tuple[str, ...] = ("finished", "interrupted", "error")


class EndEvent(TypedDict, total=False):
    kind: Literal["end"]
    t: float
    status: EndStatus
    steps: int
    shed_ops: int  # per-op detail dropped under back-pressure over the whole run
    message: str
    # root forwards after the last step, of no step (a trailing evaluation: P11), as in StepEvent
    forwards: list[ForwardInfo]
    # a run that failed before the backward of its open step (status "error"): what that step's
    # forward read non-finite, as StepEvent.events ("inputs_nonfinite", "params_nonfinite")
    events: list[dict[str, object]]
    # the last step's forwards a backward after it reached, as StepEvent.late_backward (1.12)
    late_backward: list[list[int]]


# ----------------------------------------------------------------------------- series (1.1)
class SeriesRecord(TypedDict, total=False):
    """Columns of the step events written before it (format 1.1): derived data, not an event.

    Alone in a frame flagged FLAG_SERIES (plus FLAG_SERIES_STEPS or FLAG_SERIES_GRADS naming
    the part) whose step range is that of its rows.  Row i of every column belongs to the i-th
    step event in the frames since the previous series record of the same part.  Column names
    and types: capture/series.py PARTS and docs/session-format.md.  Readers of events skip it.
    """

    kind: Literal["series"]
    part: Literal["memory", "steps", "grads"]  # memory_series columns / step_summary's others / gradient lists
    rank: int  # rank of its step events (absent when they have none)
    columns: dict[str, list[object]]  # column name -> one value per step event, in file order


# ----------------------------------------------------------------------------- findings
class FindingTarget(TypedDict, total=False):
    step: int
    rank: int
    node: int  # NodeRecord.id in that step's GraphEvent
    op: int  # OpRecord.id in that step's GraphEvent
    module: str
    param: str


class Finding(TypedDict, total=False):
    """A diagnosis of the doctor (not an event: derived from events, never written by capture)."""

    code: str  # "P1" ... "P18", stable (see docs/pitfalls.md); "doctor": a check that could not run
    severity: Literal["error", "warning", "info"]
    title: str  # short name of the pitfall
    message: str  # one line a newcomer understands
    fix: str  # short how-to-fix
    steps: list[int]  # every step it was true on
    since: int  # first step; "since step 3, every step" when steps are contiguous to the end
    rank: int
    targets: list[FindingTarget]  # what the dashboard highlights
    modules: list[str]
    params: list[str]
    src: str  # "file.py:123" of the user's code, when known
    view: Literal["graph", "memory", "gradients"]
    data: dict[str, object]  # figures behind it (norm history, bytes per step, ...)


Event = SessionEvent | StepEvent | GraphEvent | LogEvent | EndEvent

# The session status the server and reader derive: a file without an EndEvent whose writer
# is gone "ended unexpectedly"; never "running" forever.
SessionStatus = Literal["running", "finished", "interrupted", "error", "ended unexpectedly"]

EVENT_TYPES: dict[str, type] = {
    "session": SessionEvent,
    "step": StepEvent,
    "graph": GraphEvent,
    "log": LogEvent,
    "end": EndEvent,
}
