"""P4: NaN or Inf in the loss, a forward output or a gradient; points at the first op that produced it."""

from __future__ import annotations

import math
import re
from typing import Any

from torchscope.schema import UNINITIALISED_OPS, Finding, FindingTarget

from .. import graph as g
from ..finding import describe_steps, make
from ..run import Run, as_dict, as_float, as_int, as_list, notes
from ..settings import Settings
from ..source import script_lines
from ._grads import column, scaler_skipped
from .norms import FIX_DIVERGING, loss_blowup

FIX_UPDATE = ("Check the learning rate that optimizer.step() used (optimizer.param_groups[i]['lr']) and what sets "
              "it: a warm-up or scheduler dividing by zero (0/0 at step 0), a learning rate computed from a NaN "
              "metric; else the optimizer's state and settings (e.g. Adam's eps=0 dividing by a zero second "
              "moment, or a float16 model's optimizer: its eps=1e-8 is 0 in float16 -- keep the parameters in "
              "float32 and use torch.autocast for float16 compute).")
FIX = ("Look at the first op that produced it: log/sqrt/div of zero or negatives (add an eps, clamp), exp "
       "overflow (use log-softmax / logsumexp), a learning rate too high (lower it, clip gradients), or bad "
       "input data (check the batch for NaN).")
FIX_SOFTMAX = ("A softmax over a row that is -inf everywhere gives NaN: an attention row whose keys are all masked "
               "(an empty sequence, a key_padding_mask or attn_mask that is True across a whole row). Drop empty "
               "sequences from the batch, keep at least one key unmasked (e.g. the first token), or fill masked "
               "scores with a large negative number (torch.finfo(dtype).min) instead of -inf.")
FIX_DATA = ("The batch held NaN/Inf before the model saw it: find the samples with torch.isfinite(x).all(dim=...) "
            "and fix them at their source (the dataset file, a transform dividing by a zero std, a log of 0), "
            "or drop them in the data loader.")
FIX_EMPTY = ("Skip a batch with nothing to average -- if (target != ignore_index).any(), if mask.any() -- or "
             "average by hand with a count that is never zero: loss_sum / (target != ignore_index).sum().clamp(min=1) "
             "(reduction='sum').")
FIX_OVERFLOW = ("The values grew past what float32 holds (3.4e38) before that op: scale the inputs (normalise them: "
                "(x - mean) / std), keep the activations bounded (a recurrent layer's tanh rather than "
                "nonlinearity='relu', LayerNorm, a smaller initialisation), and if they grew over training, lower the "
                "learning rate or clip the gradients (clip_grad_norm_). A NaN check finds nothing before that op: "
                "print the size of the batch and of each module's output (x.abs().max()) to see where they grow.")
FIX_OVERFLOW_INPUT = ("The values grew past what float32 holds (3.4e38) from a batch that was huge before the model "
                      "saw it: scale the inputs, not the model -- normalise them ((x - mean) / std with the training "
                      "set's statistics, images / 255) in the dataset or "
                      "data loader, and look for what made them that large (a unit mix-up, a column never "
                      "normalised, a multiplication meant for something else): print x.abs().max() of a batch.")
FIX_OVERFLOW_TARGET = ("Check the targets (y.abs().max(), torch.isfinite(y).all()) and scale them as the outputs "
                       "are: normalise y ((y - mean) / std) for the loss and un-scale the predictions for reporting, "
                       "or use a loss that grows slower on large errors (F.smooth_l1_loss / F.huber_loss).")
FIX_BACKWARD = ("A gradient formula met a zero its forward handled: sqrt or a norm of exactly zero (add an eps "
                "inside: (x + 1e-12).sqrt()), log or a division in a torch.where branch that is masked out (its "
                "gradient is still 0 * inf = NaN: make the input safe before the op, torch.where(mask, x, 1.0).log()), "
                "pow with an exponent below 1 at zero. torch.autograd.set_detect_anomaly(True) around that step's "
                "backward names the first node that returned NaN, with its forward's stack.")


FIX_NAN_TO_NUM = ("torch.nan_to_num hides a NaN, it does not remove its cause: find the batches whose loss is "
                  "NaN/Inf before it (torch.isfinite(loss), torch.isfinite(x).all() on the batch) and fix their data "
                  "or the op that overflows; to skip such a batch, say so -- if not torch.isfinite(loss): continue -- "
                  "rather than training on zeros (a zeroed gradient still moves momentum and Adam) and logging NaN.")

# (a backward that makes NaN of its own -- sqrt at 0 -- in a script that also calls nan_to_num)
_BACKWARD_AFTER = " If the value before nan_to_num was finite, the backward made the NaN: " + FIX_BACKWARD[0].lower() + FIX_BACKWARD[1:]
_NAN_TO_NUM = re.compile(r"\bnan_to_num_?\s*\(")


def nan_to_num_src(run: Run, grads: bool = False) -> str | None:
    """``file:line`` where the script calls ``torch.nan_to_num`` (or ``nan_to_num_``): an op of a
    captured graph, else a line of the recorded script that calls it -- ``grads``: preferably one
    that assigns the gradients (the capture's ``grads_assigned`` line, else a line naming
    ``grad``), else preferably one that does not; None when neither shows one.  A NaN it replaces
    reads as a finite loss, or as gradients of exact zeros beside a NaN loss (QA 53: "a mean over
    no elements (0/0)")."""
    if not grads:
        for _, graph in run.all_graphs():
            for op in g.ops(graph):
                if str(op.get("name", "")).startswith("aten::nan_to_num") and op.get("src"):
                    return str(op["src"])
    seen: set[str] = set()
    found: list[tuple[str, str]] = []  # (file:line, the line)
    assigned: set[str] = set()
    for _, ev in run.step_events():
        assigned.update(str(e.get("src")) for e in notes(ev, "grads_assigned") if e.get("src"))
        srcs = [*(as_dict(f).get("src") for f in as_list(ev.get("forwards"))), *as_list(ev.get("backward_src")),
                ev.get("step_src"), *(e.get("src") for e in notes(ev, "grads_assigned"))]
        for src in srcs:
            base = str(src or "").rpartition(":")[0]
            if not base or base in seen:
                continue
            seen.add(base)
            lines = script_lines(run, str(src))
            if lines is not None:
                found += [(f"{lines[0]}:{n}", code) for n, line in enumerate(lines[1], 1)
                          if _NAN_TO_NUM.search(code := line.split("#", 1)[0])]
    if not found:
        return None
    ranked = sorted(found, key=lambda f: (f[0] not in assigned, "grad" not in f[1]) if grads else ("grad" in f[1],))
    return ranked[0][0]


