"""The facts of one rank of a run, gathered once from the event stream for every rule to read.

Rules never see raw events: they ask a `Run` for its steps in order, the captured graph of a
step, a parameter's name and module.  Every accessor tolerates absent fields (a capture that
records less, an older file): a missing fact means no finding, never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from torchscope.schema import capture_off

from .kept import GraphKeeper


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def as_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def notes(ev: dict[str, Any], what: str) -> list[dict[str, Any]]:
    """A step event's in-process facts of one kind (``events[{what: ...}]``)."""
    return [e for e in as_list(ev.get("events")) if isinstance(e, dict) and e.get("what") == what]


def grad_off(x: dict[str, Any]) -> bool:
    """Whether a forward (or an op) ran without autograd: under no_grad or inference_mode."""
    return x.get("grad_mode") is False or x.get("inference_mode") is True


def moved_params(run: Run) -> set[int] | None:
    """The parameters no optimizer trains whose values changed from step 0 to steps 10 and 20
    (the capture's ``frozen_moved``: a momentum copy's, an EMA teacher's); None when the run
    never said (shorter than 11 steps, or a file before the forty-seventh session)."""
    moved: set[int] | None = None
    for _, ev in run.step_events():
        for e in notes(ev, "frozen_moved"):
            moved = (moved or set()) | {as_int(i, -1) for i in as_list(e.get("params"))}
    return moved


def cleared_at(run: Run, steps: list[int]) -> str | None:
    """The first line the capture saw set a watched ``.grad`` to None (or zero it) after a
    backward, on one of ``steps`` (``events[{what: "grads_cleared", src}]``)."""
    at = set(steps)
    return next((str(e["src"]) for s, ev in run.step_events() if s in at for e in notes(ev, "grads_cleared")
                 if e.get("src")), None)


# Events come from JSON, so exact type checks suffice (and exclude bool); these run per parameter per step.
def as_int(value: object, default: int = 0) -> int:
    kind = type(value)
    if kind is int:
        return value  # type: ignore[return-value]
    if kind is float and math.isfinite(value):  # type: ignore[arg-type]
        return int(value)  # type: ignore[call-overload]
    return default


def as_float(value: object) -> float | None:
    kind = type(value)
    if kind is float:
        return value  # type: ignore[return-value]
    return float(value) if kind is int else None  # type: ignore[arg-type]


# Ops that read some rows of a table (Run.row_tables)
_ROW_READS = frozenset(f"aten::{n}" for n in (
    "slice", "index", "index_select", "embedding", "embedding_bag", "_embedding_bag", "gather", "select", "narrow",
    "take", "take_along_dim",
))  # fmt: skip


