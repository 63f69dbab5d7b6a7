"""Per-parameter gradient statistics, batched: one host sync per device per step, none on CUDA.

The L2 norms come from ``torch._foreach_norm``; min/max, non-zero counts, sums and variances
(the "full" statistics, not taken every step: see ``watch``) are one small reduction per tensor
on its own device.  On the CPU each value is read with ``.item()``; elsewhere everything is stacked
into one small tensor and read back with a single ``tolist()`` (on CUDA later, without a
wait).  No gradient is ever copied to the host.  NaN/Inf counts cost a second pass only on
steps whose norms are not finite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch.nn.parameter import is_lazy

from . import _native
from .schema import GradStats


def _nonfinite_counts(g: torch.Tensor) -> tuple[int, int]:
    return int(torch.isnan(g).sum()), int(torch.isinf(g).sum())


def grad_stats(
    params: Sequence[torch.Tensor | None], extra: Sequence[torch.Tensor] = (), full: bool = True
) -> tuple[GradStats, list[float]]:
    """Stats of ``p.grad`` for every parameter (None where absent) and ``extra`` scalars read in
    the same sync.  ``full=False``: norms, NaN/Inf counts and ``none`` only (one pass over the
    gradients instead of four); the other columns are then absent from the result."""
    return GradRead(params, extra, full, defer=False).result()


class GradRead:
    """One step's gradient statistics, launched where the gradients live.

    This runs at every step boundary, so the per-parameter Python work is kept small: one
    stack of all norms (no per-value dtype checks), per-device splitting only with several
    devices, and NaN/Inf are counted only when the norms' sum is not finite.

    With ``defer`` and every tensor on one CUDA device, nothing waits: the stacked values are
    copied to pinned host memory behind a CUDA event and ``result()`` reads them later (the
    next step boundary; the event has completed by then).  No gradient is held meanwhile, so
    a step whose norms are not finite reports NaN/Inf counts as lower bounds (1 for each
    affected parameter); the watch then reads the following steps synchronously, exactly.
    Elsewhere the values are read at once, in one ``tolist()`` per device."""

    DEFER_ON: tuple[str, ...] = ("cuda",)  # device types read later (tests add "cpu" to run that path)

    def __init__(
        self,
        params: Sequence[torch.Tensor | None],
        extra: Sequence[torch.Tensor],
        full: bool,
        defer: bool,
        grads: Sequence[torch.Tensor | None] | None = None,
    ) -> None:
        """``grads``: each parameter's gradient where it is not ``p.grad`` (those
        ``torch.autograd.grad`` returned), None for one that got none."""
        self.n, self.full, self.n_extra = len(params), full, len(extra)
        self.none: list[int] = []
        self.idx: list[int] = []
        self.event: torch.cuda.Event | None = None
        self._result: tuple[GradStats, list[float]] | None = None
        # every gradient a dense CPU one: the columns straight from the parameters in C++
        native: GradStats | None = (
            None if grads is not None or (defer and "cpu" in self.DEFER_ON) else _native.ask("param_grads", list(params), full)
        )
        if native is not None:
            self._result = native, [local(e).item() for e in extra]
            return
        gl: list[torch.Tensor] = []
        numels: list[int] = []
        for i, p in enumerate(params):
            g = None if p is None else p.grad if grads is None else grads[i]
            if g is None:
                # an empty parameter (a rank's empty shard under FSDP's use_orig_params) has no
                # gradient to get
                if p is not None and p.requires_grad and (is_lazy(p) or p.numel() > 0):
                    self.none.append(i)
            elif g.layout == torch.strided and g.numel():  # empty gradients have no stats
                self.idx.append(i)
                gl.append(g if type(g) is _TENSOR else local(g))
                numels.append(g.numel())
            elif g.layout == torch.sparse_coo and g.numel():
                # an Embedding(sparse=True)'s: the values of its coalesced form (duplicate rows
                # summed) give the norm, min/max, non-zeros and sum; the size is the full one
                self.idx.append(i)
                gl.append(g.coalesce().values())
                numels.append(g.numel())
        self.numel = numels if full else []  # for mean/std/zero_frac
        devices = {g.device for g in gl} | {e.device for e in extra}
        dev = next(iter(devices)) if len(devices) == 1 else None
        if defer and dev is not None and dev.type in self.DEFER_ON:
            vals = _stack(*_parts(gl, list(extra), full))
            self.host = vals
            if dev.type == "cuda":
                self.host = torch.empty(vals.shape, dtype=vals.dtype, pin_memory=True)
                self.host.copy_(vals, non_blocking=True)
                self.event = torch.cuda.Event()
                self.event.record()
        else:
            self._result = self._read_now(gl, list(extra), devices)

    @property
    def deferred(self) -> bool:
        return self._result is None

    def result(self) -> tuple[GradStats, list[float]]:
        if self._result is None:
            if self.event is not None:
                self.event.synchronize()  # long done by the next boundary; never waits in steady state
            stats, extras = self._columns()
            k_n = len(self.idx)
            self._fill(stats, extras, list(range(k_n)), list(range(self.n_extra)), self.host.tolist(), None)
            self._result = stats, extras
        return self._result

    def _columns(self) -> tuple[GradStats, list[float]]:
        n = self.n
        stats: GradStats = {"norm": [None] * n, "nan": [0] * n, "inf": [0] * n, "none": self.none}
        if self.full:
            for k in ("max_abs", "mean", "std", "zero_frac"):
                stats[k] = [None] * n  # type: ignore[literal-required]
        return stats, [math.nan] * self.n_extra

    def _fill(
        self,
        stats: GradStats,
        extras: list[float],
        pos_d: list[int],
        ex_d: list[int],
        vals: list[float],
        gl: list[torch.Tensor] | None,
    ) -> None:
        """Columns of the gradients at ``pos_d`` (and extras at ``ex_d``) from their stacked
        values.  NaN/Inf counts of non-finite gradients come from ``gl`` (a second pass) or,
        read later when the gradients are gone (``gl`` None), as lower bounds: 1 each."""
        k_n = len(pos_d)
        norm, idx = stats["norm"], self.idx
        for pos, k in enumerate(pos_d):
            norm[idx[k]] = vals[pos]
        cols = (stats["max_abs"], stats["mean"], stats["std"], stats["zero_frac"]) if self.full else ()  # type: ignore[typeddict-item]

        def full_columns(pos: int, k: int) -> None:
            # min, max, non-zero count, sum and variance follow the norms, k_n values apart
            _full_columns(cols, idx[k], self.numel[k], vals[pos], vals[k_n + pos], vals[2 * k_n + pos],
                          vals[3 * k_n + pos], vals[4 * k_n + pos], vals[5 * k_n + pos])

        if self.full:
            for pos, k in enumerate(pos_d):
                full_columns(pos, k)
        for pos, j in enumerate(ex_d):
            extras[j] = vals[(_FULL_COLS if self.full else 1) * k_n + pos]
        if math.isfinite(math.fsum(vals[:k_n])):
            return
        for pos, k in enumerate(pos_d):
            if not math.isfinite(vals[pos]):
                i = self.idx[k]
                if gl is None:
                    stats["nan"][i], stats["inf"][i] = int(math.isnan(vals[pos])), int(math.isinf(vals[pos]))
                else:
                    stats["nan"][i], stats["inf"][i] = _nonfinite_counts(gl[k])
                    if stats["nan"][i] == stats["inf"][i] == 0:
                        # finite values whose float32 norm overflowed (past ~1e19 each: a run
                        # diverging), read as an Inf gradient: the norm in float64, as in C++
                        vals[pos] = norm[i] = torch.linalg.vector_norm(gl[k], dtype=torch.float64).item()
                        if self.full:
                            full_columns(pos, k)
                        continue
                if self.full:
                    stats["std"][i] = math.nan

    def _read_now(
        self, gl: list[torch.Tensor], extra: list[torch.Tensor], devices: set[torch.device]
    ) -> tuple[GradStats, list[float]]:
        stats, extras = self._columns()
        for dev in devices:
            if len(devices) == 1:
                pos_d, ex_d = list(range(len(gl))), list(range(len(extra)))
            else:
                pos_d = [k for k, g in enumerate(gl) if g.device == dev]
                ex_d = [j for j, e in enumerate(extra) if e.device == dev]
            if dev.type == "cpu":
                # the extras (losses, the scaler's scale) hold one value each: read as they are
                vals = _cpu_values([gl[k] for k in pos_d], self.full) + [local(extra[j]).item() for j in ex_d]
            else:
                norms, rest = _parts([gl[k] for k in pos_d], [extra[j] for j in ex_d], self.full)
                vals = _stack(norms, rest).tolist()  # the one sync per device
            self._fill(stats, extras, pos_d, ex_d, vals, gl)
        return stats, extras


class PiecewiseRead:
    """A step's statistics read in pieces.  An optimizer that steps inside the backward (one
    per parameter, in post-accumulate-grad hooks: PyTorch's "optimizer in backward" recipe)
    clears each gradient right after its step, so each piece is read where its optimizer steps
    and the columns are put together here; ``rest`` is what the backward left (the losses, and
    any parameter no such optimizer stepped)."""

    def __init__(self, rest: GradRead, pieces: list[tuple[list[int], GradRead]]) -> None:
        self.rest, self.pieces = rest, pieces
        self._result: tuple[GradStats, list[float]] | None = None

    @property
    def deferred(self) -> bool:
        return self.rest.deferred or any(read.deferred for _, read in self.pieces)

    def result(self) -> tuple[GradStats, list[float]]:
        if self._result is None:
            stats, extras = self.rest.result()
            cols = cast("dict[str, list[Any]]", stats)
            none = set(stats["none"])
            for where, read in self.pieces:
                part = cast("dict[str, list[Any]]", read.result()[0])
                for k, i in enumerate(where):
                    if part["norm"][k] is None:  # no gradient when its optimizer stepped
                        continue
                    none.discard(i)
                    for c, column in cols.items():
                        if c != "none" and c in part:
                            column[i] = part[c][k]
            stats["none"] = sorted(none)
            self._result = stats, extras
        return self._result


StatsRead = GradRead | PiecewiseRead


def _parts(
    gl: list[torch.Tensor], extra: list[torch.Tensor], full: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The norms of ``gl``, then (with ``full``) min, max, non-zero count, sum and variance
    per tensor and the one value of each ``extra`` tensor: the values ``_fill`` reads, in its
    order."""
    norms: list[torch.Tensor] = _norms(gl) if gl else []
    rest: list[torch.Tensor] = []
    if full and gl:
        # complex gradients by their magnitudes |g| (no order, no real mean): the norm is the
        # same, max |g| and the zero fraction mean what they say, mean and std are of |g|
        gl = [g.abs() if g.is_complex() else g for g in gl]
        # min/max in one pass per tensor (the L-inf and L0 foreach norms are several times
        # slower on CPU); non-zero count and sum per tensor
        mm = [torch.aminmax(g) for g in gl]
        rest += [m.min for m in mm] + [m.max for m in mm]
        rest += [count_nonzero(g) for g in gl]
        rest += [g.sum(dtype=torch.float32) if g.dtype in _LOW else g.sum() for g in gl]  # no fp16 overflow
        rest += [torch.var(g, correction=0) for g in gl]  # see _full_columns
    rest += [local(e).detach().reshape(-1)[0] for e in extra]
    return norms, rest


