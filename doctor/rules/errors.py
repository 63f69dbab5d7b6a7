"""P8 (in-place op modified a tensor saved for backward) and P10 (backward through a freed graph).

Both usually surface as a RuntimeError from backward(); the capture records its message.  P8
also has a silent form the capture flags on the op ("inplace_saved": e.g. a `.data` write).
"""

from __future__ import annotations

import re
from typing import Any

from torchscope.schema import Finding, FindingTarget

from .. import graph as g
from ..finding import describe_steps, make
from ..run import Run, as_dict, as_int, as_list, errors
from ..settings import Settings

INPLACE_TEXT = "modified by an inplace operation"
FREED_TEXT = "backward through the graph a second time"

FIX_P8 = ("Use the out-of-place form (x = x + 1, torch.relu(x) instead of x.relu_()/ReLU(inplace=True)) on "
          "tensors that backward still needs, or .clone() before modifying; never write through .data.")
FIX_P10 = ("Call backward() once per graph: sum the losses first (loss = a + b; loss.backward()), detach "
           "state carried between batches (hidden = hidden.detach()), or pass retain_graph=True only if you "
           "really must backward twice.")

_NODE_IN_MESSAGE = re.compile(r"output \d+ of (\w+)")


def _node_named(run: Run, steps: list[int], name: str) -> tuple[int, dict[str, Any]]:
    """The node ``name`` in the graph of the first of ``steps`` (the failing ones) that was
    captured, else of any captured step: a healthy step's graph holds the node but not the
    in-place op that broke it."""
    for gstep in dict.fromkeys([*steps, *sorted(run.graphs)]):
        for graph in run.graphs_of(gstep):
            for node in as_list(graph.get("nodes")):
                node_name = str(as_dict(node).get("name", ""))
                # Torch names the forward op ("Sigmoid") or the node ("SigmoidBackward0") in its message.
                if node_name == name or node_name.startswith(f"{name}Backward"):
                    return gstep, node
    return -1, {}


def _overwrote_output(graph: dict[str, Any], node: dict[str, Any]) -> dict[str, Any] | None:
    """The first in-place forward op, after the op that made ``node``, writing a storage that
    op output: what the node saved of its own result (a ReLU's, a sigmoid's) is gone.  (The
    capture cannot read such a node's saved tensors once they are stale, so the silent form's
    flag is not there.)"""
    if "op" not in node:
        return None
    made = as_int(node.get("op"), -1)
    tensors = {as_int(t.get("id"), -1): t for t in as_list(graph.get("tensors")) if isinstance(t, dict)}
    ops = g.ops(graph)
    source = next((op for op in ops if as_int(op.get("id"), -1) == made), None)
    if source is None:
        return None
    storages = {tensors[t].get("storage") for t in (as_int(x, -1) for x in as_list(source.get("outputs")))
                if t in tensors and "storage" in tensors[t]}
    for op in ops:
        if as_int(op.get("id"), -1) <= made or op.get("phase", "forward") != "forward" or "inplace" not in g.flags(op):
            continue
        first = next((as_int(x, -1) for x in as_list(op.get("inputs"))), -1)
        if first in tensors and tensors[first].get("storage") in storages:
            return op
    return None


def check_inplace(run: Run, settings: Settings) -> list[Finding]:
    findings: list[Finding] = []
    crashes = [e for e in errors(run) if INPLACE_TEXT in e.message]
    crash_steps = sorted({e.step for e in crashes})
    if crashes:
        first = crashes[0]
        targets = [FindingTarget(step=first.step, rank=run.rank)]
        match = _NODE_IN_MESSAGE.search(first.message)
        node_name = match.group(1) if match else ""
        gstep, node = _node_named(run, crash_steps, node_name) if node_name else (-1, {})
        if node:
            node_name = str(node.get("name", node_name))
            targets = [FindingTarget(step=gstep, rank=run.rank, node=as_int(node.get("id")),
                                     module=str(node.get("module", "")))]
        # The in-place op itself, when a failing step's graph was captured (the capture flags it,
        # or it wrote the output of the op whose node needed it)
        culprit = next(((s, op) for s in crash_steps for graph in run.graphs_of(s) for op in g.ops(graph)
                        if "inplace_saved" in g.flags(op)), None)
        if culprit is None and node:
            culprit = next(((gstep, op) for graph in run.graphs_of(gstep)
                            if (op := _overwrote_output(graph, node)) is not None), None)
        where = ""
        if culprit:
            targets.insert(0, FindingTarget(**g.target_of_op(culprit[0], run.rank, culprit[1])))  # type: ignore[typeddict-item]
            where = f" ({g.op_label(culprit[1])})"
        needed = f" that {node_name} needed for backward" if node_name else " that backward needed"
        message = (f"backward() failed: an in-place op{where} changed a tensor{needed} "
                   f"({describe_steps(crash_steps, run.last_step)}).")
        src = str(culprit[1].get("src", "")) if culprit else first.src
        findings.append(make("P8", "error", message, FIX_P8, crash_steps, rank=run.rank,
                             targets=targets, modules=[str(node.get("module"))] if node.get("module") else [],
                             src=src or None, data={"error": first.message[:500]}))
    silent: dict[tuple[str, str], tuple[list[int], int, dict[str, Any]]] = {}
    for step, graph in run.all_graphs():
        for op in g.ops(graph):
            if "inplace_saved" in g.flags(op):
                key = (str(op.get("name", "")), str(op.get("src", "")))
                steps, fstep, first_op = silent.get(key, ([], step, op))
                if step not in steps:  # an op run twice a step (two forwards) is one step
                    silent[key] = ([*steps, step], fstep, first_op)
    for (name, src), (steps, fstep, op) in silent.items():
        if fstep in crash_steps:
            continue  # the same event, already reported with the error
        message = (f"{g.op_label(op)} wrote in place into a tensor saved for backward: the gradient is computed "
                   f"from the new values ({describe_steps(steps, run.last_step)}).")
        findings.append(make("P8", "error", message, FIX_P8, steps, rank=run.rank,
                             targets=[FindingTarget(**g.target_of_op(fstep, run.rank, op))],  # type: ignore[typeddict-item]
                             modules=[str(op.get("module"))] if op.get("module") else [], src=src or None,
                             data={"op": name}))
    return findings


def check_double_backward(run: Run, settings: Settings) -> list[Finding]:
    crashes = [e for e in errors(run) if FREED_TEXT in e.message]
    if not crashes:
        return []
    first = crashes[0]
    # The first backward that freed the graph ran at the same step (two backward calls) or the step before
    # (state carried across batches, e.g. an RNN hidden state that was never detached).
    earlier = [s for s, _ in run.step_events() if s < first.step]
    prev = earlier[-1] if earlier else first.step
    prev_src = next((str(as_list(ev.get("backward_src"))[0]) for s, ev in run.step_events()
                     if s == prev and as_list(ev.get("backward_src"))), "")
    freed_by = f" (first freed by the backward at {prev_src})" if prev_src else ""
    message = (f"backward() ran through a graph whose saved tensors were already freed by an earlier backward"
               f"{freed_by} ({describe_steps(sorted({e.step for e in crashes}), run.last_step)}).")
    targets = [FindingTarget(step=first.step, rank=run.rank)]
    graphs = run.graphs_of(prev)
    if graphs and "root" in graphs[0]:
        targets.append(FindingTarget(step=prev, rank=run.rank, node=as_int(graphs[0].get("root"))))
    return [make("P10", "error", message, FIX_P10, [e.step for e in crashes], rank=run.rank, targets=targets,
                 src=first.src or None, data={"error": first.message[:500], "freed_by": prev_src})]
