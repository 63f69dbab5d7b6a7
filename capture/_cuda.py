"""The one place that reads the CUDA caching allocator (absent on CPU-only machines)."""

from __future__ import annotations

import torch

_FIELDS = {
    "allocated": "allocated_bytes.all.current",
    "reserved": "reserved_bytes.all.current",
    "active": "active_bytes.all.current",
    "inactive": "inactive_split_bytes.all.current",
    "peak": "allocated_bytes.all.peak",
    "num_allocs": "allocation.all.allocated",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
}


def device_memory(device: torch.device) -> dict[str, int] | None:
    """Allocator figures for ``device``; None off CUDA.  Resets the peak so it is per step."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    stats = torch.cuda.memory_stats(device)
    out = {k: int(stats.get(src, 0)) for k, src in _FIELDS.items()}
    torch.cuda.reset_peak_memory_stats(device)
    return out