def loss_nonfinite(ev: dict[str, Any]) -> bool:
    """A loss of the step's backward passes, or one the loop checked and skipped, not finite."""
    return not _backward_losses_finite(ev) or bool(skipped_nonfinite(ev))


def _backward_losses_finite(ev: dict[str, Any]) -> bool:
    values = [as_float(ev.get("loss")), *(as_float(v) for v in as_list(ev.get("losses")))]
    return all(v is None or math.isfinite(v) for v in values)


def _discarded_nonfinite(ev: dict[str, Any]) -> list[float]:
    """The non-finite losses of the step's backward passes whose gradients no optimizer.step()
    used: cleared by a ``zero_grad()`` before the step's last ones (``accumulated`` counts the
    passes summed since), as a loop does that catches ``clip_grad_norm_(...,
    error_if_nonfinite=True)`` and moves on to the next batch.  None when a kept pass is."""
    losses = [as_float(v) for v in as_list(ev.get("losses"))]
    kept = as_int(ev.get("accumulated"), len(losses))
    if not 0 < kept < len(losses) or any(v is not None and not math.isfinite(v) for v in losses[-kept:]):
        return []
    return [v for v in losses[:-kept] if v is not None and not math.isfinite(v)]


def skipped_nonfinite(ev: dict[str, Any]) -> list[float]:
    """The non-finite losses of the step's batches the loop skipped before backward (capture's
    ``ForwardInfo.loss``: the loss it checked with isfinite/isnan/isinf)."""
    values = [as_float(as_dict(f).get("loss")) for f in as_list(ev.get("forwards"))]
    return [v for v in values if v is not None and not math.isfinite(v)]


def _bad_params(ev: dict[str, Any]) -> list[int]:
    nan, inf = column(ev, "nan"), column(ev, "inf")
    if not any(nan) and not any(inf):  # the usual case: all zeros
        return []
    return [i for i in range(max(len(nan), len(inf)))
            if as_int(nan[i] if i < len(nan) else 0) > 0 or as_int(inf[i] if i < len(inf) else 0) > 0]


def _held_at_forward(ev: dict[str, Any]) -> list[int] | None:
    """The parameters the step's forward read non-finite (the capture's ``params_nonfinite``
    event, on the first step whose loss went NaN/Inf after finite ones), None where not checked."""
    for e in as_list(ev.get("events")):
        if isinstance(e, dict) and e.get("what") == "params_nonfinite":
            return [as_int(i) for i in as_list(e.get("params"))]
    return None


def _inputs_read(ev: dict[str, Any]) -> tuple[list[int], int] | None:
    """The first NaN/Inf loss's forward inputs the capture could still read: (the positions of
    those holding NaN/Inf, how many it read); None when not read."""
    for e in as_list(ev.get("events")):
        if isinstance(e, dict) and e.get("what") == "inputs_nonfinite":
            return [as_int(i) for i in as_list(e.get("inputs"))], as_int(e.get("read"))
    return None


def _bad_batch(inputs: tuple[list[int], int] | None, step: int) -> str | None:
    """The sentence for a first NaN/Inf step whose forward read NaN/Inf inputs."""
    if not inputs or not inputs[0]:
        return None
    which = ", ".join(f"#{k}" for k in inputs[0])
    return (f"the model's input batch at step {step} already held NaN/Inf (its tensor input{'s' if len(inputs[0]) > 1 else ''} "
            f"{which}, read when the loss came out NaN/Inf): it came in with the data, not from an op.")


def _param_input(graph: dict[str, Any], op: dict[str, Any]) -> str | None:
    """The parameter among ``op``'s inputs, if one is."""
    params = {as_int(t.get("id"), -1): t["param"] for t in as_list(graph.get("tensors"))
              if isinstance(t, dict) and isinstance(t.get("param"), str)}
    return next((params[i] for i in (as_int(x, -1) for x in as_list(op.get("inputs"))) if i in params), None)


def _flagged(op: dict[str, Any]) -> bool:
    return "nan" in g.flags(op) and op.get("name") not in UNINITIALISED_OPS


def culprit(graph: dict[str, Any], loss_bad: bool = False) -> dict[str, Any] | None:
    """The op that made the step's non-finite values: the earliest op from which a chain of ops
    flagged non-finite, each reading the one before, leads to the loss -- or, the loss's op not
    flagged (a NaN born in the backward) or not known, to the last flagged op.  An attention
    mask of -inf is flagged but absorbed (the softmax that reads it is finite) or left unused:
    no chain runs from it, so it is no cause."""
    chain = _chain(graph, loss_bad)
    return chain[0] if chain else None


def _chain(graph: dict[str, Any], loss_bad: bool) -> list[dict[str, Any]]:
    """The ops flagged non-finite from which the loss's values came (``culprit``), in order."""
    ops = g.ops(graph)
    bad = [op for op in ops if _flagged(op)]
    if not bad:
        return []
    loss = g.loss_op(graph)
    if loss and loss_bad and not _flagged(loss):
        # a non-finite loss whose op was not checked: a step on which only the ops that turn
        # finite inputs non-finite (log, div, exp: NAN_SOURCE_OPS) were -- the earliest of them
        # the loss was computed from is where it began
        up = {as_int(op.get("id"), -1) for op in g.upstream(ops, loss)}
        first = next((op for op in bad if as_int(op.get("id"), -1) in up), None)
        if first is not None:
            return [first]
    end = loss if loss and _flagged(loss) else bad[-1]
    written = g.writers(ops)
    chain = {as_int(end.get("id"), -1): end}
    todo = [end]
    while todo:
        cur = todo.pop()
        cid = as_int(cur.get("id"), -1)
        for t in as_list(cur.get("inputs")):
            w = g.writer_before(written, as_int(t, -1), cid)
            wid = as_int(w.get("id"), -1) if w is not None else -1
            if w is not None and wid not in chain and _flagged(w):
                chain[wid] = w
                todo.append(w)
    return [chain[i] for i in sorted(chain)]


