"""StepEvents -> columnar series: the one place ``torchscope.load()``, the server and the
session file's ``series`` records use.

A chart wants one array per quantity (``live[i]`` is the live bytes of ``step[i]``), while the
file and the wire carry one record per step.  Turning one into the other lives here so that a
notebook and the dashboard can never disagree about what "peak" or "total grad norm" means.
Standard library only (imported inside the training process's package).

Every function takes plain dicts as they come out of ``json.loads`` and tolerates absent
optional fields: an unknown value is ``None`` in the columns, never a guess.

Since format 1.1 a session file also stores the columns themselves (``series`` records, see
docs/session-format.md), so a whole-run series never needs the step events: ``columns(steps,
part)`` is what the capture stores, ``check_columns`` what a reader checks, and
``grads_from_columns`` / ``summary_from_columns`` turn stored columns into the series (the
``memory`` part is the memory series itself).  ``memory_series`` and ``grad_series`` go
through the same columns, so a series read from a file and one computed from its step events
agree by construction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from typing import Any

# MemoryStats keys copied as they are; "allocated"/"reserved" come from the CUDA allocator view.
# kept: saved for backward by earlier steps' graphs still alive (P7)
_MEMORY_KEYS = ("live", "peak", "params", "grads", "optimizer", "saved", "temporaries", "other", "kept")
_DEVICE_KEYS = ("allocated", "reserved")
_MEMORY_COLUMNS = (*_MEMORY_KEYS, *_DEVICE_KEYS)
_GRAD_LISTS = ("norm", "max_abs", "nan", "inf", "zero_frac")
# what the optimizer's step did to each parameter (1.7): on some steps only, None on the others
_UPDATE_LISTS = ("update_ratio", "weight_norm", "update_norm")
_SUMMARY_KEYS = (
    "step",
    "rank",
    "t",
    "duration_us",
    "forward_us",
    "backward_us",
    "micro_batches",
    "loss",
    "live",
    "peak",
    "allocated",
    "reserved",
    "grad_norm",
    "grad_nan",
    "grad_inf",
    "grad_none",
    "graph_captured",
    "graph_signature",
)
# positions in ``_memory_values`` (step_summary runs per step in the server's ingest: no dicts)
_LIVE, _PEAK, _ALLOCATED, _RESERVED = map(_MEMORY_COLUMNS.index, ("live", "peak", "allocated", "reserved"))

# The parts of a series record, each stored in frames of its own so that a reader reads only
# what it asks for (the memory series is small; the per-parameter gradient lists are the
# bulk): the column names, in order.  Each part has ``step``, so each stands alone.
PARTS: dict[str, tuple[str, ...]] = {
    # memory_series; graphs_alive: autograd nodes of earlier steps' graphs still alive (P7);
    # hook_bytes: tensors kept by user forward hooks, all modules together (P13)
    "memory": ("step", "t", *_MEMORY_COLUMNS, "graphs_alive", "hook_bytes"),
    # step_summary's other columns
    "steps": tuple(k for k in _SUMMARY_KEYS if k not in _MEMORY_COLUMNS and k != "t"),
    # per step the step's lists, None where absent
    "grads": ("step", *_GRAD_LISTS, "none", "not_trained", "clip", *_UPDATE_LISTS),
}
# columns added to a part after format 1.1: a record written before them reads as None per row
_LATER: frozenset[str] = frozenset({"not_trained", "graphs_alive", "hook_bytes", "clip", "kept", *_UPDATE_LISTS})

_NONE: type = type(None)
_INTS: frozenset[type] = frozenset({int, _NONE})
_NUMBERS: frozenset[type] = frozenset({int, float, _NONE})
_FLOAT = frozenset({float})
# the JSON types a column may hold, checked when a series record is read back
_COLUMN_TYPES: dict[str, frozenset[type]] = {
    **dict.fromkeys((*PARTS["memory"], *PARTS["steps"]), _INTS),
    "t": _NUMBERS,
    "loss": _NUMBERS,
    "grad_norm": _NUMBERS,
    "graph_captured": frozenset({bool}),
    "graph_signature": frozenset({str, _NONE}),
    "clip": frozenset({dict, _NONE}),  # GradStats.clip (clip_grad_norm_'s norm, max_norm, norm_type)
}
# the grads part's columns hold a list (or None) per step, with items of these types
_ITEM_TYPES: dict[str, frozenset[type]] = {
    **dict.fromkeys((*_GRAD_LISTS, *_UPDATE_LISTS), _NUMBERS),
    **dict.fromkeys(("none", "not_trained"), frozenset({int})),
}


def _int_or_none(value: Any) -> int | None:
    # bool is an int subclass; a True where bytes belong is a bad record, not 1 byte
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num_or_none(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def _as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _numbers(values: Any) -> list[Any] | None:
    """A per-parameter list with every non-number as None; None when the step has no list."""
    if not isinstance(values, list):
        return None
    if set(map(type, values)) <= _NUMBERS:
        return values  # the capture's own lists: one C pass to check, no copy
    return [_num_or_none(v) for v in values]


def _indices(values: Any) -> list[int] | None:
    if not isinstance(values, list):
        return None
    return [i for i in values if _int_or_none(i) is not None]


def _aligned(values: list[Any] | None, n: int) -> list[Any]:
    """A list from ``_numbers`` padded/cut to ``n`` entries (None where unknown)."""
    if values is None:
        return [None] * n
    if len(values) == n:  # the usual case: one copy, no padding
        return values.copy()
    return values[:n] + [None] * (n - len(values))


def total_grad_norm(norms: Iterable[Any]) -> float | None:
    """L2 norm over all parameters (what ``clip_grad_norm_`` reports); None when no grads."""
    total = 0.0
    if type(norms) is list and norms and set(map(type, norms)) == _FLOAT:
        # the usual list of floats (one C pass to check); the same sum, in the same order
        for v in norms:
            total += v * v
        return math.sqrt(total)
    seen = False
    for v in norms:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            total += float(v) * float(v)
            seen = True
    return math.sqrt(total) if seen else None


def _sum_ints(values: Any) -> int | None:
    if not isinstance(values, list):
        return None
    return sum(v for v in values if isinstance(v, int) and not isinstance(v, bool))


# ----------------------------------------------------------------------------- one step event
def _memory_values(ev: Mapping[str, Any]) -> tuple[int | None, ...]:
    """The step's bytes in ``_MEMORY_COLUMNS`` order."""
    mem = _as_mapping(ev.get("memory"))
    dev = _as_mapping(mem.get("device"))
    return (*map(_int_or_none, map(mem.get, _MEMORY_KEYS)), *map(_int_or_none, map(dev.get, _DEVICE_KEYS)))


