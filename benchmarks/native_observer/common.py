"""Benchmark model/step shared by the scripts here, and Python decoders for the recorder's buffer.

The record layout is documented in recorder.cpp (ENTER / EXIT records, tensor and IValue
encodings).  Two decoders: ``decode`` builds dicts with parent links (what verify.py needs to
relate records to what a dispatch mode sees); ``decode_fast`` turns tensors into tuples and skips
parent tracking, to measure the cheapest reasonable Python decode.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def make(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    # Same 4-layer transformer (d=64, 4 heads, batch 8x32 tokens) as benchmarks/bench_capture.py,
    # so the ratios here are comparable with the dispatch-mode recorder's.
    torch.manual_seed(seed)
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(64, 4, dim_feedforward=256, dropout=0.1, batch_first=True),
        num_layers=4,
        enable_nested_tensor=False,
    )
    model = nn.Sequential(nn.Embedding(256, 64), enc, nn.Linear(64, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randint(0, 256, (8, 32))
    y = torch.randint(0, 256, (256,))
    return model, opt, x, y


def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    opt.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, 256), y)
    loss.backward()
    opt.step()
    return loss


# Record tags (first word of each record) and value tags (first word of each encoded value).
ENTER, EXIT = 1, 2
V_OTHER, V_TENSOR, V_LIST, V_UNDEF, V_OPAQUE, V_INT = 0, 1, 2, 3, 4, 5


def _value(w: list[int], i: int) -> tuple[Any, int]:
    """Decode the value starting at w[i]; return (value, index after it)."""
    k = w[i]
    if k == V_TENSOR:
        nd = w[i + 1]
        j = i + 2
        sizes = w[j : j + nd]
        strides = w[j + nd : j + 2 * nd]
        j += 2 * nd
        d = {
            "sizes": sizes,
            "strides": strides,
            "dtype": w[j],
            "device": (w[j + 1], w[j + 2]),
            "storage": w[j + 3],
            "data_ptr": w[j + 4],
            "nbytes": w[j + 5],
            "offset": w[j + 6],
            "version": w[j + 7],
            "requires_grad": bool(w[j + 8]),
        }
        return d, j + 9
    if k == V_UNDEF:
        return None, i + 1
    if k == V_OPAQUE:
        return {"opaque": True, "dtype": w[i + 1], "device": (w[i + 2], w[i + 3])}, i + 4
    if k == V_LIST:
        n = w[i + 1]
        j = i + 2
        out = []
        for _ in range(n):
            v, j = _value(w, j)
            out.append(v)
        return out, j
    if k == V_OTHER:
        return ("other", w[i + 1]), i + 2
    if k == V_INT:
        return w[i + 1], i + 2
    raise ValueError(f"bad value tag {k} at word {i}")


def decode(buf: torch.Tensor, names: list[str]) -> list[dict[str, Any]]:
    """buf: int64 tensor from drain(); names: list from names().

    Returns one dict per RecordFunction, in enter order, with inputs/outputs/t0/t1 and ``parent``
    (index of the enclosing record on the same thread, -1 at top level).
    """
    w = buf.tolist()
    ops: list[dict[str, Any]] = []
    open_: dict[int, dict[str, Any]] = {}
    stacks: dict[int, list[int]] = {}
    i, n = 0, len(w)
    while i < n:
        tag, ln = w[i], w[i + 1]
        if tag == ENTER:
            _, _, h, nid, oid, seq, tid, t0, mod, scope, nin = w[i : i + 11]
            j = i + 11
            ins = []
            for _ in range(max(nin, 0)):
                v, j = _value(w, j)
                ins.append(v)
            ov = names[oid]
            st = stacks.setdefault(tid, [])
            d = {
                "name": names[nid] + ("." + ov if ov else ""),
                "seq": seq,
                "tid": tid,
                "t0": t0,
                "module": mod,
                "scope": scope,
                "inputs": ins,
                "outputs": None,
                "t1": None,
                "parent": st[-1] if st else -1,
            }
            st.append(len(ops))
            ops.append(d)
            open_[h] = d
        else:
            _, _, h, tid, t1, nout = w[i : i + 6]
            j = i + 6
            outs = []
            for _ in range(max(nout, 0)):
                v, j = _value(w, j)
                outs.append(v)
            d = open_.pop(h, None)
            st = stacks.get(tid)
            if st:
                st.pop()
            if d is not None:
                d["outputs"] = outs
                d["t1"] = t1
        i += ln
    return ops


def decode_fast(buf: torch.Tensor, names: list[str]) -> list[dict[str, Any]]:
    """Same walk as ``decode``, but tensors become tuples (sizes, strides, dtype, dev_type, dev_idx,
    storage, data_ptr, nbytes, offset, version, requires_grad) and there is no parent tracking."""
    w = buf.tolist()
    ops: list[dict[str, Any]] = []
    open_: dict[int, dict[str, Any]] = {}
    i, n = 0, len(w)

    def val(j: int) -> tuple[Any, int]:
        k = w[j]
        if k == V_TENSOR:
            nd = w[j + 1]
            a = j + 2 + 2 * nd
            return (tuple(w[j + 2 : j + 2 + nd]), tuple(w[j + 2 + nd : a]), *w[a : a + 9]), a + 9
        if k in (V_INT, V_OTHER):
            return w[j + 1], j + 2
        if k == V_UNDEF:
            return None, j + 1
        if k == V_OPAQUE:
            return ("opaque", *w[j + 1 : j + 4]), j + 4
        m = w[j + 1]
        j += 2
        out = []
        for _ in range(m):
            v, j = val(j)
            out.append(v)
        return out, j

    while i < n:
        ln = w[i + 1]
        if w[i] == ENTER:
            h, nid, oid, seq, tid, t0, mod, scope, nin = w[i + 2 : i + 11]
            j = i + 11
            ins = []
            for _ in range(nin if nin > 0 else 0):
                v, j = val(j)
                ins.append(v)
            d = {
                "name": names[nid],
                "ov": names[oid],
                "seq": seq,
                "tid": tid,
                "t0": t0,
                "module": mod,
                "scope": scope,
                "inputs": ins,
                "outputs": None,
                "t1": None,
            }
            ops.append(d)
            open_[h] = d
        else:
            h, tid, t1, nout = w[i + 2 : i + 6]
            j = i + 6
            outs = []
            for _ in range(nout if nout > 0 else 0):
                v, j = val(j)
                outs.append(v)
            d2 = open_.pop(h, None)
            if d2 is not None:
                d2["outputs"] = outs
                d2["t1"] = t1
        i += ln
    return ops


def input_shapes(d: dict[str, Any]) -> list[tuple[int, ...]]:
    """Shapes of the tensor inputs (including tensors inside list inputs) of a decoded record."""
    out = []
    for a in d["inputs"]:
        for t in a if isinstance(a, list) else [a]:
            if isinstance(t, dict) and "sizes" in t:
                out.append(tuple(t["sizes"]))
    return out