def _carrier(graph: dict[str, Any], chain: list[dict[str, Any]], nonfinite: set[str]) -> dict[str, Any] | None:
    """The first op of ``chain`` that reads one of the parameters ``nonfinite`` (those an earlier
    step's optimizer.step() updated with NaN/Inf gradients) and no non-finite value of another
    op: its NaN is the parameter's.  A -inf attention mask earlier in the chain (``masked_fill_``)
    only met the NaN in the softmax."""
    if not nonfinite:
        return None
    ids = {as_int(op.get("id"), -1) for op in chain}
    written = g.writers(g.ops(graph))
    for op in chain:
        oid = as_int(op.get("id"), -1)
        fed = any(as_int(w.get("id"), -1) in ids for t in as_list(op.get("inputs"))
                  if (w := g.writer_before(written, as_int(t, -1), oid)) is not None)
        if not fed and _param_input(graph, op) in nonfinite:
            return op
    return None


def _nonfinite_steps(run: Run) -> tuple[list[int], dict[int, int]]:
    """Steps with a non-finite loss or gradient, and param index -> first step with NaN/Inf in
    its gradient.  A GradScaler skips steps whose scaled gradients overflowed: that is its job,
    judged by P14."""
    steps: list[int] = []
    params: dict[int, int] = {}
    for step, ev in run.step_events():
        bad = [] if scaler_skipped(ev) else _bad_params(ev)
        # ops flagged non-finite on a step whose loss and gradients are finite (an attention
        # mask of -inf, checked on the first captured step) harm nothing: not a finding
        if loss_nonfinite(ev) or bad:
            steps.append(step)
            for i in bad:
                params.setdefault(i, step)
    return steps, params


def backward_origin(graph: dict[str, Any]) -> dict[str, Any] | None:
    """The first backward node (in execution order) that turned finite incoming gradients into
    NaN/Inf, on a step whose nodes were checked (capture's ``made_nonfinite``)."""
    made = [n for n in as_list(graph.get("nodes")) if isinstance(n, dict) and n.get("made_nonfinite")]
    return min(made, key=lambda n: as_int(n.get("order"), 1 << 30)) if made else None


