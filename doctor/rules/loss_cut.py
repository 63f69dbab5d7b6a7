"""backward() on a loss without grad_fn (torch raises "element 0 of tensors does not require grad
and does not have a grad_fn"): told by the cut its loss was computed through -- P1 for a
``.detach()``, ``.data``, an ``.item()``/``.numpy()`` round trip or a forward under no_grad, P9 for
a non-differentiable op -- on a captured step by walking the op dataflow back from the loss, else
from the step's forwards."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from torchscope.schema import Finding, FindingTarget

from .. import graph as g
from ..finding import describe_steps, make
from ..run import Run, as_dict, as_int, as_list, capture_hint, errors, grad_off
from ..settings import Settings
from ..source import script_lines, src_line
from .paths import _COPIES_FIX, _CUT_FIX, P9_FIX, _forward_ops, _tensor_facts, copied_params

NO_GRAD_FN = "does not require grad and does not have a grad_fn"


def no_grad_fn_forwards(ev: dict[str, Any]) -> list[int]:
    """Indices (in ``ev["forwards"]``) of the forwards the step's failing backward() calls on a
    loss without grad_fn ("element 0 of tensors does not require grad and does not have a
    grad_fn") were made from, as far as the event tells: of the forwards no backward used, the
    last one per such failure -- of those that built a graph when any did (the loss was cut from
    it after the forward: a ``.detach()``, an ``.item()``...), else of all (the training forward
    run under ``torch.no_grad()``).  Empty when the step had no such failure or every forward was
    used by a backward that worked: nothing tells which forward the loss came from."""
    k = sum(1 for m in as_list(ev.get("backward_errors")) if NO_GRAD_FN in str(m))
    if not k:
        return []
    forwards = [as_dict(f) for f in as_list(ev.get("forwards"))]
    unused = [i for i, f in enumerate(forwards) if f.get("backward") is not True]
    built = [i for i in unused if forwards[i].get("built_graph") is True]
    return (built or unused)[-k:]


def _off_kind(f: dict[str, Any]) -> str:
    """The cause a forward run with grad mode off is: a reentrant checkpoint given no input that
    requires grad, or the forward under no_grad itself."""
    return "checkpoint_inputs" if f.get("checkpoint") is True else "no_grad_forward"


def _cuts_gradient(op: dict[str, Any]) -> bool:
    """Whether no gradient passes from ``op``'s inputs to its outputs: run with grad mode off, a
    ``detach``, or flagged (``.item()``/``.data`` markers, a non-differentiable op)."""
    return grad_off(op) or str(op.get("name", "")).rstrip("_") == "aten::detach" or bool(g.flags(op) & g.BREAK_FLAGS)


def _grad_carrying(fwd: list[dict[str, Any]], grads: dict[int, bool]) -> set[int]:
    """Tensor ids that carry a gradient: those the table says require grad, and what ops that pass
    a gradient wrote from them (an in-place write into a tensor created without grad)."""
    out = {t for t, v in grads.items() if v}
    for op in fwd:
        if not _cuts_gradient(op) and any(as_int(t, -1) in out for t in as_list(op.get("inputs"))):
            out.update(as_int(t, -1) for t in as_list(op.get("outputs")))
    return out


def _numel(tensor: dict[str, Any]) -> int | None:
    shape = tensor.get("shape")
    if not isinstance(shape, list):
        return None
    n = 1
    for d in shape:
        n *= as_int(d, 1)
    return n


def _failed_loss(fwd: list[dict[str, Any]], tensors: dict[int, dict[str, Any]],
                 floating: dict[int, bool]) -> dict[str, Any]:
    """The op that made the tensor a failing backward() was called on: the last op (the capture
    stops recording a step's ops at its backward) whose floating outputs no later op reads, one
    with a single-element output (a loss) if any."""
    readers = g.consumers(fwd)
    sinks: list[dict[str, Any]] = []
    for op in fwd:
        oid = as_int(op.get("id"), -1)
        outs = [as_int(t, -1) for t in as_list(op.get("outputs"))]
        if (outs and any(floating.get(t, True) for t in outs)
                and not any(as_int(r.get("id"), -1) > oid for t in outs for r in readers.get(t, []))):
            sinks.append(op)
    scalar = [op for op in sinks if any(_numel(tensors.get(as_int(t, -1), {})) == 1 for t in as_list(op.get("outputs")))]
    return (scalar or sinks or [{}])[-1]


# The call the user wrote, recorded next to the aten ops it ran (a .detach() is both
# torch::Tensor.detach and aten::detach): what the message names
_MARKERS = {"torch::Tensor.detach": "detach", "torch::Tensor.data": "data", "torch::Tensor.item": "value",
            "torch::Tensor.tolist": "value", "torch::Tensor.numpy": "value", "torch::Tensor.__array__": "value"}


@dataclass
class _Cause:
    """Why a failing backward's loss had no grad_fn: the kind of cut, where, and the op (a captured step's)."""

    code: str
    kind: str
    src: str = ""
    label: str = ""
    mode: str = ""  # "torch.no_grad()" / "torch.inference_mode()" for a cut by grad mode
    hint: str = ""
    op: dict[str, Any] = field(default_factory=dict)
    gstep: int = -1

    def key(self) -> tuple[str, str, str, str, str, str]:
        return self.code, self.kind, self.src, self.label, self.mode, self.hint


def _mode_of(x: dict[str, Any]) -> str:
    return "torch.inference_mode()" if x.get("inference_mode") is True else "torch.no_grad()"


# A call of torch.utils.checkpoint (or checkpoint_sequential) that does not pass use_reentrant=False,
# and what a grad-mode-off block in the user's code is written with
_CHECKPOINT_CALL = re.compile(r"\bcheckpoint(?:_sequential)?\s*\(")
_NOT_REENTRANT = re.compile(r"use_reentrant\s*=\s*False")
_GRAD_OFF_CODE = re.compile(r"\b(?:no_grad|inference_mode|set_grad_enabled)\b")


def _line_no(src: str) -> int:
    at = src_line(src)
    return at[1] if at is not None else -1


def _reentrant_checkpoint(run: Run, fwd: list[dict[str, Any]], op: dict[str, Any], carrying: set[int],
                          tensors: dict[int, dict[str, Any]]) -> str | None:
    """The line of the reentrant ``torch.utils.checkpoint`` call that ran ``op`` with grad mode
    off inside a forward that had it on, or None (a no_grad block, or nothing tells).  Both leave
    the same ops: grad mode off for a stretch of the forward, parameters read inside it.  They
    differ in the user's code around the stretch -- the lines of the forward from the last op
    before it to the first after it (its caller's: the checkpoint call, a ``with
    torch.no_grad():``), read back from the script -- and in what enters it: reentrant
    checkpointing builds a graph whenever an input requires grad (QA 52b: LoRA's adapters
    inside checkpointed blocks fed by a frozen embedding, no ``enable_input_require_grads()``),
    so an activation carrying a gradient into the stretch rules it out."""
    micro = op.get("micro")
    ops = [o for o in fwd if o.get("micro") == micro]
    i = next((k for k, o in enumerate(ops) if o is op), -1)
    if i < 0:
        return None
    lo = i
    while lo > 0 and grad_off(ops[lo - 1]):
        lo -= 1
    hi = i
    while hi + 1 < len(ops) and grad_off(ops[hi + 1]):
        hi += 1
    inside = {as_int(t, -1) for o in ops[lo:hi + 1] for t in as_list(o.get("outputs"))}
    entering = {as_int(t, -1) for o in ops[lo:hi + 1] for t in as_list(o.get("inputs"))} - inside
    if any(t in carrying and "param" not in tensors.get(t, {}) for t in entering):
        return None  # an activation that carries a gradient enters it: a reentrant checkpoint would have built a graph
    before = ops[lo - 1] if lo > 0 else None
    after = ops[hi + 1] if hi + 1 < len(ops) else None
    src = str((before or {}).get("src", "") or (after or {}).get("src", ""))
    found = script_lines(run, src) if src else None
    if found is None:
        return None
    base, lines = found
    first = _line_no(str((before or {}).get("src", "")))
    last = _line_no(str((after or {}).get("src", "")))
    if str((after or {}).get("src", "")).rpartition(":")[0] != base:
        last = -1
    if first < 0:  # the stretch opens the forward: the lines up to the first op after it
        first = max(1, last - 10)
    if last < first:
        last = first + 10
    calls, off = [], False
    for n in range(first, min(last, len(lines)) + 1):
        text = lines[n - 1].split("#", 1)[0]
        off = off or bool(_GRAD_OFF_CODE.search(text))
        if _CHECKPOINT_CALL.search(text) and not _NOT_REENTRANT.search(text):
            calls.append(n)
    ran = {_line_no(str(o.get("src", ""))) for o in ops[lo:hi + 1] if str(o.get("src", "")).rpartition(":")[0] == base}
    called = [n for n in calls if n in ran]  # the stretch's ops were run from the checkpoint line itself
    if called:
        return f"{base}:{called[0]}"
    return f"{base}:{calls[0]}" if calls and not off else None  # (both written there: which ran is not told)


def _graph_cause(run: Run, gstep: int, graph: dict[str, Any],
                 forwards: list[dict[str, Any]]) -> tuple[_Cause | None, list[dict[str, Any]]]:
    """The cut between what carries a gradient and the loss of a failing step's captured graph:
    walking the op dataflow back from the loss to the first ops that read a tensor carrying a
    gradient and pass none on.  Else (None, the step's ``.item()``/``.detach()``... calls on
    tensors carrying a gradient that the walk could not tie to the loss)."""
    fwd = _forward_ops(graph)
    tensors = {as_int(t.get("id"), -1): t for t in as_list(graph.get("tensors")) if isinstance(t, dict)}
    floating, grads, _, _ = _tensor_facts(graph)
    carrying = _grad_carrying(fwd, grads)

    def carries(op: dict[str, Any]) -> bool:
        return any(as_int(t, -1) in carrying for t in as_list(op.get("inputs")))

    def cuts(op: dict[str, Any]) -> bool:
        return carries(op) and _cuts_gradient(op)

    markers = [op for op in fwd if str(op.get("name", "")) in _MARKERS and not as_list(op.get("outputs"))
               and carries(op)]
    loss = _failed_loss(fwd, tensors, floating)
    if not loss:
        return None, markers
    path = g.upstream(fwd, loss, passes=lambda op: not cuts(op))
    found: list[dict[str, Any]] = []
    for cut in filter(cuts, path):
        if str(cut.get("name", "")).rstrip("_") == "aten::detach":  # named as the user's call, where recorded
            cut = next((m for m in markers if m.get("src") == cut.get("src") and m.get("inputs") == cut.get("inputs")
                        and as_int(m.get("id"), -1) < as_int(cut.get("id"), -1)), cut)
        found.append(cut)
    if not found:
        # a .data view is made by no op: tied to the loss by the storage it shares with what the walk read
        storages = {tensors.get(as_int(t, -1), {}).get("storage") for op in path for t in as_list(op.get("inputs"))}
        found = [m for m in markers if any(tensors.get(as_int(t, -1), {}).get("storage") in storages - {None}
                                           for t in as_list(m.get("inputs")))]
    if not found:
        return None, markers
    # a non-differentiable op is the cause when it alone cuts the loss off (P9); a detach or a
    # no_grad beside it would leave the loss without grad_fn on its own
    op = next((o for o in found if "non_differentiable" not in g.flags(o)), found[0])
    name, src = str(op.get("name", "")), str(op.get("src", ""))
    if grad_off(op):
        micro = as_int(op.get("micro"), -1)
        f = forwards[micro] if 0 <= micro < len(forwards) else {}
        if grad_off(f) and f.get("src"):  # the model's forward itself ran with grad mode off
            return _Cause("P1", _off_kind(f), str(f["src"]), mode=_mode_of(f), op=op, gstep=gstep), []
        call = None if op.get("inference_mode") is True else _reentrant_checkpoint(run, fwd, op, carrying, tensors)
        if call is not None:  # checkpointed layers inside the forward, given no input that requires grad
            return _Cause("P1", "checkpoint_segment", call, g.op_label(op, run), op=op, gstep=gstep), []
        return _Cause("P1", "no_grad", src, g.op_label(op, run), _mode_of(op), op=op, gstep=gstep), []
    if "non_differentiable" in g.flags(op):
        return _Cause("P9", "non_differentiable", src, g.op_label(op, run), op=op, gstep=gstep), []
    kind = _MARKERS.get(name, "detach" if name.rstrip("_") == "aten::detach" else "cut")
    return _Cause("P1", kind, src, g.op_label(op, run), op=op, gstep=gstep), []


def _param_copies(run: Run, gstep: int, graph: dict[str, Any], forwards: list[dict[str, Any]]) -> _Cause | None:
    """The forward's ops read, in place of a module's parameters, tensors of their shapes that are
    not them and carry no gradient (``functional_call(model, {k: v.detach() ...})``, ``p.data``):
    the loss has no path to any parameter."""
    copies = copied_params(run, graph)
    if not copies:
        return None
    op = next(iter(copies.values()))
    micro = as_int(op.get("micro"), -1)
    src = str((forwards[micro] if 0 <= micro < len(forwards) else {}).get("src") or op.get("src", ""))
    names = list(copies)
    label = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return _Cause("P1", "param_copies", src, label, op=op, gstep=gstep)


def _forward_cause(forwards: list[dict[str, Any]], suspects: list[int], backward_src: str) -> _Cause:
    """What the forwards of a failing step tell without its ops: the training forward ran with
    grad mode off, or built a graph the loss was cut from afterwards, or nothing -- no forward
    recorded, or each used by a backward that worked: P9, as this failure always was."""
    chosen = [forwards[i] for i in suspects if 0 <= i < len(forwards)]
    off = next((f for f in reversed(chosen) if grad_off(f) and f.get("src")), None)
    if off is not None:
        return _Cause("P1", _off_kind(off), str(off["src"]), mode=_mode_of(off))
    built = next((f for f in reversed(chosen) if f.get("built_graph") is True), None)
    if built is not None:
        return _Cause("P1", "after_forward", backward_src, str(built.get("src", "")))
    return _Cause("P1" if chosen else "P9", "unknown", backward_src)


_HEAD = "backward() was called on a loss with no grad_fn"
_CUT_TITLE = "Loss cut from the autograd graph"
_NOTHING = "so backward() had nothing to differentiate"
_DETACH_FIX = ("Remove the .detach() on the loss's path: a detached tensor carries no gradient, so nothing computed "
               "before it trains. Use .detach() only for values you log or store (metrics, running averages, targets).")
_DATA_FIX = ("Use the tensor itself, not its .data, on the loss's path: .data carries no gradient. For values you log "
             "or store, use .detach().")
_VALUE_FIX = ("Compute the loss with torch ops on the tensors themselves: .item()/.tolist() give Python numbers and "
              ".numpy() an array, which have no gradient history once made into a tensor again. Use them only for "
              "values you log.")
_FORWARD_FIX = ("Run the training forward outside the torch.no_grad() (or torch.inference_mode()) block -- an "
                "indentation slip puts it inside: keep that block only around what needs no gradient (building a "
                "mixup batch, targets, an evaluation).")
_CHECKPOINT_FIX = ("Pass use_reentrant=False to torch.utils.checkpoint (the form PyTorch recommends, which records "
                   "the graph whatever its inputs), or hand the checkpointed call an input that requires grad.")
_SEGMENT_FIX = ("Pass use_reentrant=False to torch.utils.checkpoint (the form PyTorch recommends, which records the "
                "graph whatever its inputs), or make the checkpointed call's input require grad: with a frozen "
                "embedding, a forward hook on it that calls output.requires_grad_(True) (transformers: "
                "model.enable_input_require_grads() before training with gradient checkpointing).")
_NO_GRAD_OPS_FIX = ("Compute the loss with grad enabled: move it out of the torch.no_grad() (or "
                    "torch.inference_mode()) block.")
_AFTER_FIX = ("Find the cut between the model's output and the loss: remove a .detach()/.data there (use .detach() "
              "only for values you log or store), keep the loss in torch ops (no .item()/.numpy() round trip), "
              "compute it outside torch.no_grad(), and replace a non-differentiable op (a hard decision, a "
              "comparison, an integer cast) with a differentiable surrogate such as probabilities.")
_UNKNOWN_FIX = (f"{_CUT_FIX} A non-differentiable op on the loss's path (a hard decision, a comparison, an integer "
                "cast) wants a differentiable surrogate such as probabilities. Under torch.utils.checkpoint(..., "
                "use_reentrant=True) the checkpointed call needs an input that requires grad: pass use_reentrant=False "
                "(transformers: model.enable_input_require_grads()).")
_GENERIC = ("it was computed from tensors cut from the graph -- a .detach(), .data, an .item()/.numpy() round trip, a "
            "forward under torch.no_grad(), layers run inside torch.utils.checkpoint(use_reentrant=True) given no "
            "input that requires grad (a frozen embedding feeding checkpointed blocks), or a non-differentiable op")


def _cause_text(c: _Cause, when: str, p9_fix: str, hint: str) -> tuple[str, str]:
    """(message, fix) of one kind of failing backward."""
    if c.kind == "detach":
        return f"{_HEAD}: it was computed from a tensor detached from the graph at {c.src} ({c.label}), {_NOTHING} ({when}).", _DETACH_FIX
    if c.kind == "data":
        return f"{_HEAD}: it was computed from a tensor's .data taken at {c.src}, which is cut from the graph, {_NOTHING} ({when}).", _DATA_FIX
    if c.kind == "value":
        return (f"{_HEAD}: it was computed from a value taken out of the graph at {c.src} ({c.label}) and made into a "
                f"tensor again, which has no gradient history, {_NOTHING} ({when}).", _VALUE_FIX)
    if c.kind == "cut":
        return f"{_HEAD}: it was computed from a tensor cut from the graph at {c.src} ({c.label}), {_NOTHING} ({when}).", _CUT_FIX
    if c.kind == "no_grad_forward":
        return (f"{_HEAD}: the forward at {c.src} ran under {c.mode}, so its output has no graph and backward() had "
                f"nothing to differentiate ({when}).", _FORWARD_FIX)
    if c.kind == "checkpoint_inputs":
        return (f"{_HEAD}: the forward at {c.src} ran inside torch.utils.checkpoint with use_reentrant=True, which runs "
                "it under no_grad and gives its output a graph only when one of its tensor inputs requires grad -- none "
                f"did, {_NOTHING} ({when}).", _CHECKPOINT_FIX)
    if c.kind == "checkpoint_segment":
        return (f"{_HEAD}: it was computed by ops run inside the torch.utils.checkpoint call at {c.src} ({c.label}): "
                "with use_reentrant=True it runs the checkpointed function under no_grad and gives its output a "
                "graph only when one of its tensor inputs requires grad -- none did (a frozen embedding feeding the "
                "checkpointed layers, as in LoRA fine-tuning with gradient checkpointing), so the parameters inside "
                f"it got no path to the loss and backward() had nothing to differentiate ({when}).", _SEGMENT_FIX)
    if c.kind == "no_grad":
        return (f"{_HEAD}: it was computed by ops run under {c.mode} at {c.src} ({c.label}), which record no graph, "
                f"{_NOTHING} ({when}).", _NO_GRAD_OPS_FIX)
    if c.kind == "non_differentiable":
        return (f"{_HEAD}: it was computed through {c.label} at {c.src}, which is not differentiable: no gradient "
                f"flows back past it, {_NOTHING} ({when}).", p9_fix)
    if c.kind == "param_copies":
        return (f"{_HEAD}: the forward at {c.src} computed with copies of the parameters cut from the graph ({c.label}): "
                "its ops read tensors of their shapes that are not them and carry no gradient -- a params dict of "
                ".detach()ed tensors for torch.func.functional_call, .data, or a copy -- so the loss has no path to "
                f"any parameter and backward() had nothing to differentiate ({when}).", _COPIES_FIX)
    if c.kind == "after_forward":
        where = f" (the forward at {c.label})" if c.label else ""
        tell = c.hint or f"; a captured graph names the op {hint}"
        return (f"{_HEAD}: the model's output{where} had a graph, but the loss was computed from tensors cut from it "
                "-- a .detach(), .data, an .item()/.numpy() round trip, ops under torch.no_grad(), or a "
                f"non-differentiable op ({when}){tell}.", _AFTER_FIX)
    return f"{_HEAD}: {_GENERIC} ({when}).", _UNKNOWN_FIX


def check(run: Run, settings: Settings) -> list[Finding]:
    """backward() on a loss without grad_fn: P1 where the loss was cut from the graph (a detach,
    a forward under no_grad), P9 where a non-differentiable op is the cut (or nothing tells)."""
    failing = [e for e in errors(run) if NO_GRAD_FN in e.message]
    if not failing:
        return []
    events = dict(run.step_events())
    causes: dict[int, _Cause] = {}
    by_forward: dict[tuple[str, ...], _Cause] = {}  # what a captured failing step found, for uncaptured ones alike
    plain: dict[int, _Cause] = {}
    for e in failing:
        if e.step in plain:
            continue
        ev = events.get(e.step, {})
        forwards = [as_dict(f) for f in as_list(ev.get("forwards"))]
        fc = plain[e.step] = _forward_cause(forwards, no_grad_fn_forwards(ev), e.src)
        for graph in run.graphs_of(e.step):
            gc, markers = _graph_cause(run, e.step, graph, forwards)
            if gc is None and markers and fc.kind == "after_forward":
                # not tied to the loss by the dataflow (an .item() made into a tensor again): said, not claimed
                m = markers[-1]
                gc = _Cause("P1", "after_forward", str(m.get("src", "")) or e.src, fc.label,
                            hint=f"; this step called {m.get('name')} at {m.get('src')} on a tensor that carries a "
                                 "gradient", op=m, gstep=e.step)
            if gc is None and fc.kind == "unknown":
                gc = _param_copies(run, e.step, graph, forwards)
            if gc is not None:
                causes[e.step] = gc
                by_forward.setdefault(fc.key(), gc)
                break
    groups: dict[tuple[str, ...], tuple[list[int], _Cause]] = {}
    for step, fc in plain.items():
        c = causes.get(step) or by_forward.get(fc.key(), fc)
        steps, first = groups.get(c.key(), ([], c))
        groups[c.key()] = ([*steps, step], first)
    findings: list[Finding] = []
    for steps, c in groups.values():
        message, fix = _cause_text(c, describe_steps(sorted(steps), run.last_step), P9_FIX, capture_hint(run))
        target: dict[str, Any] = g.target_of_op(c.gstep, run.rank, c.op) if c.op else {"step": min(steps), "rank": run.rank}
        if c.kind == "no_grad_forward":
            target.pop("module", None)  # the whole forward ran so, not the module of the op the walk met first
        module = str(target.get("module", ""))
        findings.append(make(c.code, "error", message, fix, steps, rank=run.rank,
                             targets=[FindingTarget(**target)],  # type: ignore[typeddict-item]
                             modules=[module] if module else [], src=c.src or None,
                             title=_CUT_TITLE if c.code == "P1" else None,
                             data={"error": failing[0].message[:500], "cut": c.kind,
                                   **({"op": str(c.op.get("name", ""))} if c.op else {})}))
    return findings