def _scalars(ev: Mapping[str, Any]) -> dict[str, Any]:
    """``step_summary`` but the memory columns."""
    grads = _as_mapping(ev.get("grads"))
    none = grads.get("none")
    return {
        "step": _int_or_none(ev.get("step")),
        "rank": _int_or_none(ev.get("rank")),
        "t": _num_or_none(ev.get("t")),
        "duration_us": _int_or_none(ev.get("duration_us")),
        "forward_us": _int_or_none(ev.get("forward_us")),
        "backward_us": _int_or_none(ev.get("backward_us")),
        "micro_batches": _int_or_none(ev.get("micro_batches")),
        "loss": _num_or_none(ev.get("loss")),
        "grad_norm": total_grad_norm(norm if isinstance(norm := grads.get("norm"), list) else ()),
        "grad_nan": _sum_ints(grads.get("nan")),
        "grad_inf": _sum_ints(grads.get("inf")),
        "grad_none": len(none) if isinstance(none, list) else None,
        "graph_captured": bool(ev.get("graph_captured", False)),
        "graph_signature": ev.get("graph_signature") if isinstance(ev.get("graph_signature"), str) else None,
    }


def step_summary(ev: Mapping[str, Any]) -> dict[str, Any]:
    """Scalar columns of one step (what a store keeps per row for fast charts and filters)."""
    mem = _memory_values(ev)
    return {
        **_scalars(ev),
        "live": mem[_LIVE],
        "peak": mem[_PEAK],
        "allocated": mem[_ALLOCATED],
        "reserved": mem[_RESERVED],
    }


