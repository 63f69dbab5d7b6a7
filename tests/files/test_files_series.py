"""``series``: the one StepEvent -> columns conversion shared by ``load()`` and the server."""

from __future__ import annotations

import math

import pytest
import torch

from torchscope.series import grad_series, memory_series, step_summary, total_grad_norm

PARAMS = [{"name": "a.weight", "module": "a"}, {"name": "a.bias", "module": "a"}, {"name": "b.weight", "module": "b"}]


def test_files_memory_series_columns_and_unknowns() -> None:
    steps = [
        {"kind": "step", "step": 0, "t": 1.5, "memory": {"live": 10, "peak": 20, "params": 3, "grads": 4, "optimizer": 5,
                                                         "saved": 6, "temporaries": 7, "other": 8, "kept": 15,
                                                         "device": {"allocated": 11, "reserved": 12}},
         "graphs_alive": 13, "hooks": {"a": 9, "b": 5}},
        {"kind": "step", "step": 1},  # no memory recorded: unknown, not zero
        {"kind": "step", "step": 2, "memory": {"live": True, "peak": "big", "device": "x"}},  # malformed values
    ]
    m = memory_series(steps)
    assert list(m) == ["step", "t", "live", "peak", "params", "grads", "optimizer", "saved", "temporaries", "other",
                       "kept", "allocated", "reserved", "graphs_alive", "hook_bytes"]
    assert m["step"] == [0, 1, 2] and m["t"] == [1.5, None, None]
    assert [m[k][0] for k in ("live", "peak", "params", "grads", "optimizer", "saved", "temporaries", "other", "kept",
                              "allocated", "reserved", "graphs_alive", "hook_bytes")] == [10, 20, 3, 4, 5, 6, 7, 8, 15, 11, 12, 13, 14]
    assert all(m[k][1] is None and m[k][2] is None for k in list(m)[2:])
    assert memory_series([]) == {k: [] for k in m}


def test_files_grad_series_aligned_with_params() -> None:
    steps = [
        {"step": 0, "grads": {"norm": [3.0, 4.0, None], "max_abs": [1.0, 2.0, None], "nan": [0, 0, 0], "inf": [0, 1, 0],
                              "zero_frac": [0.0, 0.5, None], "none": [2]}},
        {"step": 1, "grads": {"norm": [1.0]}},  # short list: padded, never shifted
        {"step": 2},
    ]
    g = grad_series(steps, PARAMS)
    assert g["params"] == ["a.weight", "a.bias", "b.weight"] and g["modules"] == ["a", "a", "b"]
    assert g["steps"] == [0, 1, 2]
    assert g["norm"] == [[3.0, 4.0, None], [1.0, None, None], [None, None, None]]
    assert g["inf"][0] == [0, 1, 0] and g["zero_frac"][0] == [0.0, 0.5, None] and g["max_abs"][0][1] == 2.0
    assert g["none"] == [[2], [], []]
    assert g["total_norm"] == [5.0, 1.0, None]


def test_files_step_summary_scalars() -> None:
    ev = {"kind": "step", "step": 7, "rank": 1, "t": 9.0, "duration_us": 1200, "forward_us": 400, "backward_us": 700,
          "micro_batches": 2, "loss": float("nan"), "graph_captured": True, "graph_signature": "abc",
          "grads": {"norm": [3.0, 4.0], "nan": [1, 2], "inf": [0, 0], "none": [5, 6]},
          "memory": {"live": 100, "peak": 150, "device": {"allocated": 90, "reserved": 128}}}
    s = step_summary(ev)
    assert s["step"] == 7 and s["rank"] == 1 and s["duration_us"] == 1200 and s["micro_batches"] == 2
    assert math.isnan(s["loss"]) and s["grad_norm"] == 5.0
    assert (s["grad_nan"], s["grad_inf"], s["grad_none"]) == (3, 0, 2)
    assert (s["live"], s["peak"], s["allocated"], s["reserved"]) == (100, 150, 90, 128)
    assert s["graph_captured"] is True and s["graph_signature"] == "abc"
    empty = step_summary({"kind": "step", "step": 0})
    assert empty["loss"] is None and empty["grad_norm"] is None and empty["grad_nan"] is None
    assert empty["graph_captured"] is False


def test_files_total_norm_matches_pytorch() -> None:
    """The per-parameter norms the capture records, combined here, equal what PyTorch's
    clip_grad_norm_ computes over the same gradients."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    model(torch.randn(32, 8)).pow(2).mean().backward()
    norms = [float(p.grad.norm()) for p in model.parameters() if p.grad is not None]
    reference = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=float("inf")))
    assert total_grad_norm(norms) == pytest.approx(reference, rel=1e-6)
    params = [{"name": n} for n, _ in model.named_parameters()]
    g = grad_series([{"step": 0, "grads": {"norm": norms}}], params)
    assert g["total_norm"][0] == pytest.approx(reference, rel=1e-6)
    assert g["modules"] == [""] * len(params)
