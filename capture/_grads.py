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
    gradients instead of four); the other columns are then absent from the result."""
    n = len(params)
    norm: list[float | None] = [None] * n
    max_abs: list[float | None] = [None] * n
    mean: list[float | None] = [None] * n
    std: list[float | None] = [None] * n
    zero_frac: list[float | None] = [None] * n
    nan = [0] * n
    inf = [0] * n
    none: list[int] = []
    groups: dict[torch.device, list[int]] = {}
    grads: list[torch.Tensor | None] = [None] * n
    for i, p in enumerate(params):
        g = None if p is None else p.grad
        if g is None:
            if p is not None and p.requires_grad:
                none.append(i)
            continue
        if g.is_sparse or g.numel() == 0:
            continue
        grads[i] = g
        groups.setdefault(g.device, []).append(i)
    extra_by_dev: dict[torch.device, list[int]] = {}
    for j, e in enumerate(extra):
        extra_by_dev.setdefault(e.device, []).append(j)
    extras_vals: list[float] = [math.nan] * len(extra)
    n_rows = 5 if full else 1
    for dev in set(groups) | set(extra_by_dev):
        idx = groups.get(dev, [])
        gl: list[torch.Tensor] = [g for g in (grads[i] for i in idx) if g is not None]
        parts: list[torch.Tensor] = list(torch._foreach_norm(gl, 2)) if gl else []
        if full and gl:
            # min/max in one pass per tensor (the L-inf and L0 foreach norms are several times
            # slower on CPU); count_nonzero and sum per tensor
            mm = [torch.aminmax(g) for g in gl]
            parts += [m.min for m in mm] + [m.max for m in mm]
            parts += [torch.count_nonzero(g) for g in gl] + [g.sum() for g in gl]
        ex_idx = extra_by_dev.get(dev, [])
        parts += [extra[j].detach().reshape(-1)[:1].squeeze(0) for j in ex_idx]
        vals = torch.stack([x.float() if x.dtype != torch.float32 else x for x in parts]).tolist()  # the one sync
        k = len(idx)
        for pos, i in enumerate(idx):
            g = grads[i]
            assert g is not None
            l2 = vals[pos]
            norm[i] = l2
            if full:
                numel = g.numel()
                lo, hi, l0, s = (vals[r * k + pos] for r in range(1, 5))
                max_abs[i] = math.nan if math.isnan(lo) or math.isnan(hi) else max(abs(lo), abs(hi))
                mean[i] = s / numel
                zero_frac[i] = 1.0 - l0 / numel
                if numel > 1 and math.isfinite(l2):
                    std[i] = math.sqrt(max(l2 * l2 - s * s / numel, 0.0) / (numel - 1))
                elif numel == 1:
                    std[i] = math.nan
            if not math.isfinite(l2):
                nan[i], inf[i] = _nonfinite_counts(g)
                std[i] = math.nan
        for pos, j in enumerate(ex_idx):
            extras_vals[j] = vals[n_rows * k + pos]
    stats: GradStats = {"norm": norm, "nan": nan, "inf": inf, "none": none}
    if full:
        stats.update({"max_abs": max_abs, "mean": mean, "std": std, "zero_frac": zero_frac})
    return stats, extras_vals


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