@dataclass
class Run:
    """Session header, step events (sorted by step), graphs by step, and the logs of one rank."""

    rank: int = 0
    session: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    graphs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    logs: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] = field(default_factory=dict)
    # the ops of the step the run failed in before its backward (capture's GraphEvent.failed):
    # apart from ``graphs``, whose every step has a step event and a backward
    failed_graph: dict[str, Any] = field(default_factory=dict)
    graphs_left_out: int = 0  # a long run's captured graphs not kept in memory (kept.py)

    # ------------------------------------------------------------------ parameters
    # Cached: rules ask per parameter per step, and the server diagnoses long runs repeatedly.
    @cached_property
    def row_tables(self) -> set[int]:
        """Indices of parameters that every forward op of the captured graphs reading them reads
        rows of: tables, sparse by design as an nn.Embedding's weight is (learned positions
        sliced to the sequence's length, a factorisation machine's rows indexed by ids: QA 45a,
        read as a dead branch)."""
        index = {self.param_name(i): i for i in range(len(self.params))}
        rows: dict[int, bool] = {}
        for _, graph in self.all_graphs():
            named = {as_int(t.get("id"), -1): index[t["param"]] for t in as_list(graph.get("tensors"))
                     if isinstance(t, dict) and t.get("param") in index}
            for op in as_list(graph.get("ops")) if named else []:
                if isinstance(op, dict) and op.get("phase", "forward") == "forward":
                    for t in as_list(op.get("inputs")):
                        i = named.get(as_int(t, -1))
                        if i is not None:
                            rows[i] = rows.get(i, True) and str(op.get("name", "")).rstrip("_") in _ROW_READS
        return {i for i, only in rows.items() if only}

    @cached_property
    def model_unreached(self) -> set[int]:
        """Steps whose backward ran and reached none of the trainable parameters: each gradient
        None at step() with no zero_grad() to blame -- the forward computed with copies of the
        parameters (``functional_call(model, {k: v.detach().requires_grad_() ...})``: QA 50a,
        read as a zero_grad() between backward() and step()).  Told by light's walk (an
        ``unreached`` event naming every trainable parameter) or a captured graph whose
        ``AccumulateGrad`` nodes are none of the parameters', and by the steps that built the
        same structure (``graph_signature``) as such a step."""
        n = trainable(self)
        if not n:
            return set()
        seen: dict[str, bool] = {}  # structure -> its walk reached no parameter
        for step, ev in self.step_events():
            sig = ev.get("graph_signature")
            walked = [set(as_list(e.get("params"))) for e in notes(ev, "unreached")]
            graphs = self.graphs_of(step)
            if walked:
                missed = all(len(w) >= n for w in walked)
            elif graphs and all(as_list(g.get("nodes")) for g in graphs):
                missed = not any(isinstance(x, dict) and x.get("param") for g in graphs for x in as_list(g.get("nodes")))
            else:
                continue
            if isinstance(sig, str) and sig:
                seen[sig] = seen.get(sig, True) and missed
        out: set[int] = set()
        for step, ev in self.step_events():
            none = {as_int(i, -1) for i in as_list(as_dict(ev.get("grads")).get("none"))}
            if as_int(ev.get("micro_batches")) > 0 and len(none) >= n and seen.get(str(ev.get("graph_signature"))):
                out.add(step)
        return out

    def cut_before_model(self, step: int, ev: dict[str, Any]) -> bool:
        """Whether no parameter could get a gradient from the step's backward: each ran on a
        leaf loss (``leaf_loss``) or its graph reached none of them (``model_unreached``)."""
        return leaf_loss(ev) or step in self.model_unreached

    @cached_property
    def params(self) -> list[dict[str, Any]]:
        return [p for p in as_list(self.session.get("params")) if isinstance(p, dict)]

    @cached_property
    def _module_types(self) -> dict[str, str]:
        return {str(m.get("path")): str(m.get("type", "")) for m in as_list(self.session.get("modules"))
                if isinstance(m, dict)}

    @cached_property
    def _param_names(self) -> list[str]:
        return [str(p.get("name", f"param[{i}]")) for i, p in enumerate(self.params)]

    @cached_property
    def _param_modules(self) -> list[str]:
        return [str(p.get("module", str(p.get("name", "")).rpartition(".")[0])) for p in self.params]

    def list_siblings(self, index: int) -> list[tuple[list[int], list[int]]]:
        """For each ``ModuleList`` (or numbered ``Sequential``) that parameter ``index`` lies in,
        innermost last: (the parameters of its own member module, the same parameter of the
        other members) -- ``experts.2.0.weight``: (``experts.2.*``, ``experts.N.0.weight``)."""
        parts = self.param_name(index).split(".")
        out: list[tuple[list[int], list[int]]] = []
        for k, part in enumerate(parts):
            if not part.isdigit():
                continue
            head, tail = parts[:k], parts[k + 1:]
            member = [j for j, sp in enumerate(self._split_names) if sp[:k + 1] == parts[:k + 1]]
            same = [j for j, sp in enumerate(self._split_names) if j != index and len(sp) == len(parts)
                    and sp[k].isdigit() and sp[:k] == head and sp[k + 1:] == tail]
            if same:
                out.append((member, same))
        return out

    @cached_property
    def _split_names(self) -> list[list[str]]:
        return [name.split(".") for name in self._param_names]

    def param_name(self, index: int) -> str:
        names = self._param_names
        return names[index] if 0 <= index < len(names) else f"param[{index}]"

    def param_module(self, index: int) -> str:
        modules = self._param_modules
        return modules[index] if 0 <= index < len(modules) else ""

    def module_type(self, path: str) -> str:
        return self._module_types.get(path, "")

    # ------------------------------------------------------------------ steps and graphs
    def step_events(self) -> Iterator[tuple[int, dict[str, Any]]]:
        for ev in self.steps:
            yield as_int(ev.get("step"), -1), ev

    def optimizer_at(self, step: int) -> str:
        """The class of the optimizer whose steps were the run's at ``step``: watch()'s, or one
        the capture followed (``watch(model)`` adopts the first that steps the model's
        parameters, or one that replaced the watched optimizer): ``events[{what: "optimizer"}]``."""
        name = str(self.session.get("optimizer") or "")
        for s, ev in self.step_events():
            if s > step:
                break
            for note in notes(ev, "optimizer"):
                name = str(note.get("optimizer") or name)
        return name

    def forward_events(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """``step_events()``, then the root forwards after the last step (the end event's: an
        evaluation that ends the run), told with the last step -- not those of a run that ended
        with an error: the step they began raised before its backward (its loss, an op of its
        forward), no graph built for nothing."""
        yield from self.step_events()
        if as_list(self.end.get("forwards")) and self.end.get("status") != "error":
            yield max(self.last_step, 0), {"forwards": self.end["forwards"]}

    @staticmethod
    def step_of_forward(step: int, forwards: list[dict[str, Any]], f: dict[str, Any]) -> int:
        """The step a forward that no backward used belongs to: one before the step's first
        trained forward ran after the previous step's optimizer.step() -- an evaluation every
        N steps is that step's, as one after the last step is (the end event's) -- not the
        next one's, whose event holds it."""
        used_at = next((i for i, x in enumerate(forwards) if x.get("backward") is True), len(forwards))
        return step - 1 if step > 0 and f in forwards and forwards.index(f) < used_at < len(forwards) else step

    def failed_step(self) -> dict[str, Any] | None:
        """The step a run that ended with an error failed in before its backward, as a step
        event would have it as far as the end event tells (its forwards, with the loss the loop
        checked, and what they read non-finite); None for a run that did not."""
        if self.end.get("status") != "error" or not as_list(self.end.get("forwards")):
            return None
        return {"step": as_int(self.end.get("steps"), self.last_step + 1), "forwards": self.end["forwards"],
                "events": as_list(self.end.get("events"))}

    @cached_property
    def training_steps(self) -> int:
        """Steps with a backward (a step event without ``micro_batches`` counts): what "every
        N steps" and "most steps" of a call site are measured against."""
        return sum(1 for _, ev in self.step_events() if as_int(ev.get("micro_batches"), 1) > 0)

    @property
    def last_step(self) -> int:
        return as_int(self.steps[-1].get("step"), -1) if self.steps else -1

    def graphs_of(self, step: int) -> list[dict[str, Any]]:
        return self.graphs.get(step, [])

    def all_graphs(self) -> Iterator[tuple[int, dict[str, Any]]]:
        for step in sorted(self.graphs):
            for g in self.graphs[step]:
                yield step, g


def split_by_rank(events: Iterable[dict[str, Any]]) -> list[Run]:
    """Group a (possibly multi-rank, possibly unordered) event stream into one `Run` per rank."""
    runs: dict[int, Run] = {}
    keepers: dict[int, GraphKeeper] = {}  # a long run's graphs are sampled as they come (kept.py)
    for ev in events:
        if not isinstance(ev, dict):
            continue
        rank = as_int(ev.get("rank"), 0)
        run = runs.get(rank)
        if run is None:
            run = runs[rank] = Run(rank=rank)
            keepers[rank] = GraphKeeper(run.graphs)
        kind = ev.get("kind")
        if kind == "session":
            run.session = ev
        elif kind == "step":
            run.steps.append(ev)
            keepers[rank].step(ev, as_int(ev.get("step"), -1))
        elif kind == "graph" and ev.get("failed") is True:
            run.failed_graph = ev
        elif kind == "graph":
            keepers[rank].graph(ev, as_int(ev.get("step"), -1))
        elif kind == "log":
            run.logs.append(ev)
        elif kind == "end":
            run.end = ev
    for rank, run in runs.items():
        run.steps.sort(key=lambda e: as_int(e.get("step"), -1))
        run.graphs_left_out = keepers[rank].dropped
    return [runs[r] for r in sorted(runs)]


@dataclass(frozen=True)
class RunError:
    """An exception the user's script hit in backward (from a step event, a log or the end event)."""

    step: int
    message: str
    src: str


def errors(run: Run) -> list[RunError]:
    out: list[RunError] = []
    for step, ev in run.step_events():
        srcs = [str(s) for s in as_list(ev.get("backward_src"))]
        for msg in as_list(ev.get("backward_errors")):
            out.append(RunError(step, str(msg), srcs[-1] if srcs else ""))
    for log in run.logs:
        # (a part of the capture that turned itself off is torchscope's error, not the loop's)
        if log.get("level") == "error" and log.get("message") and capture_off(log) is None:
            out.append(RunError(as_int(log.get("step"), run.last_step + 1), str(log["message"]), ""))
    if run.end.get("status") == "error" and run.end.get("message"):
        message = str(run.end["message"])
        # a backward error the script did not catch ends the run with it ("RuntimeError: ..."):
        # one crash, already counted at its step
        if not any(e.message[:200] in message for e in out):
            out.append(RunError(as_int(run.end.get("steps"), run.last_step + 1), message, ""))
    return out


def leaf_loss(ev: dict[str, Any]) -> bool:
    """Whether every backward() of the step was called on a leaf -- a loss made anew from a number
    (``torch.tensor(loss.item(), requires_grad=True)``): the graph was cut before it (P1), so its
    empty gradients are no zero_grad() misplaced (P5), its forward no evaluation (P6)."""
    roots = as_list(ev.get("backward_roots"))
    return bool(roots) and all(r == "None" for r in roots)


def capture_hint(run: Run, what: str = "the first step") -> str:
    """The parenthesis after "a captured graph tells ...": for a light run (or one that does
    not say its mode), how to get one; a default or full run had its graphs captured, and none
    shows it (a compiled forward, whose ops are not recorded) -- not told to use its own mode."""
    settings = as_dict(run.session.get("settings"))
    if (settings.get("mode") or run.session.get("mode")) in ("default", "full"):
        return "(none of this run's captured graphs shows it)"
    return f"(mode='default' captures {what})"


def trainable(run: Run) -> int:
    """How many parameters require grad (from the session header, else from the grad stats' width)."""
    params = run.params
    if params:
        return sum(1 for p in params if p.get("requires_grad", True))
    for _, ev in run.step_events():
        norms = as_list(as_dict(ev.get("grads")).get("norm"))
        if norms:
            return len(norms)
    return 0
