"""Which captured graphs of a long run the doctor keeps in memory.

A ``full`` run captures a graph every step: ~300 records (~50 KB of JSON, ~230 KB as Python
objects) a step for a three-layer MLP, many times that for a real model.  Held whole, a
30,000-step MLP run took 6.9 GB and 101 s to diagnose (QA 51a), and the server's doctor child
reads a streamed run the same way.  The rules are written for sampled captures (``default``
mode captures every ``sample_every``-th step, a new structure, the steps around a NaN), so past
a budget of records a long run keeps what such a capture would have: every graph until the
budget is spent, then the graphs of every ``stride``-th step (the stride doubling whenever the
sampled ones outnumber ``SAMPLED_CAP``, so they stay bounded however long the run), of a step
whose graph structure differs from the step before it, and of the steps around anything the
rules look for in a graph -- non-finite values, an error, a failed, retained or cut graph (the
first ``MARKED_CAP`` such steps).  A run under the budget is read whole, as before.
"""

from __future__ import annotations

import math
from typing import Any

BUDGET_RECORDS = 200_000  # ops, nodes, edges and tensors of graphs kept whole (~150 MB)
FIRST_STRIDE = 50  # default mode's sample_every
SAMPLED_CAP = 400
MARKED_CAP = 200
WINDOW = 4  # steps a graph waits for the step events after it before it is judged


def _records(graph: dict[str, Any]) -> int:
    return sum(len(v) for k in ("ops", "nodes", "edges", "tensors", "memory_timeline")
               if isinstance(v := graph.get(k), list))


def _structure(graph: dict[str, Any]) -> int:
    """A fingerprint of the graph's shape: its ops' and nodes' names, in order."""
    ops = graph.get("ops") if isinstance(graph.get("ops"), list) else []
    nodes = graph.get("nodes") if isinstance(graph.get("nodes"), list) else []
    return hash((tuple(o.get("name") for o in ops if isinstance(o, dict)),  # type: ignore[union-attr]
                 tuple(n.get("name") for n in nodes if isinstance(n, dict))))  # type: ignore[union-attr]


def _graph_marked(graph: dict[str, Any]) -> bool:
    if graph.get("retained") is True or graph.get("complete") is False:
        return True
    nodes = graph.get("nodes") if isinstance(graph.get("nodes"), list) else []
    if any(isinstance(n, dict) and n.get("made_nonfinite") for n in nodes):  # type: ignore[union-attr]
        return True
    ops = graph.get("ops") if isinstance(graph.get("ops"), list) else []
    return any(isinstance(o, dict) and "nan" in (o.get("flags") or ()) for o in ops)  # type: ignore[union-attr]


def _finite(value: object) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def step_marked(ev: dict[str, Any]) -> bool:
    """A step event the rules read graphs around: a non-finite loss or gradient, an error, a
    step the GradScaler skipped."""
    if "error" in ev or not _finite(ev.get("loss")) or not all(_finite(v) for v in ev.get("losses") or ()):
        return True
    grads = ev.get("grads") if isinstance(ev.get("grads"), dict) else {}
    if any(isinstance(v, int) and v > 0 for k in ("nan", "inf") for v in (grads.get(k) or ())):  # type: ignore[union-attr]
        return True
    scaler = ev.get("scaler")
    return isinstance(scaler, dict) and scaler.get("skipped") is True


class GraphKeeper:
    """Fed a rank's events in order; ``graphs`` is the step -> graphs map the doctor keeps."""

    def __init__(self, graphs: dict[int, list[dict[str, Any]]]) -> None:
        self.graphs = graphs
        self.dropped = 0  # graph events left out
        self._spent = 0
        self._marked_steps: set[int] = set()  # steps whose step event is marked
        self._pending: list[int] = []  # graph steps past the budget, not yet judged
        self._last_structure: int | None = None
        self._stride = FIRST_STRIDE
        self._sampled: list[int] = []  # steps kept for the stride alone
        self._marked_kept = 0

    def step(self, ev: dict[str, Any], step: int) -> None:
        if step_marked(ev):
            self._marked_steps.add(step)

    def graph(self, ev: dict[str, Any], step: int) -> None:
        self.graphs.setdefault(step, []).append(ev)
        if self._spent < BUDGET_RECORDS:
            self._spent += _records(ev)
            return
        if not self._pending or self._pending[-1] != step:
            self._pending.append(step)
        while self._pending and self._pending[0] < step - WINDOW:
            self._judge(self._pending.pop(0))

    def _judge(self, step: int) -> None:
        graphs = self.graphs.get(step, [])
        if not graphs:
            return
        if self._last_structure is None:  # the first judged: against the last graph kept whole
            before = max((s for s in self.graphs if s < step), default=None)
            self._last_structure = _structure(self.graphs[before][0]) if before is not None else None
        structure = _structure(graphs[0])
        changed = self._last_structure is not None and structure != self._last_structure
        self._last_structure = structure
        marked = any(s in self._marked_steps for s in (step - 1, step, step + 1)) or any(map(_graph_marked, graphs))
        if marked and self._marked_kept < MARKED_CAP:
            self._marked_kept += 1
            return
        if changed:
            return
        if step % self._stride == 0:
            self._sampled.append(step)
            if len(self._sampled) > SAMPLED_CAP:  # a longer stride: every other one of them goes
                self._stride *= 2
                for s in [s for s in self._sampled if s % self._stride]:
                    self._drop(s)
                self._sampled = [s for s in self._sampled if s % self._stride == 0]
            return
        self._drop(step)

    def _drop(self, step: int) -> None:
        self.dropped += len(self.graphs.pop(step, ()))
