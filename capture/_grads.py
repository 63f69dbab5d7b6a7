"""Per-parameter gradient statistics, batched, with one host sync per device per step.

The L2 norms come from ``torch._foreach_norm``; min/max, non-zero counts and sums are one
small reduction per tensor on its own device.  Everything is stacked into one small tensor
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
    params: Sequence[torch.Tensor | None], extra: Sequence[torch.Tensor] = ()
) -> tuple[GradStats, list[float]]:
    """Stats of ``p.grad`` for every parameter (None where absent) and ``extra`` scalars read in the same sync."""
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
    extras_out: list[float] = []
    extra_by_dev: dict[torch.device, list[int]] = {}
    for j, e in enumerate(extra):
        extra_by_dev.setdefault(e.device, []).append(j)
    extras_vals: list[float] = [math.nan] * len(extra)
    for dev in set(groups) | set(extra_by_dev):
        idx = groups.get(dev, [])
        rows: list[torch.Tensor] = []
        if idx:
            gs = [grads[i] for i in idx]
            gl: list[torch.Tensor] = [g for g in gs if g is not None]
            # L2 batched; min/max in one pass per tensor (the L-inf and L0 foreach norms are
            # several times slower on CPU); count_nonzero and sum per tensor
            mm = [torch.aminmax(g) for g in gl]
            parts: list[torch.Tensor] = [
                *torch._foreach_norm(gl, 2),
                *(m.min for m in mm),
                *(m.max for m in mm),
                *(torch.count_nonzero(g) for g in gl),
                *(g.sum() for g in gl),
            ]
            rows.append(torch.stack([p.float() if p.dtype != torch.float32 else p for p in parts]))
        ex_idx = extra_by_dev.get(dev, [])
        flat = torch.cat([r.reshape(-1) for r in rows] + [extra[j].detach().reshape(-1)[:1].float() for j in ex_idx])
        vals = flat.tolist()  # the one host sync for this device
        k = len(idx)
        for pos, i in enumerate(idx):
            g = grads[i]
            assert g is not None
            numel = g.numel()
            l2, lo, hi, l0, s = (vals[r * k + pos] for r in range(5))
            linf = math.nan if math.isnan(lo) or math.isnan(hi) else max(abs(lo), abs(hi))
            norm[i], max_abs[i] = l2, linf
            mean[i] = s / numel
            zero_frac[i] = 1.0 - l0 / numel
            if numel > 1 and math.isfinite(l2):
                var = max(l2 * l2 - s * s / numel, 0.0) / (numel - 1)
                std[i] = math.sqrt(var)
            elif numel <= 1:
                std[i] = math.nan if numel == 1 else None
            if not (math.isfinite(l2) and math.isfinite(linf)):
                nan[i], inf[i] = _nonfinite_counts(g)
                std[i] = math.nan
        for pos, j in enumerate(ex_idx):
            extras_vals[j] = vals[5 * k + pos]
    extras_out = extras_vals
    stats: GradStats = {
        "norm": norm,
        "max_abs": max_abs,
        "mean": mean,
        "std": std,
        "zero_frac": zero_frac,
        "nan": nan,
        "inf": inf,
        "none": none,
    }
    return stats, extras_out


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
