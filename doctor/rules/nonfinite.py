"""P4: NaN or Inf in the loss, a forward output or a gradient; points at the first op that produced it."""

from __future__ import annotations

import math
from typing import Any

from torchscope.schema import Finding, FindingTarget

from .. import graph as g
from ..finding import describe_steps, make
from ..run import Run, as_dict, as_float, as_int, as_list
from ..settings import Settings
from ._grads import column

FIX = ("Look at the first op that produced it: log/sqrt/div of zero or negatives (add an eps, clamp), exp "
       "overflow (use log-softmax / logsumexp), a learning rate too high (lower it, clip gradients), or bad "
       "input data (check the batch for NaN).")


def _loss_bad(ev: dict[str, Any]) -> bool:
    values = [as_float(ev.get("loss")), *(as_float(v) for v in as_list(ev.get("losses")))]
    return any(v is not None and not math.isfinite(v) for v in values)


def _bad_params(ev: dict[str, Any]) -> list[int]:
    nan, inf = column(ev, "nan"), column(ev, "inf")
    if not any(nan) and not any(inf):  # the usual case: all zeros
        return []
    return [i for i in range(max(len(nan), len(inf)))
            if as_int(nan[i] if i < len(nan) else 0) > 0 or as_int(inf[i] if i < len(inf) else 0) > 0]


def _param_input(graph: dict[str, Any], op: dict[str, Any]) -> str | None:
    """The parameter among ``op``'s inputs, if one is."""
    params = {as_int(t.get("id"), -1): t["param"] for t in as_list(graph.get("tensors"))
              if isinstance(t, dict) and isinstance(t.get("param"), str)}
    return next((params[i] for i in (as_int(x, -1) for x in as_list(op.get("inputs"))) if i in params), None)


def reaching(graph: dict[str, Any]) -> list[dict[str, Any]]:
    """The ops flagged non-finite whose non-finite values reach the end of the recorded passes
    (an op no recorded op reads: the loss, an output, a gradient) through flagged ops only,
    in execution order.  An attention mask of -inf is flagged but absorbed -- the softmax that
    reads it is finite -- so it is no cause of anything."""
    ops = g.ops(graph)
    bad = [op for op in ops if "nan" in g.flags(op)]
    if not bad:
        return []
    readers = g.consumers(ops)
    reach: dict[int, bool] = {}
    for op in reversed(bad):  # a reader runs after the op: its answer is known first
        oid = as_int(op.get("id"), -1)
        fed = [r for t in as_list(op.get("outputs")) for r in readers.get(as_int(t, -1), [])
               if as_int(r.get("id"), -1) > oid]
        reach[oid] = not fed or any(reach.get(as_int(r.get("id"), -1), False) for r in fed)
    return [op for op in bad if reach[as_int(op.get("id"), -1)]]


def _scaler_skipped(ev: dict[str, Any]) -> bool:
    # A GradScaler skips steps whose scaled gradients overflowed: that is its job, judged by P14.
    return as_dict(ev.get("scaler")).get("skipped") is True


def check(run: Run, settings: Settings) -> list[Finding]:
    steps: list[int] = []
    params: dict[int, int] = {}  # param index -> first step with NaN/Inf in its gradient
    for step, ev in run.step_events():
        bad = [] if _scaler_skipped(ev) else _bad_params(ev)
        nan_ops = any(reaching(gr) for gr in run.graphs_of(step))
        if _loss_bad(ev) or bad or nan_ops:
            steps.append(step)
            for i in bad:
                params.setdefault(i, step)
    if not steps:
        return []
    first_op: dict[str, Any] = {}
    op_step = -1
    carried = None  # the parameter through which a later step's first NaN op got it
    for step, graph in run.all_graphs():
        hit = next(iter(reaching(graph)), None)
        if hit is not None:
            first_op, op_step = hit, step
            carried = _param_input(graph, hit) if step > steps[0] else None
            break
    names = [run.param_name(i) for i in sorted(params, key=lambda i: (params[i], i))]
    when = describe_steps(steps, run.last_step)
    if carried is not None:
        # The NaN reached the parameters through optimizer.step() at the first bad step: that
        # later op only reads them, it made nothing (a transpose of a NaN weight is NaN)
        ev0 = next((ev for step, ev in run.step_events() if step == steps[0]), {})
        what = "in the loss" if _loss_bad(ev0) else (f"in the gradients of {', '.join(names[:3])}" if names else "")
        message = (f"NaN/Inf first appeared at step {steps[0]} {what}; optimizer.step() wrote it into the parameters, "
                   f"so from step {op_step} the first op reading {carried!r} ({g.op_label(first_op)}) already yields "
                   f"NaN: that op is not the cause ({when}). Ops are checked for NaN from the step after a non-finite "
                   f"one, so the op that produced it at step {steps[0]} is not known: check that step's loss "
                   f"inputs, or run its backward under torch.autograd.set_detect_anomaly(True).")
        src = next((str(s) for s in as_list(ev0.get("backward_src")) if s), None)
        at_params = [FindingTarget(step=params[i], rank=run.rank, param=run.param_name(i), module=run.param_module(i))
                     for i in sorted(params)] or [FindingTarget(step=steps[0], rank=run.rank)]
        return [make("P4", "error", message, FIX, steps, rank=run.rank, targets=at_params,
                     modules=sorted({run.param_module(i) for i in params}), params=names, src=src, view="gradients",
                     data={"loss": [as_float(ev.get("loss")) for _, ev in run.step_events()]})]
    if first_op:
        message = f"NaN/Inf first produced by {g.op_label(first_op)} at step {op_step} ({when})."
        if op_step > steps[0]:  # ops are checked from the step captured after a non-finite one
            message = (f"NaN/Inf since step {steps[0]}, produced by {g.op_label(first_op)}: the op was caught at "
                       f"step {op_step}, the first step checked op by op after step {steps[0]} went non-finite "
                       f"({when}).")
    elif names:
        message = f"NaN/Inf in the gradients of {', '.join(names[:3])}{' ...' if len(names) > 3 else ''} ({when})."
    else:
        message = f"The loss is NaN/Inf ({when})."
    targets: list[FindingTarget] = []
    if first_op:
        targets.append(FindingTarget(**g.target_of_op(op_step, run.rank, first_op)))  # type: ignore[typeddict-item]
    targets += [FindingTarget(step=params[i], rank=run.rank, param=run.param_name(i), module=run.param_module(i))
                for i in sorted(params)]
    if not targets:
        targets.append(FindingTarget(step=steps[0], rank=run.rank))
    modules = sorted({str(first_op.get("module", ""))} if first_op else {run.param_module(i) for i in params})
    return [make("P4", "error", message, FIX, steps, rank=run.rank, targets=targets, modules=modules,
                 params=names, src=str(first_op.get("src", "")) if first_op else None,
                 view="graph" if first_op else "gradients",
                 data={"loss": [as_float(ev.get("loss")) for _, ev in run.step_events()]})]
