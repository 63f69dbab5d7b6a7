"""StepEvents -> columnar series: the one place both ``torchscope.load()`` and the server use.

A chart wants one array per quantity (``live[i]`` is the live bytes of ``step[i]``), while the
file and the wire carry one record per step.  Turning one into the other lives here so that a
notebook and the dashboard can never disagree about what "peak" or "total grad norm" means.
Standard library only (imported inside the training process's package).

Every function takes plain dicts as they come out of ``json.loads`` and tolerates absent
optional fields: an unknown value is ``None`` in the columns, never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# MemoryStats keys copied as they are; "allocated"/"reserved" come from the CUDA allocator view.
_MEMORY_KEYS = ("live", "peak", "params", "grads", "optimizer", "saved", "temporaries", "other")
_DEVICE_KEYS = ("allocated", "reserved")
_GRAD_LISTS = ("norm", "max_abs", "nan", "inf", "zero_frac")


def _int_or_none(value: Any) -> int | None:
    # bool is an int subclass; a True where bytes belong is a bad record, not 1 byte
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num_or_none(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def _as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _aligned(values: Any, n: int) -> list[Any]:
    """A per-parameter list padded/cut to ``n`` entries (None where unknown)."""
    if not isinstance(values, list):
        return [None] * n
    out = [_num_or_none(v) for v in values[:n]]
    out.extend([None] * (n - len(out)))
    return out


def total_grad_norm(norms: Iterable[Any]) -> float | None:
    """L2 norm over all parameters (what ``clip_grad_norm_`` reports); None when no grads."""
    total = 0.0
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


def memory_series(steps: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Columns ``step, t, live, peak, params, grads, optimizer, saved, temporaries, other,
    allocated, reserved``; one entry per step event, in the order given."""
    cols: dict[str, list[Any]] = {k: [] for k in ("step", "t", *_MEMORY_KEYS, *_DEVICE_KEYS)}
    for ev in steps:
        mem = _as_mapping(ev.get("memory"))
        dev = _as_mapping(mem.get("device"))
        cols["step"].append(_int_or_none(ev.get("step")))
        cols["t"].append(_num_or_none(ev.get("t")))
        for k in _MEMORY_KEYS:
            cols[k].append(_int_or_none(mem.get(k)))
        for k in _DEVICE_KEYS:
            cols[k].append(_int_or_none(dev.get(k)))
    return cols


def grad_series(steps: Sequence[Mapping[str, Any]], params: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-step gradient statistics aligned with the session's parameter list.

    Returns ``params`` (names), ``modules`` (owning module of each), ``steps``, and per step:
    ``norm``, ``max_abs``, ``nan``, ``inf``, ``zero_frac`` (each a list aligned with
    ``params``), ``none`` (indices whose ``.grad`` was None) and ``total_norm``.
    """
    names = [str(p.get("name", f"param{i}")) for i, p in enumerate(params)]
    modules = [str(p.get("module", "")) for p in params]
    n = len(names)
    out: dict[str, Any] = {"params": names, "modules": modules, "steps": [], "none": [], "total_norm": []}
    for k in _GRAD_LISTS:
        out[k] = []
    for ev in steps:
        grads = _as_mapping(ev.get("grads"))
        out["steps"].append(_int_or_none(ev.get("step")))
        for k in _GRAD_LISTS:
            out[k].append(_aligned(grads.get(k), n))
        none = grads.get("none")
        out["none"].append([i for i in none if _int_or_none(i) is not None] if isinstance(none, list) else [])
        out["total_norm"].append(total_grad_norm(out["norm"][-1]))
    return out


def step_summary(ev: Mapping[str, Any]) -> dict[str, Any]:
    """Scalar columns of one step (what a store keeps per row for fast charts and filters)."""
    mem = _as_mapping(ev.get("memory"))
    dev = _as_mapping(mem.get("device"))
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
        "live": _int_or_none(mem.get("live")),
        "peak": _int_or_none(mem.get("peak")),
        "allocated": _int_or_none(dev.get("allocated")),
        "reserved": _int_or_none(dev.get("reserved")),
        "grad_norm": total_grad_norm(norm if isinstance(norm := grads.get("norm"), list) else ()),
        "grad_nan": _sum_ints(grads.get("nan")),
        "grad_inf": _sum_ints(grads.get("inf")),
        "grad_none": len(none) if isinstance(none, list) else None,
        "graph_captured": bool(ev.get("graph_captured", False)),
        "graph_signature": ev.get("graph_signature") if isinstance(ev.get("graph_signature"), str) else None,
    }
