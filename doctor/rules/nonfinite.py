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


def _scaler_skipped(ev: dict[str, Any]) -> bool:
    # A GradScaler skips steps whose scaled gradients overflowed: that is its job, judged by P14.
    return as_dict(ev.get("scaler")).get("skipped") is True


def check(run: Run, settings: Settings) -> list[Finding]:
    steps: list[int] = []
    params: dict[int, int] = {}  # param index -> first step with NaN/Inf in its gradient
    for step, ev in run.step_events():
        bad = [] if _scaler_skipped(ev) else _bad_params(ev)
        nan_ops = any("nan" in g.flags(op) for gr in run.graphs_of(step) for op in g.ops(gr))
        if _loss_bad(ev) or bad or nan_ops:
            steps.append(step)
            for i in bad:
                params.setdefault(i, step)
    if not steps:
        return []
    first_op: dict[str, Any] = {}
    op_step = -1
    for step, graph in run.all_graphs():
        hit = next((op for op in g.ops(graph) if "nan" in g.flags(op)), None)
        if hit is not None:
            first_op, op_step = hit, step
            break
    names = [run.param_name(i) for i in sorted(params, key=lambda i: (params[i], i))]
    when = describe_steps(steps, run.last_step)
    if first_op:
        message = f"NaN/Inf first produced by {g.op_label(first_op)} at step {op_step} ({when})."
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
