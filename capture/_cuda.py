"""The one place that reads the CUDA caching allocator (absent on CPU-only machines)."""

from __future__ import annotations

from typing import Any

import torch

# paths into the allocator's nested stats (``memory_stats()`` names them "allocated_bytes.all.current"...)
_FIELDS = {
    "allocated": ("allocated_bytes", "all", "current"),
    "reserved": ("reserved_bytes", "all", "current"),
    "active": ("active_bytes", "all", "current"),
    "inactive": ("inactive_split_bytes", "all", "current"),
    "peak": ("allocated_bytes", "all", "peak"),
    "num_allocs": ("allocation", "all", "allocated"),
    "num_alloc_retries": ("num_alloc_retries",),
    "num_ooms": ("num_ooms",),
}


def _get(stats: dict[str, Any], path: tuple[str, ...]) -> int:
    v: Any = stats
    for k in path:
        v = v.get(k, 0) if isinstance(v, dict) else 0
    return int(v)


def device_memory(device: torch.device) -> dict[str, int] | None:
    """Allocator figures for ``device``; None off CUDA.  Resets the peak so it is per step."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    # the nested form: ``memory_stats()`` flattens and sorts ~150 entries in Python every call
    stats = torch.cuda.memory_stats_as_nested_dict(device)
    out = {k: _get(stats, path) for k, path in _FIELDS.items()}
    torch.cuda.reset_peak_memory_stats(device)
    return out


class AllocatorHistory:
    """``watch(cuda_history=N)``: the CUDA caching allocator's own history of the run.

    PyTorch records every allocation and free with its Python stack
    (``torch.cuda.memory._record_memory_history``); allocations are labelled with the step,
    and on captured steps with the module, through the allocator's metadata string, so the
    labels live inside PyTorch's own snapshot schema.  At the end the snapshot is written as
    JSON (data only, never pickle) and as the self-contained HTML page of PyTorch's memory
    viewer (``torch.cuda._memory_viz.trace_plot``).  Nothing here runs without CUDA.
    """

    def __init__(self, device: torch.device, max_entries: int) -> None:
        self.on = device.type == "cuda" and torch.cuda.is_available()
        self._label = ""
        if self.on:
            torch.cuda.memory._record_memory_history(max_entries=max_entries)

    def label(self, text: str) -> None:
        if self.on and text != self._label:
            self._label = text
            torch.cuda.memory._set_memory_metadata(text)

    def write(self, base: str) -> list[str]:
        """Stop recording; write ``base``.cuda-memory.json and .html; return the paths written."""
        if not self.on:
            return []
        self.on = False
        import json

        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._set_memory_metadata("")
        torch.cuda.memory._record_memory_history(enabled=None)
        paths = [f"{base}.cuda-memory.json"]
        with open(paths[0], "w") as f:
            json.dump(snap, f, default=str)
        try:
            from torch.cuda._memory_viz import trace_plot

            with open(f"{base}.cuda-memory.html", "w") as f:
                f.write(trace_plot(snap))
            paths.append(f"{base}.cuda-memory.html")
        except Exception:  # the viewer page is a convenience; the JSON is the record
            pass
        return paths