# On the CPU each reduction is a dispatched op of ~3 us, so a model of hundreds of small
# parameters (repeated layers' weights, biases, norms) pays that per parameter and column:
# 300 parameters cost ~1 ms a step for the norms alone and ~5 ms for the full columns.
# Gradients of one shape and dtype are stacked instead (a copy, which for small tensors costs
# less than the ops it saves) and reduced along dim 1: a few ops per shape.  Large gradients
# keep one op each (their reduction outweighs the dispatch, and a stack would copy them).
_TENSOR = torch.Tensor
_GROUP_NUMEL = 1 << 16  # gradients up to this many elements are stacked with their shape
_GROUP_MIN = 4  # ... when at least this many share it (a stack and its reductions cost ~10 ops)
_GROUP_BYTES = 8 << 20  # at most this much copied per stack


def _by_shape(gl: list[torch.Tensor]) -> tuple[list[list[int]], list[int]]:
    """Positions in ``gl`` to stack (at least _GROUP_MIN small gradients of one shape and
    dtype, in chunks of at most _GROUP_BYTES) and those to reduce one by one, in order.
    Tensor subclasses (a DTensor's shards) are reduced one by one, as they always were."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    single: list[int] = []
    for k, g in enumerate(gl):
        if type(g) is _TENSOR and g.numel() <= _GROUP_NUMEL:
            groups.setdefault((g.shape, g.dtype), []).append(k)
        else:
            single.append(k)
    stacks: list[list[int]] = []
    for (shape, dtype), ks in groups.items():
        if len(ks) < _GROUP_MIN:
            single.extend(ks)
            continue
        per = max(1, _GROUP_BYTES // max(1, shape.numel() * dtype.itemsize))
        stacks += [ks[at : at + per] for at in range(0, len(ks), per)]
    return stacks, sorted(single)


def _cpu_values(gl: list[torch.Tensor], full: bool) -> list[float]:
    """``_parts`` of CPU gradients as the list of values ``_fill`` reads (norms, then with
    ``full`` min, max, non-zero count, sum and variance per gradient)."""
    got: list[float] | None = _native.ask("grads_stats", gl, full)
    if got is not None:  # one pass per gradient in C++, where every gradient allows it
        return got
    k_n = len(gl)
    cols = _FULL_COLS if full else 1
    vals: list[float] = [0.0] * (cols * k_n)
    stacks, single = _by_shape(gl)
    for chunk in stacks:
        rows = _stacked_columns(_rows(gl, chunk), full)
        for r in range(cols):
            row = rows[r]
            for j, k in enumerate(chunk):
                vals[r * k_n + k] = row[j]
    if single:
        norms, rest = _parts([gl[k] for k in single], [], full)
        got = [x.item() for x in norms] + [x.item() for x in rest]
        m = len(single)
        for r in range(cols):
            for j, k in enumerate(single):
                vals[r * k_n + k] = got[r * m + j]
    if full and not math.isfinite(math.fsum(vals[:k_n])):
        for k in range(k_n):  # sign(NaN) is 0, so NaNs went uncounted: count those gradients alone
            if not math.isfinite(vals[k]):
                vals[3 * k_n + k] = float(count_nonzero(gl[k]))
    return vals


def _rows(gl: list[torch.Tensor], chunk: list[int]) -> torch.Tensor:
    """The gradients at ``chunk`` (one shape) stacked, one flattened gradient per row -- of |g|
    for complex gradients, as ``_parts``.  A copy: its caller may overwrite it."""
    st = torch.stack([gl[k] for k in chunk]).flatten(1)
    return st.abs() if st.is_complex() else st


def _stacked_columns(st: torch.Tensor, full: bool) -> list[list[float]]:
    """Per row of ``st`` (``_rows``): the L2 norm, then with ``full`` the min, max, non-zero
    count, sum and variance."""
    wide = torch.float32 if st.dtype in _LOW else None  # no fp16 overflow in sums and counts
    out = [torch.linalg.vector_norm(st, dim=1, dtype=wide)]
    if full:
        # amin/amax (one pass each) and |sign| summed for the count: several times faster on
        # the CPU than aminmax and bool-sum along a dimension
        out += [st.amin(1), st.amax(1), st.sum(1, dtype=wide), st.var(1, correction=0)]
        # the stack is ours: |sign| in place (no two more buffers of its size) for the count
        out.insert(3, st.sign_().abs_().sum(1, dtype=wide))
    f64 = torch.float64
    return torch.stack([t if t.dtype == f64 else t.to(f64) for t in out]).tolist()


def local(t: torch.Tensor) -> torch.Tensor:
    """What this process holds of ``t``: a DTensor's local shard (``to_local()``), else ``t``.
    Statistics of a sharded gradient are its rank's shard's -- reading the whole tensor would be
    a collective inside the user's step, which a rank whose capture differs would hang."""
    if type(t) is _TENSOR:  # most are: no failing attribute lookup (it raises inside, ~1 us)
        return t
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _norms(gl: list[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms of ``gl``; those of fp16/bf16 gradients in float32 (in their own dtype a norm
    keeps 3 significant digits)."""
    low = [k for k, g in enumerate(gl) if g.dtype in _LOW]
    if not low:
        return list(torch._foreach_norm(gl, 2))
    if len(low) == len(gl):
        return list(torch._foreach_norm(gl, 2, dtype=torch.float32))
    out: list[torch.Tensor] = list(gl)  # each replaced by its norm
    high = [k for k, g in enumerate(gl) if g.dtype not in _LOW]
    for ks, dtype in ((high, None), (low, torch.float32)):
        for k, n in zip(ks, torch._foreach_norm([gl[k] for k in ks], 2, dtype=dtype), strict=True):
            out[k] = n
    return out


def _stack(norms: list[torch.Tensor], rest: list[torch.Tensor]) -> torch.Tensor:
    """``norms`` then ``rest`` as one 1-D tensor on their device (one copy to the host reads all)."""
    if not norms and not rest:
        return torch.empty(0)
    # _foreach_norm's multi-tensor kernel (CUDA) returns its results as the elements of one
    # buffer: that buffer is the stack, and stacking would cost a dispatched view per value
    head = _elements_of(norms) if norms else None
    if head is None and norms:
        head = torch.stack(norms)
    # one dtype that holds every value: stack would promote fp16 norms and integer counts
    # to fp16 (counts past 2048 inexact, past 65504 infinite)
    f64 = (head is not None and head.dtype == torch.float64) or any(t.dtype == torch.float64 for t in rest)
    wide = torch.float64 if f64 else torch.float32
    parts = [] if head is None else [head if head.dtype == wide else head.to(wide)]
    if rest:
        parts.append(torch.stack([t if t.dtype == wide else t.to(wide) for t in rest]))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


_LOW = (torch.float16, torch.bfloat16)
_FULL_COLS = 6  # values per gradient with ``full``: norm, min, max, non-zero count, sum, variance


def count_nonzero(t: torch.Tensor) -> torch.Tensor:
    """``torch.count_nonzero(t)``; on the CPU as ``t.bool().sum()``, the same count (NaN counts,
    -0.0 does not): count_nonzero's CPU kernel slows down on data with many zeros -- the
    gradients of ReLU networks -- to 6-8x the time of this (1.3 ms against 0.17 ms for a
    512x512 gradient half zeros, one thread), and is no faster on dense data."""
    return t.bool().sum() if t.device.type == "cpu" else torch.count_nonzero(t)


def _elements_of(ts: list[torch.Tensor]) -> torch.Tensor | None:
    """The contiguous 1-D tensor whose elements, in order, are exactly the 0-d tensors ``ts``
    (views of it), or None."""
    base = ts[0]._base if ts else None
    if base is None or base.dim() != 1 or base.numel() != len(ts) or not base.is_contiguous():
        return None
    p0, size, dtype = base.data_ptr(), base.element_size(), base.dtype
    for i, t in enumerate(ts):
        if t.dim() != 0 or t.dtype != dtype or t.data_ptr() != p0 + i * size:
            return None
    return base


def _full_columns(
    cols: tuple[list[float | None], ...],
    i: int,
    numel: int,
    l2: float,
    lo: float,
    hi: float,
    l0: float,
    s: float,
    var: float,
) -> None:
    """max |g|, mean, std and zero fraction of gradient ``i`` into ``cols`` (those columns, in
    that order) from its norm, min, max, non-zero count, sum and (population) variance."""
    max_abs, mean, std, zero_frac = cols
    max_abs[i] = math.nan if math.isnan(lo) or math.isnan(hi) else max(abs(lo), abs(hi))
    mean[i] = s / numel
    zero_frac[i] = 1.0 - l0 / numel
    if numel > 1 and math.isfinite(l2):
        sq = l2 * l2
        if s * s / numel > 0.5 * sq and math.isfinite(var):
            # |mean| near the root mean square: the sums' formula below would cancel (off by
            # 8% at |mean| = 1000 std in float32), so torch's own variance; it is in the
            # gradient's dtype (3 digits in fp16/bf16, inf past fp16's range: the formula then)
            std[i] = math.sqrt(var * numel / (numel - 1))
        else:
            std[i] = math.sqrt(max(sq - s * s / numel, 0.0) / (numel - 1))
    elif numel == 1:
        std[i] = math.nan


def nonzero_grads(params: Sequence[torch.Tensor | None]) -> tuple[list[int], bool, bool]:
    """Before a step's first backward: (indices with a non-zero .grad, all grads None, all grads zero/None).

    Costs one sync only when some .grad exists (``zero_grad(set_to_none=False)`` or a missing zero_grad).
    """
    native: tuple[list[int], bool, bool] | None = _native.ask("grads_nonzero", list(params))
    if native is not None:  # every present gradient a dense CPU one: checked in C++
        return native
    present: list[int] = []
    gl: list[torch.Tensor] = []
    nonzero: list[int] = []
    seen = False  # any .grad at all
    for i, p in enumerate(params):
        # a frozen parameter's .grad (left from before requires_grad_(False), beside an optimizer
        # rebuilt over the others) is no gradient piling up: no backward adds to it
        g = None if p is None or not p.requires_grad else p.grad
        if g is None:
            continue
        seen = True
        if g.is_sparse:
            # a sparse embedding's gradient (SparseAdam's) holds the rows it was given: rows left
            # in it from the last step are gradients piling up (its zero_grad() forgotten)
            if g._nnz() > 0:
                nonzero.append(i)
        elif g.numel() > 0:
            present.append(i)
            gl.append(g if type(g) is _TENSOR else local(g))
    if not gl:
        return nonzero, not seen, not nonzero
    by_dev: dict[torch.device, list[int]] = {}
    for k, g in enumerate(gl):
        by_dev.setdefault(g.device, []).append(k)
    for dev, ks in by_dev.items():
        on = [gl[k] for k in ks]
        if dev.type == "cpu":  # a zero_grad(set_to_none=False) loop pays this every step
            flags = _cpu_nonzero(on)
        else:
            flags = [v != 0.0 for v in torch.stack(torch._foreach_norm(on, math.inf)).tolist()]
        nonzero.extend(present[k] for k, f in zip(ks, flags, strict=True) if f)
    nonzero.sort()
    return nonzero, False, not nonzero


def _cpu_nonzero(gl: list[torch.Tensor]) -> list[bool]:
    """Whether each CPU gradient holds a non-zero (NaN counts): same-shape gradients stacked
    (``_by_shape``; the L-inf norm is one dispatched op per tensor and slow on the CPU), a
    stack non-zero where its max or min is."""
    got: list[float] | None = _native.ask("grads_stats", gl, True)
    if got is not None:  # non-zero where the max or the min is (NaN != 0)
        k = len(gl)
        return [got[k + i] != 0.0 or got[2 * k + i] != 0.0 for i in range(k)]
    out = [False] * len(gl)
    stacks, single = _by_shape(gl)
    for chunk in stacks:
        st = _rows(gl, chunk)
        hi, lo = st.amax(1).tolist(), st.amin(1).tolist()
        for j, k in enumerate(chunk):
            out[k] = hi[j] != 0.0 or lo[j] != 0.0  # NaN != 0
    if single:
        for k, v in zip(single, torch.stack(torch._foreach_norm([gl[k] for k in single], math.inf)).tolist(), strict=True):
            out[k] = v != 0.0
    return out
