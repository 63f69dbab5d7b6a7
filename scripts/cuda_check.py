"""The CUDA checks, as one short script for a machine with a GPU (CI has none).

    python scripts/cuda_check.py            # exit 0 when every check holds

Checks, on a small CNN on ``cuda``: losses and parameters bit-for-bit equal with and without
capture (default and full modes); every step carries the allocator's figures
(``memory.device``); ``cuda_history`` writes PyTorch's snapshot as JSON whose allocations are
labelled by step (and module on captured steps) and the viewer page; AMP with a GradScaler
records scale and skipped steps.  Prints one line per check.
"""

from __future__ import annotations

import json
import sys
import tempfile
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
    mode: str | None, path: Path, steps: int = 6, amp: bool = False, history: int | None = None
) -> list[float]:
    model = _model()
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
            loss = nn.functional.cross_entropy(model(x), y)
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
    return losses + [float(p.double().sum()) for p in model.parameters()]


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
        amp_plain = _train(None, d / "ap.tscope", amp=True)
        check("amp: bit-identical", _train("default", d / "amp.tscope", amp=True) == amp_plain)
        amp_steps = [e for e in iter_events(d / "amp.tscope") if e["kind"] == "step"]
        check("amp: scale recorded", all("scale" in s.get("scaler", {}) for s in amp_steps))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
