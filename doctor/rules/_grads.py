"""Per-parameter gradient columns of the step events, shared by the gradient rules (P2, P3, P4)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from ..run import Run, as_dict, as_float, as_int, as_list, notes

# Gradients of these modules are sparse by design (only looked-up rows get one): never "dead".
SPARSE_GRAD_TYPES = frozenset({"Embedding", "EmbeddingBag"})


def column(ev: dict[str, Any], name: str) -> list[Any]:
    return as_list(as_dict(ev.get("grads")).get(name))


def value(col: list[Any], index: int) -> float | None:
    return as_float(col[index]) if 0 <= index < len(col) else None


def floats(ev: dict[str, Any], name: str) -> list[float | None]:
    """A whole column as floats (None where absent or not a number), converted once per step."""
    return [as_float(v) for v in column(ev, name)]


def total_norm(ev: dict[str, Any]) -> float | None:
    """L2 norm over all parameters' gradients, None when no finite gradient was recorded."""
    norms = [v for v in (as_float(x) for x in column(ev, "norm")) if v is not None]
    if not norms or not all(math.isfinite(v) for v in norms):
        return None
    return math.sqrt(sum(v * v for v in norms))


def clipped_from(ev: dict[str, Any]) -> float | None:
    """The total gradient norm ``clip_grad_norm_`` (2-norm) saw this step, before it scaled the
    gradients the statistics were read from; None without clipping."""
    clip = as_dict(as_dict(ev.get("grads")).get("clip"))
    norm = as_float(clip.get("norm"))
    return norm if norm is not None and as_float(clip.get("norm_type")) == 2.0 else None


def norm_made(ev: dict[str, Any]) -> float | None:
    """The total gradient norm the backward made: before clipping where the loop clips."""
    before = clipped_from(ev)
    return before if before is not None and math.isfinite(before) else total_norm(ev)


def norms_made(ev: dict[str, Any]) -> list[float | None]:
    """Each parameter's gradient norm as the backward made it: ``clip_grad_norm_`` scales all
    of them by one factor, undone here."""
    norms = floats(ev, "norm")
    before, after = clipped_from(ev), total_norm(ev)
    if before is None or after is None or after <= 0 or not math.isfinite(before):
        return norms
    k = before / after
    return [v * k if v is not None else None for v in norms]


def scaler_skipped(ev: dict[str, Any]) -> bool:
    """Whether a GradScaler skipped this step's optimizer.step(): its scaled gradients overflowed.
    Their values then say nothing about the model (inf/NaN, or zeros after clip_grad_norm_ saw an
    inf total norm) and were never applied; P14 judges the skips themselves."""
    return as_dict(ev.get("scaler")).get("skipped") is True


def applied_steps(run: Run) -> Iterator[tuple[int, dict[str, Any]]]:
    """``run.step_events()`` without the steps the GradScaler skipped."""
    return ((step, ev) for step, ev in run.step_events() if not scaler_skipped(ev))


def pruned_params(run: Run) -> set[int]:
    """Indices of the parameters ``torch.nn.utils.prune`` masks: it renames ``weight`` to
    ``weight_orig`` and multiplies it by a mask, so its gradient is zero wherever the mask is
    (99% of it at 99% pruning); pruned after ``watch()``, it keeps its name and the capture
    says so (``pruned`` events)."""
    pruned = {as_int(i, -1) for _, ev in run.step_events() for e in notes(ev, "pruned") for i in as_list(e.get("params"))}
    return pruned | {i for i in range(len(run.params)) if run.param_name(i).endswith("_orig")}


def sparse_params(run: Run) -> set[int]:
    """Indices of parameters whose gradients are sparse by design: those of an embedding (only
    looked-up rows get one), a table read by rows, and a pruned one (``pruned_params``)."""
    return pruned_params(run) | run.row_tables | {i for i in range(len(run.params))
                                                  if run.module_type(run.param_module(i)) in SPARSE_GRAD_TYPES}


def numel(run: Run, index: int) -> int:
    params = run.params
    if 0 <= index < len(params):
        n = params[index].get("numel")
        if isinstance(n, int) and n > 0:
            return n
        shape = params[index].get("shape")
        if isinstance(shape, list) and shape:
            return max(1, math.prod(int(s) for s in shape if isinstance(s, int)))
    return 1


def is_matrix(run: Run, index: int) -> bool:
    """Weights (2+ dims) carry the layer-by-layer signal; biases and norms' scales don't."""
    params = run.params
    if 0 <= index < len(params):
        shape = params[index].get("shape")
        return isinstance(shape, list) and len(shape) >= 2
    return True