def _memory_row(ev: Mapping[str, Any]) -> tuple[Any, ...]:
    return (_int_or_none(ev.get("step")), _num_or_none(ev.get("t")), *_memory_values(ev),
            _int_or_none(ev.get("graphs_alive")), _hook_bytes(ev.get("hooks")))


def _hook_bytes(hooks: Any) -> int | None:
    """The bytes of ``StepEvent.hooks`` (module path -> bytes) all together; None where the
    event has no such map (an event of an older capture)."""
    if not isinstance(hooks, Mapping):
        return None
    return sum(v for v in hooks.values() if isinstance(v, int) and not isinstance(v, bool))


def _steps_row(ev: Mapping[str, Any]) -> tuple[Any, ...]:
    scalars = _scalars(ev)
    return tuple(scalars[k] for k in PARTS["steps"])


def _grads_row(ev: Mapping[str, Any]) -> tuple[Any, ...]:
    grads = _as_mapping(ev.get("grads"))
    return (
        _int_or_none(ev.get("step")),
        *map(_numbers, map(grads.get, _GRAD_LISTS)),
        _indices(grads.get("none")),
        _indices(grads.get("not_trained")),
        _clip(grads.get("clip")),
        *map(_numbers, map(grads.get, _UPDATE_LISTS)),
    )


def _clip(value: Any) -> dict[str, float] | None:
    """``GradStats.clip`` with its numbers, or None."""
    if not isinstance(value, Mapping):
        return None
    nums = {k: _num_or_none(value.get(k)) for k in ("norm", "max_norm", "norm_type")}
    return {k: float(v) for k, v in nums.items() if v is not None} if nums["norm"] is not None else None


_ROWS = {"memory": _memory_row, "steps": _steps_row, "grads": _grads_row}


# ----------------------------------------------------------------------------- columns
def columns(steps: Iterable[Mapping[str, Any]], part: str) -> dict[str, list[Any]]:
    """The columns of one part (``PARTS``) over step events, in the order given: what a
    ``series`` record stores."""
    keys = PARTS[part]
    rows = list(map(_ROWS[part], steps))
    if not rows:
        return {k: [] for k in keys}
    return {k: list(col) for k, col in zip(keys, zip(*rows, strict=True), strict=True)}


def concat(pieces: Sequence[Mapping[str, list[Any]]], part: str) -> dict[str, list[Any]]:
    """The columns of consecutive runs of steps, joined."""
    return {k: list(chain.from_iterable(p[k] for p in pieces)) for k in PARTS[part]}


def check_columns(cols: Any, part: str) -> dict[str, list[Any]]:
    """The columns of a ``series`` record read back from a file, checked: every column of
    ``part`` present, all of one length, every value of its JSON type.  ``ValueError`` (one
    line) otherwise.  Columns a newer minor version adds are dropped; ``_LATER`` columns an
    older writer did not write are None in every row."""
    if not isinstance(cols, dict):
        raise ValueError(f"series record ({part}) has no columns")
    if any(k in _LATER and k not in cols for k in PARTS[part]):
        n = len(step) if type(step := cols.get("step")) is list else 0
        cols = {**cols, **{k: [None] * n for k in PARTS[part] if k in _LATER and k not in cols}}
    rows = None
    for k in PARTS[part]:
        col = cols.get(k)
        if type(col) is not list:
            raise ValueError(f"series record ({part}) lacks the column {k!r}")
        if rows is None:
            rows = len(col)
        elif len(col) != rows:
            raise ValueError(f"series record ({part}): column {k!r} has {len(col)} rows, not {rows}")
        if k in _ITEM_TYPES and part == "grads":
            lists = [v for v in col if v is not None]
            ok = (
                set(map(type, lists)) <= {list}
                and set(map(type, chain.from_iterable(lists))) <= _ITEM_TYPES[k]
            )
        else:
            ok = set(map(type, col)) <= _COLUMN_TYPES[k]
        if not ok:
            raise ValueError(f"series record ({part}): column {k!r} holds a value of the wrong type")
    return {k: cols[k] for k in PARTS[part]}


