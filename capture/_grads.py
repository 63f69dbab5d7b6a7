"""Per-parameter gradient statistics, batched, with one host sync per device per step.

The L2 norms come from ``torch._foreach_norm``; min/max, non-zero counts and sums (the "full"
statistics, not taken every step: see ``watch``) are one small reduction per tensor on its
own device.  Everything is stacked into one small tensor
and read back with a single ``tolist()``; no gradient is ever copied to the host.  NaN/Inf
counts cost a second pass only on steps whose norms are not finite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .schema import GradStats


def _nonfinite_counts(g: torch.Tensor) -> tuple[int, int]:
    return int(torch.isnan(g).sum()), int(torch.isinf(g).sum())


def grad_stats(
    params: Sequence[torch.Tensor | None], extra: Sequence[torch.Tensor] = (), full: bool = True
) -> tuple[GradStats, list[float]]:
    """Stats of ``p.grad`` for every parameter (None where absent) and ``extra`` scalars read in
    the same sync.  ``full=False``: norms, NaN/Inf counts and ``none`` only (one pass over the
    gradients instead of four); the other columns are then absent from the result.

    This runs at every step boundary, so the per-parameter Python work is kept small: one
    stack of all norms (no per-value dtype checks), per-device splitting only with several
    devices, and NaN/Inf are counted only when the norms' sum is not finite."""
    n = len(params)
    norm: list[float | None] = [None] * n
    nan = [0] * n
    inf = [0] * n
    none: list[int] = []
    idx: list[int] = []
    gl: list[torch.Tensor] = []
    for i, p in enumerate(params):
        g = None if p is None else p.grad
        if g is None:
            if p is not None and p.requires_grad:
                none.append(i)
        elif g.layout == torch.strided and g.numel():  # sparse and empty gradients have no stats here
            idx.append(i)
            gl.append(g)
    extras_vals: list[float] = [math.nan] * len(extra)
    cols: dict[str, list[float | None]] = {}
    if full:
        cols = {k: [None] * n for k in ("max_abs", "mean", "std", "zero_frac")}
    devices = {g.device for g in gl} | {e.device for e in extra}
    for dev in devices:
        if len(devices) == 1:
            pos_d, ex_d = list(range(len(gl))), list(range(len(extra)))
        else:
            pos_d = [k for k, g in enumerate(gl) if g.device == dev]
            ex_d = [j for j, e in enumerate(extra) if e.device == dev]
        vals = _read([gl[k] for k in pos_d], [extra[j] for j in ex_d], full)  # the one sync per device
        k_n = len(pos_d)
        for pos, k in enumerate(pos_d):
            i = idx[k]
            l2 = vals[pos]
            norm[i] = l2
            if full:
                _full_columns(cols, i, gl[k].numel(), l2, [vals[r * k_n + pos] for r in range(1, 5)])
        for pos, j in enumerate(ex_d):
            extras_vals[j] = vals[(5 if full else 1) * k_n + pos]
        if not math.isfinite(math.fsum(vals[:k_n])):
            for pos, k in enumerate(pos_d):
                if not math.isfinite(vals[pos]):
                    nan[idx[k]], inf[idx[k]] = _nonfinite_counts(gl[k])
                    if full:
                        cols["std"][idx[k]] = math.nan
    stats: GradStats = {"norm": norm, "nan": nan, "inf": inf, "none": none}
    if full:
        stats.update(cols)  # type: ignore[typeddict-item]
    return stats, extras_vals


def _read(gl: list[torch.Tensor], extra: list[torch.Tensor], full: bool) -> list[float]:
    """Norms (and with ``full`` min, max, non-zero count, sum per tensor) then ``extra``, as floats."""
    parts: list[torch.Tensor] = list(torch._foreach_norm(gl, 2)) if gl else []
    if full and gl:
        # min/max in one pass per tensor (the L-inf and L0 foreach norms are several times
        # slower on CPU); count_nonzero and sum per tensor
        mm = [torch.aminmax(g) for g in gl]
        parts += [m.min for m in mm] + [m.max for m in mm]
        parts += [torch.count_nonzero(g) for g in gl] + [g.sum() for g in gl]
    parts += [e.detach().reshape(-1)[:1].squeeze(0) for e in extra]
    if not parts:
        return []
    try:
        return torch.stack(parts).tolist()  # type: ignore[no-any-return]
    except RuntimeError:  # mixed dtypes (fp16 grads, integer counts): stack as float32
        return torch.stack([x.float() for x in parts]).tolist()  # type: ignore[no-any-return]


def _full_columns(cols: dict[str, list[float | None]], i: int, numel: int, l2: float, rest: list[float]) -> None:
    lo, hi, l0, s = rest
    cols["max_abs"][i] = math.nan if math.isnan(lo) or math.isnan(hi) else max(abs(lo), abs(hi))
    cols["mean"][i] = s / numel
    cols["zero_frac"][i] = 1.0 - l0 / numel
    if numel > 1 and math.isfinite(l2):
        cols["std"][i] = math.sqrt(max(l2 * l2 - s * s / numel, 0.0) / (numel - 1))
    elif numel == 1:
        cols["std"][i] = math.nan


def nonzero_grads(params: Sequence[torch.Tensor | None]) -> tuple[list[int], bool, bool]:
    """Before a step's first backward: (indices with a non-zero .grad, all grads None, all grads zero/None).

    Costs one sync only when some .grad exists (``zero_grad(set_to_none=False)`` or a missing zero_grad).
    """
    present: list[int] = []
    gl: list[torch.Tensor] = []
    for i, p in enumerate(params):
        g = None if p is None else p.grad
        if g is not None and not g.is_sparse and g.numel() > 0:
            present.append(i)
            gl.append(g)
    if not gl:
        return [], True, True
    by_dev: dict[torch.device, list[int]] = {}
    for k, g in enumerate(gl):
        by_dev.setdefault(g.device, []).append(k)
    nonzero: list[int] = []
    for ks in by_dev.values():
        norms = torch.stack(torch._foreach_norm([gl[k] for k in ks], math.inf)).tolist()
        nonzero.extend(present[k] for k, v in zip(ks, norms, strict=True) if v != 0.0)
    nonzero.sort()
    return nonzero, False, not nonzero
