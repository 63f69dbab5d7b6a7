"""Session-file size and read speed; prints markdown tables.

1. Bytes per recorded op and per step, from real captures: ``examples/mlp.py`` and
   ``examples/transformer.py`` run with ``torchscope.watch`` (file only) in ``default`` and
   ``full`` mode; bytes are the frames' on-disk sizes (40-byte header + compressed payload),
   the series frames (format 1.1) counted apart.
2. A 100,000-step session (synthetic schema events shaped like the MLP's, a 2,000-op graph
   every 1,000 steps, 25 steps per frame as a 0.25 s flush at 100 steps/s holds), written
   twice: with series frames as the capture writes them (1.1), and without (as a 1.0 file,
   which readers still read by decoding the step events).  Time to open it, read step N, read
   a graph, build the memory and gradient series, and the bytes each read (kernel count,
   /proc/self/io) against the file size.

    python benchmarks/bench_file.py            # full
    python benchmarks/bench_file.py --quick    # smaller runs, for a smoke test
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchscope.session import load
from torchscope.sessionfile import FLAG_GRAPH, FLAG_SERIES, FRAME_HEADER_SIZE, SessionFileWriter, index
from torchscope.transport import _SERIES_ROWS

REPO = Path(__file__).resolve().parent.parent


def _rchar() -> int:
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except OSError:  # not Linux: bytes are not reported
        return 0


def _measure(fn: Callable[[], Any], repeat: int = 3) -> tuple[Any, float, int]:
    """(result, best wall seconds, bytes read by the best run)."""
    best, best_bytes, out = float("inf"), 0, None
    for _ in range(repeat):
        r0, t0 = _rchar(), time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        if dt < best:
            best, best_bytes = dt, _rchar() - r0
    return out, best, best_bytes


# ----------------------------------------------------------------------------- 1. real captures
def real_sizes(steps: int, tmp: Path) -> list[tuple[str, str, int, int, int, float, float, float, float]]:
    rows = []
    for example in ("mlp", "transformer"):
        for mode in ("default", "full"):
            path = tmp / f"{example}-{mode}.tscope"
            subprocess.run([sys.executable, str(REPO / "examples" / f"{example}.py"), "--steps", str(steps),
                            "--server", "none", "--record", str(path), "--mode", mode],
                           check=True, capture_output=True, timeout=900)
            _, frames = index(path)
            graph_bytes = sum(FRAME_HEADER_SIZE + f.length for f in frames if f.flags & FLAG_GRAPH)
            series_bytes = sum(FRAME_HEADER_SIZE + f.length for f in frames if f.flags & FLAG_SERIES)
            other_bytes = sum(FRAME_HEADER_SIZE + f.length for f in frames if not f.flags & (FLAG_GRAPH | FLAG_SERIES))
            s = load(path)
            n_ops = sum(len(s.graph(n).get("ops", [])) for n in s.graph_steps)
            n_steps = len(s.steps)
            rows.append((example, mode, n_steps, len(s.graph_steps), n_ops, graph_bytes / max(n_ops, 1),
                         other_bytes / max(n_steps, 1), series_bytes / max(n_steps, 1), path.stat().st_size / 1024))
    return rows


# ----------------------------------------------------------------------------- 2. a big session
def _step(s: int, n_params: int) -> dict[str, Any]:
    return {"kind": "step", "step": s, "rank": 0, "t": 1.7e9 + s * 0.01, "duration_us": 10_000 + s % 97,
            "forward_us": 3000, "backward_us": 5000, "micro_batches": 1, "loss": 1.0 / (s + 1),
            "graph_signature": "9f2c41aa", "graph_captured": s % 1000 == 0,
            "grads": {"norm": [0.01 * ((s + i) % 13) for i in range(n_params)],
                      "max_abs": [0.001 * ((s + i) % 7) for i in range(n_params)],
                      "nan": [0] * n_params, "inf": [0] * n_params, "none": []},
            "memory": {"params": 1_200_000, "grads": 1_200_000, "optimizer": 2_400_000, "saved": 300_000 + s % 1000,
                       "live": 5_100_000 + s % 1000, "peak": 5_500_000 + s % 1000},
            "lr": [0.001], "zero_grad": 1, "training": True}


def _graph(s: int, ops: int) -> dict[str, Any]:
    return {"kind": "graph", "step": s, "rank": 0, "micro": 0, "complete": True,
            "ops": [{"id": i, "name": "aten::addmm", "module": f"layers.{i % 8}", "call": 0, "phase": "forward",
                     "inputs": [2 * i, 2 * i + 1], "outputs": [2 * i + 2], "src": "train.py:42", "dur_us": 12.5,
                     "alloc": 4096, "live": 1_000_000 + i} for i in range(ops)],
            "nodes": [{"id": i, "name": "AddmmBackward0", "module": f"layers.{i % 8}", "op": i} for i in range(ops)],
            "edges": [[i, i + 1, 0] for i in range(ops - 1)]}


def big_session(path: Path, n_steps: int, series: bool, per_frame: int = 25, graph_every: int = 1000,
                ops: int = 2000) -> tuple[float, float]:
    """Write the session as the transport does (one flush per ``per_frame`` steps; when
    ``series``, series frames once ``_SERIES_ROWS`` steps wait for them, and at the end);
    returns (total seconds, seconds spent writing series frames)."""
    n_params = 8
    t0 = time.perf_counter()
    in_series = 0.0
    w = SessionFileWriter(path)
    w.append([{"kind": "session", "session_id": "bench", "name": "bench", "rank": 0, "world_size": 1,
               "params": [{"name": f"layers.{i}.weight", "module": f"layers.{i}"} for i in range(n_params)]}])
    for lo in range(0, n_steps, per_frame):
        w.append([_step(s, n_params) for s in range(lo, min(lo + per_frame, n_steps))])
        for s in range(lo, min(lo + per_frame, n_steps)):
            if s % graph_every == 0:
                w.append([_graph(s, ops)])
        if series and w.series_pending >= _SERIES_ROWS:
            t1 = time.perf_counter()
            w.append_series()
            in_series += time.perf_counter() - t1
    w.append([{"kind": "end", "t": 1.8e9, "status": "finished", "steps": n_steps}])
    if series:
        t1 = time.perf_counter()
        w.append_series()
        in_series += time.perf_counter() - t1
    w.close(fsync=False)
    return time.perf_counter() - t0, in_series


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n_steps = 10_000 if args.quick else 100_000
    real_steps = 10 if args.quick else 60

    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        print(f"## Bytes on disk, real captures ({real_steps} steps, file only)\n")
        print("| example | mode | steps | graphs | ops recorded | bytes / op | bytes / step (step frames) "
              "| bytes / step (series frames) | file KiB |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for ex, mode, steps, graphs, ops, b_op, b_step, b_series, kib in real_sizes(real_steps, tmp):
            print(f"| {ex} | {mode} | {steps} | {graphs} | {ops:,} | {b_op:.1f} | {b_step:.0f} | {b_series:.0f} "
                  f"| {kib:.0f} |")
        for series, label in ((True, "with series frames (1.1)"), (False, "without series frames (a 1.0 file)")):
            big_file(tmp / f"big-{series}.tscope", n_steps, series, label)


def big_file(path: Path, n_steps: int, series: bool, label: str) -> None:
    wrote, in_series = big_session(path, n_steps, series)
    size = path.stat().st_size
    mid = n_steps // 2
    graph_step = (mid // 1000) * 1000
    rows: list[tuple[str, float, int]] = []
    s, dt, nb = _measure(lambda: load(path))
    rows.append(("open (`load()`: index + session record)", dt, nb))
    _, dt, nb = _measure(lambda: load(path).step(mid))
    rows.append((f"open + `step({mid})`", dt, nb))
    _, dt, nb = _measure(lambda: load(path).graph(graph_step))
    rows.append((f"open + `graph({graph_step})` (2,000 ops)", dt, nb))
    slow = 1 if not series else 3  # decoding every step event takes seconds: fewer repeats
    _, dt, nb = _measure(lambda: load(path).memory(), repeat=slow)
    rows.append(("open + `memory()` (all steps)", dt, nb))
    _, dt, nb = _measure(lambda: load(path).grads(), repeat=slow)
    rows.append(("open + `grads()` (all steps)", dt, nb))
    _, dt, nb = _measure(lambda: load(path).summary(), repeat=slow)
    rows.append(("open + `summary()` (all steps)", dt, nb))
    _, dt, nb = _measure(lambda: len(load(path)), repeat=slow)
    rows.append(("open + `len()`", dt, nb))
    _, frames = index(path)
    series_bytes = sum(FRAME_HEADER_SIZE + f.length for f in frames if f.flags & FLAG_SERIES)
    print(f"\n## A {n_steps:,}-step session {label}: {size / 2**20:.1f} MiB, {len(frames):,} frames, "
          f"series frames {series_bytes / 2**20:.1f} MiB\n\n(written in {wrote:.1f} s, of which series frames "
          f"{in_series:.1f} s = {in_series / n_steps * 1e6:.0f} µs/step; {size / n_steps:.0f} bytes/step incl. graphs)\n")
    print("| operation | time (best) | bytes read | share of file |")
    print("|---|---:|---:|---:|")
    for label_, dt, nb in rows:
        print(f"| {label_} | {dt * 1000:.1f} ms | {nb:,} | {nb / size:.1%} |")
    print(f"\nsession: {s!r}")


if __name__ == "__main__":
    main()
