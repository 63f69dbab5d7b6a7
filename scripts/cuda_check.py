"""The CUDA checks, as one short script for a machine with a GPU (CI has none).

    python scripts/cuda_check.py            # exit 0 when every check holds

Checks, on a small CNN on ``cuda``: losses and parameters bit-for-bit equal with and without
capture (default and full modes); every step carries the allocator's figures
(``memory.device``); ``cuda_history`` writes PyTorch's snapshot as JSON whose allocations are
labelled by step (and module on captured steps) and the viewer page; AMP with a GradScaler
records scale and skipped steps; capture adds at most one host sync per uncaptured step
(counted with ``torch.cuda.set_sync_debug_mode``); recorded tensors say ``cuda:0``; the
ledger's live bytes at step boundaries against ``torch.cuda.memory_allocated``; under
``torch.compile`` with inductor (Triton) training stays bit-identical.  Prints one line per
check and the figures the note reports.
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 10)
    ).cuda()


def _train(
    mode: str | None,
    path: Path,
    steps: int = 6,
    amp: bool = False,
    history: int | None = None,
    compiled: bool = False,
) -> list[float]:
    """Losses then parameter sums of a short run, watched in ``mode`` (None: not watched);
    ``compiled``: the forward through ``torch.compile`` (inductor: Triton kernels on CUDA)."""
    if compiled:
        torch._dynamo.reset()
    model = _model()
    net = torch.compile(model) if compiled else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda") if amp else None
    g = torch.Generator(device="cuda").manual_seed(1)
    w = (
        torchscope.watch(model, opt, server=None, record=path, mode=mode, scaler=scaler, cuda_history=history)
        if mode
        else None
    )
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 3, 16, 16, device="cuda", generator=g)
        y = torch.randint(0, 10, (16,), device="cuda", generator=g)
        opt.zero_grad()
        with torch.autocast("cuda", enabled=amp):
            loss = nn.functional.cross_entropy(net(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        losses.append(loss.item())
    if w is not None:
        w.close()
    return losses + [float(p.detach().double().sum()) for p in model.parameters()]


def _syncs(mode: str | None, path: Path, steps: int = 8) -> list[int]:
    """Synchronizing CUDA calls per step in the training thread (the loop itself makes none)."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda").manual_seed(1)
    w = torchscope.watch(model, opt, server=None, record=path, mode=mode) if mode else None
    counts = []
    for _ in range(steps):
        x = torch.randn(16, 3, 16, 16, device="cuda", generator=g)
        y = torch.randint(0, 10, (16,), device="cuda", generator=g)
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        counts.append(sum("synchroniz" in str(r.message) for r in rec))
    if w is not None:
        w.close()
    return counts


def _compiled(mode: str | None, path: Path) -> list[float]:
    return _train(mode, path, steps=4, compiled=True)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    ok = True

    def check(name: str, cond: bool) -> None:
        nonlocal ok
        ok &= cond
        print(f"{'ok  ' if cond else 'FAIL'} {name}")

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        plain = _train(None, d / "plain.tscope")
        for mode in ("default", "full"):
            check(f"{mode}: bit-identical", _train(mode, d / f"{mode}.tscope") == plain)
        steps = [e for e in iter_events(d / "full.tscope") if e["kind"] == "step"]
        check("allocator figures every step", all("device" in s["memory"] for s in steps))
        check("other bytes present", all("other" in s["memory"] for s in steps))
        _train("full", d / "hist.tscope", history=100_000)
        snap_path = d / "hist.tscope.cuda-memory.json"
        check("history JSON written", snap_path.exists())
        if snap_path.exists():
            text = snap_path.read_text()
            json.loads(text)
            check("allocations labelled by step", '"step 1' in text)
            check("allocations labelled by module", '"step 1 0' in text or '"step 1 3' in text)
        check("viewer page written", (d / "hist.tscope.cuda-memory.html").exists())
        tensors = [
            t for e in iter_events(d / "full.tscope") if e["kind"] == "graph" for t in e.get("tensors", [])
        ]
        check(
            "recorded tensors on cuda:0", bool(tensors) and all(t.get("device") == "cuda:0" for t in tensors)
        )
        for s in steps[:3]:
            m = s["memory"]
            print(f"     step {s['step']}: ledger live {m.get('live')} B, other {m.get('other')} B, "
                  f"allocator {m.get('device', {}).get('allocated')} B, peak {m.get('peak')} B")  # fmt: skip
        for sm in (None, "light", "default"):
            counts = _syncs(sm, d / f"sync-{sm}.tscope")
            print(f"     syncs per step, {sm or 'plain'}: {counts}")
            if sm:
                check(f"{sm}: at most one host sync per uncaptured step", max(counts[1:]) <= 1)
        amp_plain = _train(None, d / "ap.tscope", amp=True)
        check("amp: bit-identical", _train("default", d / "amp.tscope", amp=True) == amp_plain)
        amp_steps = [e for e in iter_events(d / "amp.tscope") if e["kind"] == "step"]
        check("amp: scale recorded", all("scale" in s.get("scaler", {}) for s in amp_steps))
        # inductor: results can differ between compiles in one process (seen on an H200: a
        # plain run 4.5e-8 from the process's first plain run), so each watched run must equal
        # one of the plain runs compiled just before and just after it
        try:
            before = _compiled(None, d / "cp.tscope")
        except Exception as exc:  # no compiler toolchain: say so, it is not capture's failure
            print(f"skip inductor: {type(exc).__name__}: {exc}"[:300])
        else:
            for mode in ("default", "full"):
                watched = _compiled(mode, d / f"c{mode}.tscope")
                after = _compiled(None, d / "cp2.tscope")
                same = watched in (before, after)
                print(f"     inductor control, plain vs plain: {'identical' if after == before else 'differs'}")
                check(f"inductor {mode}: bit-identical to a neighbouring plain run", same)
                before = after
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