def origin(graph: dict[str, Any], loss_bad: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Where one captured step's non-finite values began, as (op, node): with a finite loss,
    the first backward node that turned finite gradients non-finite (and the forward op it is
    the gradient of); else the forward op (``culprit``), or that node when no op was flagged."""
    node = backward_origin(graph)
    if node is not None and not loss_bad:
        return g.op_of_node(graph, node), node
    hit = culprit(graph, loss_bad)
    if hit is not None:
        return hit, {}
    if node is not None:
        return g.op_of_node(graph, node), node
    return {}, {}


def origin_text(run: Run, op: dict[str, Any], node: dict[str, Any]) -> str:
    """``SqrtBackward0, the gradient of aten::sqrt`` or ``aten::log in 'head'``."""
    if not node:
        return g.op_label(op, run)
    return str(node.get("name", "a node")) + (f", the gradient of {g.op_label(op, run)}" if op else "")


def origin_target(step: int, rank: int, op: dict[str, Any], node: dict[str, Any]) -> FindingTarget:
    if not node:
        return FindingTarget(**g.target_of_op(step, rank, op))  # type: ignore[typeddict-item]
    target = FindingTarget(step=step, rank=rank, node=as_int(node.get("id"), -1))
    if op:
        target["op"] = as_int(op.get("id"), -1)
    outside = op and node.get("module") == "" and "outside_model" in g.flags(op)  # the loss's node: in no module
    if node.get("module") is not None and not outside:
        target["module"] = str(node.get("module"))
    return target


def _first_culprit(run: Run, bad_steps: set[int]) -> tuple[dict[str, Any], dict[str, Any], int, str | None]:
    """Where the first captured non-finite step's values began (``origin``), its step, and the
    parameter the op reads (if it reads one and is no backward node's)."""
    loss_bad = {step for step, ev in run.step_events() if loss_nonfinite(ev)}
    for step, graph in run.all_graphs():
        if step not in bad_steps:
            continue
        op, node = origin(graph, step in loss_bad)
        if op and not node and step > min(bad_steps):
            # a step after the first non-finite one: the parameters its updates wrote NaN into
            # feed the chain wherever they are read, which may be after an op of its own
            carried = _carrier(graph, _chain(graph, step in loss_bad), _updated_nonfinite(run, step))
            op = carried or op
        if op or node:
            return op, node, step, None if node else _param_input(graph, op)
    return {}, {}, -1, None


def _updated_nonfinite(run: Run, before: int) -> set[str]:
    """The parameters whose gradients were NaN/Inf on a step before ``before`` that the
    GradScaler did not skip: its optimizer.step() wrote them in."""
    return {run.param_name(i) for step, ev in run.step_events() if step < before and not scaler_skipped(ev)
            for i in _bad_params(ev)}


def _origin_unknown(full: bool) -> str:
    """Why no op is named for the NaN/Inf losses of batches the loop skipped."""
    if full:
        return ("no log/div/exp... op made it (mode='full' checks them every step): look at those batches' data and "
                "the loss's target, and at ops that overflow on their values.")
    return ("the op that made it is not known: ops are checked for NaN on captured steps, from the step after a "
            "non-finite one (mode='full' checks every step's log/div/exp...).")


def _isolated(run: Run, steps: list[int]) -> bool:
    """Each non-finite step is followed by a finite one: no NaN stayed in the model."""
    return bool(steps) and all(s + 1 not in steps and s < run.last_step for s in steps)


def _empty_means(run: Run, steps: list[int]) -> bool:
    """Each non-finite step's loss is NaN (not Inf) and every gradient it recorded is exactly
    zero, none NaN: a mean over nothing, whose gradient is zero (cross_entropy over a batch of
    ignore_index targets only), not an overflow, whose gradients would be NaN too."""
    events = dict(run.step_events())
    for step in steps:
        ev = events.get(step, {})
        loss, norms = as_float(ev.get("loss")), [as_float(v) for v in column(ev, "norm")]
        if loss is None or not math.isnan(loss) or not norms or any(n != 0.0 for n in norms):
            return False
        if any(as_int(v) for v in column(ev, "nan")):
            return False
    return True


def _step_before(run: Run, step: int) -> dict[str, Any] | None:
    """The event of step ``step - 1``, when recorded and its optimizer.step() ran (not skipped)."""
    ev = next((ev for s, ev in run.step_events() if s == step - 1), None)
    return ev if ev is not None and not scaler_skipped(ev) else None


def _bad_lrs(ev: dict[str, Any]) -> list[tuple[int, float]]:
    """(param group, learning rate) of the step's non-finite learning rates."""
    lrs = [(i, as_float(v)) for i, v in enumerate(as_list(ev.get("lr")))]
    return [(i, v) for i, v in lrs if v is not None and not math.isfinite(v)]


def _update_finding(run: Run, steps: list[int], params: dict[int, int], before: dict[str, Any],
                    first_read: str | None, held: list[int]) -> Finding:
    """The parameters went non-finite in optimizer.step() of the (finite) step before the first
    non-finite one: a NaN learning rate, or the optimizer's own update (``held``: the parameters
    the first non-finite step's forward read non-finite)."""
    prev = as_int(before.get("step"), steps[0] - 1)
    lrs = _bad_lrs(before)
    params = {**{i: steps[0] for i in held}, **params}
    if lrs:
        groups = ", ".join(f"param group {i}: lr={v}" for i, v in lrs)
        cause = f"ran with a non-finite learning rate ({groups}) and wrote NaN into the parameters"
    elif held:
        shown = ", ".join(run.param_name(i) for i in held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        cause = f"made the parameters non-finite ({shown} held NaN/Inf when step {steps[0]}'s forward read them)"
    else:
        cause = (f"made the parameters non-finite (step {steps[0]}'s first op reading {first_read!r} already "
                 "yields NaN)")
    ev0 = next((ev for step, ev in run.step_events() if step == steps[0]), {})
    names = [run.param_name(i) for i in sorted(params, key=lambda i: (params[i], i))]
    what = "in the loss" if loss_nonfinite(ev0) else "in the gradients"
    message = (f"NaN/Inf first appeared at step {steps[0]} {what} ({describe_steps(steps, run.last_step)}), but "
               f"step {prev}'s loss and gradients were finite: its optimizer.step() {cause}, which every later "
               "step computes with.")
    targets = [FindingTarget(step=prev, rank=run.rank)]
    targets += [FindingTarget(step=params[i], rank=run.rank, param=run.param_name(i), module=run.param_module(i))
                for i in sorted(params)]
    return make("P4", "error", message, FIX_UPDATE, [prev, *steps], rank=run.rank, targets=targets,
                modules=sorted({run.param_module(i) for i in params}), params=names,
                src=str(before.get("step_src") or "") or None, view="gradients",
                data={"loss": [as_float(ev.get("loss")) for _, ev in run.step_events()],
                      "lr": [as_list(ev.get("lr")) for _, ev in run.step_events()]})


def check(run: Run, settings: Settings) -> list[Finding]:
    steps, params = _nonfinite_steps(run)
    if not steps:
        return _failed_step_finding(run)
    first_op, node, op_step, reads = _first_culprit(run, set(steps))
    before = _step_before(run, steps[0])
    ev0 = next((ev for step, ev in run.step_events() if step == steps[0]), {})
    held = _held_at_forward(ev0)
    diverged = _diverged_before(run, steps[0])
    full = run.session.get("mode") == "full"
    # the batch brought it in: the fix is the data's, the line the forward's
    batch = _bad_batch(_inputs_read(ev0), steps[0]) if diverged is None else None
    data = batch is not None
    forward_src = next((str(f.get("src")) for f in reversed(as_list(ev0.get("forwards")))
                        if isinstance(f, dict) and f.get("src")), None)
    # The step before the first non-finite one was finite; its optimizer.step() is to blame when
    # it used a NaN learning rate, when the first non-finite step's forward read non-finite
    # parameters, or when that step's first NaN op (checked op by op: after a non-finite step,
    # e.g. one the GradScaler skipped) only reads a parameter.
    if before is not None and (_bad_lrs(before) or held or (reads is not None and op_step == steps[0])):
        return [_update_finding(run, steps, params, before, reads, held or [])]
    carried = reads if op_step > steps[0] else None  # the parameter through which a later step's first NaN op got it
    names = [run.param_name(i) for i in sorted(params, key=lambda i: (params[i], i))]
    when = describe_steps(steps, run.last_step)
    if carried is not None:
        # The NaN reached the parameters through optimizer.step() at the first bad step: that
        # later op only reads them, it made nothing (a transpose of a NaN weight is NaN)
        what = "in the loss" if loss_nonfinite(ev0) else (f"in the gradients of {', '.join(names[:3])}" if names else "")
        message = (f"NaN/Inf first appeared at step {steps[0]} in the loss: {batch} "
                   f"optimizer.step() then wrote it into the parameters, so every later step is NaN/Inf too ({when})."
                   if data else
                   f"NaN/Inf first appeared at step {steps[0]} {what}; optimizer.step() wrote it into the parameters, "
                   f"so from step {op_step} the first op reading {carried!r} ({g.op_label(first_op, run)}) already yields "
                   f"NaN: that op is not the cause ({when}). Ops are checked for NaN from the step after a non-finite "
                   f"one, so the op that produced it at step {steps[0]} is not known"
                   + (". " + _made_in_backward(ev0) if _backward_made(ev0) else ": " + _forward_made(ev0, held, before, diverged, full)))
        src = forward_src if data else next((str(s) for s in as_list(ev0.get("backward_src")) if s), None)
        at_params = [FindingTarget(step=params[i], rank=run.rank, param=run.param_name(i), module=run.param_module(i))
                     for i in sorted(params)] or [FindingTarget(step=steps[0], rank=run.rank)]
        return [make("P4", "error", message, FIX_BACKWARD if _backward_made(ev0) else FIX_DATA if data else FIX,
                     steps, rank=run.rank,
                     targets=at_params,
                     modules=sorted({run.param_module(i) for i in params}), params=names, src=src, view="gradients",
                     data={"loss": [as_float(ev.get("loss")) for _, ev in run.step_events()]})]
    fix, empty = FIX, False
    upstream: list[str] = []  # the module whose output had grown huge before the op that overflowed
    if node:
        made = origin_text(run, first_op, node)
        message = (f"NaN/Inf first produced in the backward at step {op_step} by {made}: a finite gradient came "
                   f"in and NaN/Inf went out ({when}).")
        if op_step > steps[0]:  # nodes are checked from the step captured after a non-finite one
            message = (f"NaN/Inf since step {steps[0]}, made in the backward by {made}: a finite gradient came in "
                       f"and NaN/Inf went out at step {op_step}, the first step checked node by node after step "
                       f"{steps[0]} went non-finite ({when}).")
        fix = FIX_BACKWARD
        if _backward_made(ev0) and (hidden := nan_to_num_src(run)) is not None:
            message += (f" But the script calls torch.nan_to_num ({hidden}): a NaN of the forward it replaced "
                        "still comes back as NaN through the ops that made it (their saved values are NaN: "
                        "0 * NaN), so that node may only pass on the forward's NaN.")
            fix = FIX_NAN_TO_NUM + _BACKWARD_AFTER
    elif first_op and data and op_step == steps[0]:
        # the batch was NaN before the forward (a normalisation by a zero std in the loop, QA
        # 51b): the first recorded op that read it is no producer
        message = (f"NaN/Inf first appeared at step {steps[0]}: {batch} {g.op_label(first_op, run)}, the first op "
                   f"that read it, only passed it on ({when}).")
        fix = FIX_DATA
    elif first_op:
        message = f"NaN/Inf first produced by {g.op_label(first_op, run)} at step {op_step} ({when})."
        if "softmax" in str(first_op.get("name", "")):
            fix = FIX_SOFTMAX
        if op_step > steps[0]:  # ops are checked from the step captured after a non-finite one
            message = (f"NaN/Inf since step {steps[0]}, produced by {g.op_label(first_op, run)}: the op was caught at "
                       f"step {op_step}, the first step checked op by op after step {steps[0]} went non-finite "
                       f"({when}).")
        if diverged is not None:  # the op overflowed on what the runaway updates made of the parameters
            message += f" Before it, {diverged}: training diverged, and the values the updates grew made that op overflow."
            fix = FIX_DIVERGING
        elif op_step == steps[0] and (overflow := _overflowed(run, op_step, first_op)) is not None:
            # (QA 51b: an RNN's activations grown to 1e19 squared into Inf by the loss read "log/sqrt/div")
            said, huge, before_model = overflow
            message += f" {said}"
            fix = {"input": FIX_OVERFLOW_INPUT, "target": FIX_OVERFLOW_TARGET}.get(before_model, FIX_OVERFLOW)
            upstream = huge[:1]
    elif names:
        message = f"NaN/Inf in the gradients of {', '.join(names[:3])}{' ...' if len(names) > 3 else ''} ({when})."
        if _backward_made(ev0) and (hidden := nan_to_num_src(run)) is not None:
            message += " " + _hidden_by_nan_to_num(ev0, hidden)
            fix = FIX_NAN_TO_NUM + _BACKWARD_AFTER
        elif _backward_made(ev0):
            message += " " + _made_in_backward(ev0)
            fix = FIX_BACKWARD
        elif loss_nonfinite(ev0):
            message += f" Step {steps[0]}'s loss was NaN/Inf already: " + _forward_made(ev0, held, before, diverged, full)
            fix = FIX_DATA if data else fix
    elif skipped := [v for _, ev in run.step_events() if as_int(ev.get("step"), -1) in steps for v in skipped_nonfinite(ev)]:
        message = (f"The loss was NaN/Inf on {len(skipped)} batch{'es' if len(skipped) > 1 else ''} the loop skipped "
                   f"before backward ({when}): ")
        bad_batch = next((b for step, ev in run.step_events() if step in steps
                          and (b := _bad_batch(_inputs_read(ev), step)) is not None), None)
        if bad_batch is not None:
            message += bad_batch
            fix, data = FIX_DATA, True
        else:
            message += _origin_unknown(full)
    elif discarded := [v for _, ev in run.step_events() if as_int(ev.get("step"), -1) in steps for v in _discarded_nonfinite(ev)]:
        n = len(discarded)
        message = (f"The loss was NaN/Inf on {n} batch{'es' if n > 1 else ''} whose gradients the loop threw away "
                   f"before optimizer.step() ({when}): a caught `clip_grad_norm_(..., error_if_nonfinite=True)`, or "
                   "a zero_grad() before the step, skipped their update, and the model stayed finite; ")
        if data:
            message += str(batch)
            fix = FIX_DATA
        else:
            message += _origin_unknown(full)
    elif _isolated(run, steps) and _empty_means(run, steps) and (hidden := nan_to_num_src(run, grads=True) or batch):
        # the loop replaced the NaN gradients with zeros (p.grad = torch.nan_to_num(p.grad)): not
        # an empty mean, which has no NaN batch and no nan_to_num (QA 53: "0/0" of a NaN sample)
        where = f"torch.nan_to_num at {hidden}" if hidden and hidden != batch else None
        message = (f"The loss is NaN/Inf {when} while every gradient is exactly zero"
                   + (f": the script replaces NaN with zeros ({where}), so those steps' NaN gradients reached "
                      "optimizer.step() as zeros and the model stayed finite" if where else
                      ": NaN gradients were replaced with zeros before optimizer.step(), and the model stayed finite")
                   + ", but the loss you log, and any running average of it, is NaN. The NaN came from those batches' "
                   + (f"forward: {batch}" if data else
                      "forward -- a NaN/Inf in their data, or an op that overflows on their values."))
        fix, empty = FIX_DATA if data and not where else FIX_NAN_TO_NUM, True
    elif _isolated(run, steps) and _empty_means(run, steps):
        message = (f"The loss is NaN with every gradient exactly zero {when}: a mean over no elements (0/0) -- a "
                   "batch whose targets are all ignore_index for cross_entropy / nll_loss (padding only, every "
                   "label masked), or loss[mask].mean() with an empty mask. Its backward sent zeros, so the model "
                   "stayed finite, but the loss you log, and any running average of it, is NaN. (Or the loop "
                   "replaced NaN gradients with zeros, as torch.nan_to_num(p.grad) does: then the NaN came from "
                   "those batches' forward.)")
        fix, empty = FIX_EMPTY, True
    elif _isolated(run, steps):
        message = (f"The loss is NaN/Inf {when}, each time followed by finite steps: the model stayed finite, so "
                   "it came from those batches -- a NaN/Inf in "
                   "their data, or an op that overflows on their values. Which op is not known: ops are checked for "
                   "NaN on the step after a non-finite one, which was finite here.")
        if data:
            message += f" At step {steps[0]}, {batch}"
            fix = FIX_DATA
    else:
        message = f"The loss is NaN/Inf ({when})."
    targets: list[FindingTarget] = []
    if node or first_op:
        targets.append(origin_target(op_step, run.rank, first_op, node))
    targets += [FindingTarget(step=params[i], rank=run.rank, param=run.param_name(i), module=run.param_module(i))
                for i in sorted(params)]
    if not targets:
        targets.append(FindingTarget(step=steps[0], rank=run.rank))
    targets[1:1] = [FindingTarget(step=op_step, rank=run.rank, module=m) for m in upstream]
    if node or first_op:
        at = origin_target(op_step, run.rank, first_op, node)
        modules = [str(at["module"])] if "module" in at else []  # (none for the loss the loop computed)
        modules += [m for m in upstream if m not in modules]
    else:
        modules = sorted({run.param_module(i) for i in params})
    # every non-finite loss one the loop caught and skipped: it guards against them, and the
    # model trained on the other batches -- a warning, still to look into
    at = set(steps)
    # (a step the GradScaler skipped has NaN/Inf gradients, never applied)
    guarded = all(scaler_skipped(ev) or (not _bad_params(ev) and (_backward_losses_finite(ev) or _discarded_nonfinite(ev)))
                  for step, ev in run.step_events() if step in at)
    if guarded and all(scaler_skipped(ev) for step, ev in run.step_events() if step in at):
        # AMP's GradScaler skips a step whose gradients are not finite, by design (QA 46d: an error)
        message += " The GradScaler skipped those steps' updates, as it does, so the parameters stayed finite."
    return [make("P4", "warning" if guarded or empty else "error", message, fix, steps, rank=run.rank, targets=targets, modules=modules,
                 params=names, src=str(first_op.get("src", "")) if first_op else forward_src if data else None,
                 view="graph" if first_op or node else "gradients",
                 data={"loss": [as_float(ev.get("loss")) for _, ev in run.step_events()]})]


HUGE_ACTIVATION = 1e15  # a module output no healthy float32 model makes (they are ~1e-3..1e3): its square is near Inf
# ops that make Inf of finite inputs only by overflowing (a product or a sum too large): not
# NAN_SOURCE_OPS' log of 0 or division by 0
_OVERFLOWS = frozenset(f"aten::{n}{inplace}" for inplace in ("", "_") for n in (
    "addmm", "mm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "einsum", "convolution", "_convolution",
    "conv1d", "conv2d", "conv3d", "add", "mul", "addcmul", "sum",
))  # fmt: skip
# losses that make Inf of finite inputs only by overflowing (a squared error past 1.8e19): not a
# log of 0 (cross_entropy, nll_loss, a hand-written log), a division,
# a mean over nothing (0/0); nor pow, whose exponent (** 0.5 of a negative) is not recorded
_LOSS_OVERFLOWS = frozenset(f"aten::{n}" for n in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "sub",
                                                    "square"))


def _overflowed(run: Run, step: int, op: dict[str, Any]) -> tuple[str, list[str], str] | None:
    """(a sentence, the modules in forward order whose outputs were finite but huge, what was
    huge before the model: "input" the batch, "target" the loss's other input, "" not known) when the op that first made NaN/Inf at ``step`` could only have
    overflowed: the loss (an op outside the model) over module outputs the capture recorded as
    finite and past ``HUGE_ACTIVATION``, or a product/sum (``_OVERFLOWS``) inside the model."""
    ev = next((ev for s, ev in run.step_events() if s == step), {})
    huge: list[tuple[str, float]] = []
    first = ""  # the first module to put out a value: the one that reads the batch
    for a in as_list(ev.get("activations")):
        if not isinstance(a, dict) or not a.get("module"):
            continue
        first = first or str(a["module"])
        if as_int(a.get("nan")) or as_int(a.get("inf")):
            continue
        top = max((abs(v) for v in (as_float(a.get("min")), as_float(a.get("max"))) if v is not None), default=0.0)
        if math.isfinite(top) and top >= HUGE_ACTIVATION:
            huge.append((str(a["module"]), top))
    names = [m for m, _ in huge]
    out = next((a for a in as_list(ev.get("activations")) if isinstance(a, dict) and a.get("module") == ""), None)
    top_out = max((abs(v) for v in (as_float(out.get(k)) for k in ("min", "max")) if v is not None), default=None) \
        if out is not None and not as_int(out.get("nan")) and not as_int(out.get("inf")) else None
    if ("outside_model" in g.flags(op) and str(op.get("name", "")) in _OVERFLOWS | _LOSS_OVERFLOWS
            and top_out is not None and math.isfinite(top_out) and top_out < HUGE_ACTIVATION):
        # the model's own output was small: the loss overflowed on its other input, the target
        # (QA 53: a regression target of ~1e20 read as "blew up upstream, from '0' on")
        return (f"The model's output was finite and not large (up to {top_out:.3g} at step {step}), so the loss "
                "overflowed float32 (largest 3.4e38) on another of its inputs: the target (or whatever else it "
                "reads beside the model's output) held values too large.", [], "target")
    # huge from the first module on: the batch the model was fed, or that module's own weights
    # (QA 53: x * 1e30 fed to the model read "blew up upstream, from '0' on", a fix for the model)
    entry = _huge_input(run, ev, first) if huge and names[0] == first else None
    if "outside_model" in g.flags(op) and huge:
        shown = ", ".join(f"{m!r}{f' ({k})' if (k := run.module_type(m)) else ''} up to {top:.3g}" for m, top in huge[:3])
        said = (f"Its inputs were finite but huge -- the outputs of {shown} at step {step} -- and the loss overflowed "
                "float32 (largest 3.4e38) on them")
        if entry is not None:
            return f"{said}. {entry[0]}", names, "input" if entry[1] else ""
        return f"{said}: the values blew up upstream, from {names[0]!r} on, not in the loss.", names, ""
    if str(op.get("name", "")) in _OVERFLOWS and op.get("module"):
        said = (f"{str(op.get('name'))} makes Inf of finite inputs only by overflowing: the values reaching it "
                "were too large.")
        if entry is not None:
            return f"{said} {entry[0]}", names, "input" if entry[1] else ""
        return said, [], ""
    return None


INPUT_HUGE = 1e10  # a first layer's weight gradient this many times its bias's: the batch's values are that large
INPUT_NORMAL = 1e3  # ... at most this many times: the batch's values are of ordinary size


def _huge_input(run: Run, ev: dict[str, Any], module: str) -> tuple[str, bool] | None:
    """(a sentence, whether the batch itself was huge) when ``module``, the first module of the
    forward, already put out huge values: the batch the model was fed was huge, or the module's
    weights were.  The capture does not record the batch's size, but an affine layer's weight
    gradient is its bias gradient times its input (``G.T @ x`` against ``G.T @ 1``): a ratio past
    ``INPUT_HUGE`` (or an Inf weight gradient beside a finite bias gradient) says the input was
    that large.  None when the module is not the first one."""
    if not module:
        return None
    kind = run.module_type(module)
    at = f"{module!r}{f' ({kind})' if kind else ''}"
    grads = {run.param_name(i).rpartition(".")[2]: i for i in range(len(run.params)) if run.param_module(i) == module}
    norms = column(ev, "norm")
    # the weight that reads the module's input, and its bias: a Linear's or conv's; an RNN's first
    # layer's input-to-hidden pair; MultiheadAttention's input projection
    leaf = next((k for k in ("weight", "weight_ih_l0", "in_proj_weight") if k in grads and k.replace("weight", "bias") in grads),
                None)
    w = as_float(norms[grads[leaf]]) if leaf and grads[leaf] < len(norms) else None
    bias = grads[leaf.replace("weight", "bias")] if leaf else -1
    b = as_float(norms[bias]) if 0 <= bias < len(norms) else None
    if w is not None and b is not None and b > 0 and math.isfinite(b) and (not math.isfinite(w) or w >= INPUT_HUGE * b):
        # (a weight gradient gone NaN/Inf beside a finite bias gradient: its products with the
        # input overflowed -- the input is checked finite before this: ``_bad_batch``)
        wname, bname = run.param_name(grads[str(leaf)]), run.param_name(bias)
        size = (f"overflowed to NaN/Inf while that of {bname} was finite ({b:.2g})" if not math.isfinite(w)
                else f"is {w / b:.2g} times that of {bname}")
        return (f"They were huge from the model's input on: {at}, the first module, already put out huge values, "
                f"and the gradient of {wname} {size} -- a layer's weight gradient is its bias gradient times its "
                "input -- so the batch fed to the model already held huge values: they came in with the data, "
                "not from the model.", True)
    if w is not None and b is not None and b > 0 and math.isfinite(b) and math.isfinite(w) and w <= INPUT_NORMAL * b:
        return (f"The values blew up upstream, from {module!r} on, the first module: the gradient of "
                f"{run.param_name(grads[str(leaf)])} is only {w / b:.2g} times that of {run.param_name(bias)} -- a "
                "layer's weight gradient is its bias gradient times its input -- "
                f"so the batch it read was of ordinary size, and {at}'s own weights made the values huge (their "
                "initialisation, or what changed them).", False)
    return (f"They were huge from the model's input on: {at}, the first module, already put out huge values, so "
            "the batch fed to the model was already huge (its size is not recorded: check x.abs().max()), or "
            f"{at}'s own weights were.", False)


def _failed_step_finding(run: Run) -> list[Finding]:
    """A run whose steps were all finite and that failed in a step before its backward, on a
    NaN/Inf: the loop checked the loss and raised (``if torch.isnan(loss): raise``), or an op
    raised on it.  Where the NaN began, from that step's recorded ops where it has them (full
    mode; a captured step), else what its loss and the values its forward read tell."""
    fev = run.failed_step()
    if fev is None:
        return []
    step = as_int(fev.get("step"))
    loss_bad = bool(skipped_nonfinite(fev))
    graph = run.failed_graph if as_int(run.failed_graph.get("step"), -1) == step else {}
    op = culprit(graph, loss_bad) if graph else None
    if op is None and not loss_bad:
        return []
    error = str(run.end.get("message", "an error"))
    stopped = f"where the run stopped before its backward ({error[:160]})"
    before = _step_before(run, step)
    data = _bad_batch(_inputs_read(fev), step)
    if op is not None:
        message = f"NaN/Inf first produced by {g.op_label(op, run)} at step {step}, {stopped}."
        fix = FIX_SOFTMAX if "softmax" in str(op.get("name", "")) else FIX
        targets = [origin_target(step, run.rank, op, {})]
        modules = [str(targets[0]["module"])] if "module" in targets[0] else []
        src: str | None = str(op.get("src", "")) or None
    else:
        held = _held_at_forward(fev)
        made = _forward_made(fev, held, before, _diverged_before(run, step), run.session.get("mode") == "full")
        message = f"The loss was NaN/Inf at step {step}, {stopped}: {made}"
        fix = FIX_DATA if data is not None else FIX
        targets = [FindingTarget(step=step, rank=run.rank)]
        modules = []
        src = next((str(f.get("src")) for f in reversed(as_list(fev.get("forwards")))
                    if isinstance(f, dict) and f.get("src")), None)
    return [make("P4", "error", message, fix, [step], rank=run.rank, targets=targets, modules=modules, src=src,
                 view="graph" if op is not None else "gradients",
                 data={"loss": [as_float(ev.get("loss")) for _, ev in run.step_events()]})]


def _diverged_before(run: Run, step: int) -> str | None:
    """The loss's blow-up over the steps before ``step`` (norms.loss_blowup), in words."""
    blowup = loss_blowup(run, before=step)
    if blowup is None:
        return _huge_gradients_before(run, step)
    low_step, low, at, loss, lr = blowup
    last = max((v, s) for s, ev in run.step_events() if s < step and (v := as_float(ev.get("loss"))) is not None
               and math.isfinite(v))
    to = f"{last[0]:.3g} at step {last[1]}" if last[1] != at else f"{loss:.3g} at step {at}"
    return (f"the loss had gone from {low:.3g} at step {low_step} to {to}"
            + (f" (learning rate {lr:g})" if lr is not None else ""))


HUGE_GRAD_NORM = 1e4  # a total gradient norm no healthy step reaches (they are ~1e-2..1e2)


def _huge_gradients_before(run: Run, step: int) -> str | None:
    """The step before ``step``, in words, when its gradients were finite but huge (a run that
    explodes from its first step: no loss history to show a blow-up, and P3 has no baseline)."""
    prev = max(((s, ev) for s, ev in run.step_events() if s < step), default=None, key=lambda item: item[0])
    if prev is None:
        return None
    norms = [v for v in (as_float(x) for x in column(prev[1], "norm")) if v is not None]
    total = math.sqrt(sum(v * v for v in norms)) if norms and all(math.isfinite(v) for v in norms) else 0.0
    if total < HUGE_GRAD_NORM:
        return None
    lr = next((as_float(x) for x in as_list(prev[1].get("lr"))), None)
    return (f"the gradients of step {prev[0]} were already huge (total norm {total:.3g}"
            + (f", learning rate {lr:g}" if lr is not None else "") + ")")


def _forward_made(ev: dict[str, Any], held: list[int] | None, before: dict[str, Any] | None,
                  diverged: str | None = None, full: bool = False) -> str:
    """Where a NaN the first non-finite step's loss already had came from, as far as known."""
    if not loss_nonfinite(ev):
        return "check that step's loss inputs, or run its backward under torch.autograd.set_detect_anomaly(True)."
    if diverged is not None:  # the updates ran away: the parameters grew until an op overflowed
        return (f"{diverged}: training diverged, and the parameters the updates grew made an op of the "
                "forward overflow; lower the learning rate, clip the gradients (clip_grad_norm_) or add warm-up.")
    inputs = _inputs_read(ev)
    bad = _bad_batch(inputs, as_int(ev.get("step")))
    if bad is not None:
        return bad
    # mode='full' checks the ops that turn finite values into NaN/Inf (log, div, exp...) on every step
    checked = ("mode='full' checked its log/div/exp... ops and none made it: look at the loss's target "
               "(torch.isfinite(y).all()) and at ops that overflow (exp, pow, a float16 matmul)." if full else
               "record with mode='full', which checks log/div/exp... op by op every step.")
    if held is not None and inputs is not None:  # checked: parameters and inputs finite
        return f"its parameters and its input batch were finite, so an op of its forward or the loss's target made it; {checked}"
    if held is not None:  # checked: its parameters were finite
        head = ("its parameters were finite when its forward ran, so its batch or an op of its forward made it; "
                "check that batch with torch.isfinite")
        return f"{head}; {checked}" if full else f"{head}, or {checked}"
    if before is not None:
        return (f"it came in with that step's batch, or step {as_int(before.get('step'))}'s optimizer.step() "
                "wrote it into the parameters; check both with torch.isfinite.")
    return "check that step's batch with torch.isfinite."


def _backward_made(ev: dict[str, Any]) -> bool:
    """A step whose losses were all recorded finite and whose gradients were not: its backward
    made the NaN/Inf."""
    return bool(as_list(ev.get("losses"))) and _backward_losses_finite(ev) and bool(_bad_params(ev))


def _hidden_by_nan_to_num(ev: dict[str, Any], src: str) -> str:
    """Why a step whose recorded loss was finite and whose gradients were not need not have made
    the NaN in its backward: torch.nan_to_num (at ``src``) turned a NaN loss or output finite."""
    loss = as_float(as_list(ev.get("losses"))[-1]) or 0.0  # _backward_made: the losses are recorded, finite
    return (f"Step {as_int(ev.get('step'), 0)}'s loss was recorded finite ({loss:.4g}), but the script calls "
            f"torch.nan_to_num ({src}), which makes a NaN finite (0 by default): the forward can have made the NaN "
            "and nan_to_num hidden it from the loss -- its backward sends a zero where the value was NaN, and the "
            "ops before it turn that zero back into NaN (0 * NaN) -- so the backward need not be the cause. "
            "Check the step's batch (torch.isfinite(x).all()) and the value before nan_to_num.")


def _made_in_backward(ev: dict[str, Any]) -> str:
    loss = as_float(as_list(ev.get("losses"))[-1]) or 0.0  # _backward_made: the losses are recorded, finite
    return (f"Step {as_int(ev.get('step'), 0)}'s loss was finite ({loss:.4g}), so its backward made the NaN/Inf. "
            "Backward nodes are checked one by one only on captured steps armed for it (default and full mode's "
            "first step, and the step after a non-finite one): run that step's backward under "
            "torch.autograd.set_detect_anomaly(True) to name the first node that returned NaN.")