def summary_from_columns(
    memory: Mapping[str, list[Any]], steps: Mapping[str, list[Any]]
) -> dict[str, list[Any]]:
    """``step_summary`` of every step, as columns, from the ``memory`` and ``steps`` parts'
    columns (rows of the same steps)."""
    return {k: list(steps[k] if k in steps else memory[k]) for k in _SUMMARY_KEYS}


def grads_from_columns(grads: Mapping[str, list[Any]], params: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``grad_series`` from the ``grads`` part's columns."""
    names = [str(p.get("name", f"param{i}")) for i, p in enumerate(params)]
    modules = [str(p.get("module", "")) for p in params]
    n = len(names)
    out: dict[str, Any] = {
        "params": names,
        "modules": modules,
        "steps": list(grads["step"]),
        "none": [list(v) if v is not None else [] for v in grads["none"]],
        # parameters not trained that step (no optimizer group holds them): no gradient by design
        "not_trained": [list(v) if v is not None else [] for v in grads["not_trained"]],
        # clip_grad_norm_ of the step (norm before clipping, max_norm, norm_type), None where it did not run
        "clip": list(grads["clip"]),
        "total_norm": [],
    }
    for k in _GRAD_LISTS:
        out[k] = [_aligned(v, n) for v in grads[k]]
    for k in _UPDATE_LISTS:  # read on some steps only: None on the others, not a row of Nones
        out[k] = [None if v is None else _aligned(v, n) for v in grads[k]]
    out["total_norm"] = [total_grad_norm(v) for v in out["norm"]]
    return out


# ----------------------------------------------------------------------------- step events -> series
def memory_series(steps: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Columns ``step, t, live, peak, params, grads, optimizer, saved, temporaries, other,
    allocated, reserved, graphs_alive, hook_bytes``; one entry per step event, in the order given (the
    ``memory`` part)."""
    return columns(steps, "memory")


def grad_series(steps: Sequence[Mapping[str, Any]], params: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-step gradient statistics aligned with the session's parameter list.

    Returns ``params`` (names), ``modules`` (owning module of each), ``steps``, and per step:
    ``norm``, ``max_abs``, ``nan``, ``inf``, ``zero_frac`` (each a list aligned with
    ``params``), ``none`` (indices whose ``.grad`` was None), ``not_trained`` (those of them no
    optimizer trains, or every ``backward(inputs=...)`` left out), ``clip`` (``GradStats.clip``
    or None), ``total_norm`` (of the statistics: after clipping where the loop clips) and
    ``update_ratio``, ``weight_norm``, ``update_norm`` (what the optimizer's step did: a list aligned with
    ``params`` on the steps that read it, None on the others).
    """
    return grads_from_columns(columns(steps, "grads"), params)


def metric_rows(logs: Iterable[Mapping[str, Any]]) -> list[tuple[int, str, float | None]]:
    """``(step, name, value)`` of each number ``torchscope.log()`` recorded (``LogEvent.metrics``),
    in the order logged; a value that is no number (a hand-edited file) is None."""
    rows: list[tuple[int, str, float | None]] = []
    for ev in logs:
        values = ev.get("metrics") if ev.get("kind") == "log" else None
        step = _int_or_none(ev.get("step"))
        if not isinstance(values, Mapping) or step is None:
            continue
        for name, value in values.items():
            number = _num_or_none(value)
            rows.append((step, str(name), None if number is None else float(number)))
    return rows


def metric_series(rows: Iterable[tuple[int, str, float | None]]) -> dict[str, dict[str, list[Any]]]:
    """Each logged name's ``{step, value}`` columns, in step order; of values logged more than
    once for one step, the last."""
    by_name: dict[str, dict[int, float | None]] = {}
    for step, name, value in rows:
        by_name.setdefault(name, {})[step] = value
    return {name: {"step": sorted(vals), "value": [vals[s] for s in sorted(vals)]} for name, vals in by_name.items()}
