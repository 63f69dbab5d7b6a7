"""Bytes by category at a step boundary, from the tensors the capture can name.

Storages are deduplicated by data pointer (views and tied weights count once).  ``live`` is
the union of parameters, gradients and optimizer state — "all live storages the capture
knows of" at a boundary (activations saved for backward are freed by then unless a graph
is kept alive, which ``graphs_alive`` reports); on CUDA the allocator's own figures are
added by ``_cuda``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def storages(tensors: Iterable[Any]) -> dict[int, int]:
    """data pointer -> storage bytes for every strided tensor in ``tensors``."""
    out: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            st = t.untyped_storage()
            out[st.data_ptr()] = st.nbytes()
    return out


def optimizer_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    if optimizer is None:
        return []
    out: list[torch.Tensor] = []
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.numel() > 1:  # skip scalar step counters
                out.append(v)
    return out
