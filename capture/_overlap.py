"""Whether an in-place write reaches bytes a graph node saved (P8's silent form).

Sharing a storage is not enough: torch's own kernels write disjoint parts of one storage
through views autograd does not track (a GRU cell adds into and ``sigmoid_``s the gate chunks
of one ``unsafe_chunk``ed matrix, each chunk strided across its rows), and only a write to the
bytes a node saved changes its gradient.  Regions are compared element by element on a byte
mask of the span they cover, so interleaved strided views are told apart; a span over
``_MASK_LIMIT`` bytes is taken as overlapping when the spans do (a rare, conservative answer).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# (byte offset in the storage, sizes, strides in bytes, element size)
Region = tuple[int, tuple[int, ...], tuple[int, ...], int]
_MASK_LIMIT = 1 << 24  # bytes of mask per comparison


def region(offset: int, sizes: Sequence[int], strides: Sequence[int], itemsize: int) -> Region:
    """The region of a tensor given in elements, as a storage's bytes."""
    return offset * itemsize, tuple(sizes), tuple(s * itemsize for s in strides), itemsize


def itemsize(dtype: str) -> int:
    """Bytes of one element of a dtype named as the events name it ("float32")."""
    size = _itemsizes.get(dtype)
    if size is None:
        dt = getattr(torch, dtype, None)
        size = _itemsizes[dtype] = dt.itemsize if isinstance(dt, torch.dtype) else 1  # no tensor made: no op
    return size


_itemsizes: dict[str, int] = {}


def _span(r: Region) -> tuple[int, int]:
    """[first byte, past the last byte) of the region (torch strides are never negative)."""
    off, sizes, strides, item = r
    if any(n == 0 for n in sizes):
        return off, off
    return off, off + item + sum((n - 1) * s for n, s in zip(sizes, strides, strict=True))


def overlaps(a: Region, b: Region) -> bool:
    (alo, ahi), (blo, bhi) = _span(a), _span(b)
    if ahi <= blo or bhi <= alo:
        return False
    lo, hi = min(alo, blo), max(ahi, bhi)
    if hi - lo > _MASK_LIMIT:
        return True
    with torch.no_grad(), torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
        mask = torch.zeros(hi - lo, dtype=torch.uint8)
        _view(mask, a, lo).fill_(1)
        return bool(_view(mask, b, lo).any())


def _view(mask: torch.Tensor, r: Region, lo: int) -> torch.Tensor:
    """Every byte of ``r``'s elements, on ``mask`` (byte 0 = storage byte ``lo``)."""
    off, sizes, strides, item = r
    return mask.as_strided((*sizes, item), (*strides, 1), off - lo)


def writes_saved(saved: Sequence[tuple[int, Region]], op: int, target: Region) -> bool:
    """Whether op ``op`` writing ``target`` reaches a region a node of an earlier op saved."""
    return any(first < op and overlaps(r, target) for first, r in saved)
