"""Server benchmarks: ingest op events/s with a real client process, API latency on a
synthetic 100,000-step session, import/open time, live push latency.  Prints a markdown table.

usage: python benchmarks/bench_server.py [--steps 100000] [--seconds 10]
Targets (issue 4): ingest >= 200,000 op events/s; every API call < 100 ms on 100k steps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from conftest import ServerProc  # noqa: E402

from torchscope.sessionfile import encode_frame, file_header  # noqa: E402

CLIENT = r'''
import sys, time, urllib.request
from torchscope.sessionfile import encode_frame
url, seconds, n_ops = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
def graph(step):
    ops = [{"id": i, "name": "aten::addmm" if i % 3 else "aten::relu", "module": f"layers.{i % 12}.mlp",
            "call": 0, "phase": "forward" if i < n_ops // 2 else "backward", "micro": 0,
            "inputs": [i, i + 1], "outputs": [i + 2], "src": "train.py:42", "dur_us": 3.5,
            "alloc": 4096, "live": 1 << 20} for i in range(n_ops)]
    return {"kind": "graph", "step": step, "rank": 0, "micro": 0, "complete": True, "ops": ops,
            "nodes": [], "edges": []}
frames = [encode_frame(0, [{"kind": "session", "session_id": "ingest", "name": "ingest", "rank": 0}])]
def post(body):
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/x-tscope-frames"})
    return urllib.request.urlopen(req, timeout=60).read()
post(frames[0])
template = [encode_frame(0, [graph(s)]) for s in range(4)]  # encoding is the client's cost, not the server's
import struct
seq, ops, t0 = 1, 0, time.perf_counter()
while time.perf_counter() - t0 < seconds:
    batch = []
    for k in range(4):
        f = bytearray(template[k]); struct.pack_into("<I", f, 12, seq); batch.append(bytes(f)); seq += 1
    post(b"".join(batch))
    ops += 4 * n_ops
print(ops / (time.perf_counter() - t0))
'''


def _get(url: str, timeout: float = 60) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def _post(url: str, body: bytes, content_type: str = "application/x-tscope-frames") -> bytes:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return resp.read()


def _ms(fn, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def synthetic_frames(session_id: str, steps: int, n_params: int = 20, per_frame: int = 100) -> list[bytes]:
    events: list[list[dict[str, object]]] = [[{
        "kind": "session", "session_id": session_id, "name": "synthetic", "rank": 0, "model": "Net",
        "params": [{"name": f"p{i}", "module": f"m{i}"} for i in range(n_params)]}]]
    batch: list[dict[str, object]] = []
    for s in range(steps):
        if s % (steps // 10) == 0:
            events.append([{"kind": "graph", "step": s, "rank": 0, "micro": 0, "ops": [
                {"id": i, "name": "aten::mm", "module": f"m{i % n_params}"} for i in range(2000)], "nodes": [],
                "edges": []}])
        batch.append({"kind": "step", "step": s, "rank": 0, "t": 1e9 + s, "duration_us": 1000, "loss": 1 / (s + 1),
                      "graph_captured": s % (steps // 10) == 0, "graph_signature": "abc",
                      "grads": {"norm": [0.1] * n_params, "nan": [0] * n_params, "inf": [0] * n_params, "none": []},
                      "memory": {"live": s, "peak": 2 * s, "params": 100, "grads": 100, "optimizer": 200}})
        if len(batch) == per_frame:
            events.append(batch)
            batch = []
    events.append([*batch, {"kind": "end", "t": 2e9, "status": "finished", "steps": steps}])
    return [encode_frame(i, evs) for i, evs in enumerate(events)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--doctor-timeout", type=float, default=30.0)
    ap.add_argument("--ops", type=int, default=5000, help="ops per graph event in the ingest test")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-server-"))
    rows: list[tuple[str, str, str]] = []
    srv = ServerProc(tmp / "data").start()
    try:
        # 1. ingest throughput, real client process
        out = subprocess.run([sys.executable, "-c", CLIENT, srv.url + "/api/ingest/ingest/0", str(args.seconds),
                              str(args.ops)], capture_output=True, text=True, check=True)
        rate = float(out.stdout.strip().splitlines()[-1])
        rows.append(("ingest, op events/s (real client process, sustained)", f"{rate:,.0f}", ">= 200,000"))

        # 2. the synthetic 100k-step session, ingested over the wire
        frames = synthetic_frames("big", args.steps)
        t = time.perf_counter()
        chunk: list[bytes] = []
        size = 0
        for f in frames:
            chunk.append(f)
            size += len(f)
            if size > 4 << 20:
                _post(srv.url + "/api/ingest/big/0", b"".join(chunk))
                chunk, size = [], 0
        if chunk:
            _post(srv.url + "/api/ingest/big/0", b"".join(chunk))
        rows.append((f"ingest {args.steps:,}-step session (steps/s)",
                     f"{args.steps / (time.perf_counter() - t):,.0f}", ""))

        # 3. API latency on it: cold (first call) and warm (median of 5)
        base = srv.url + "/api/sessions/big"
        endpoints = {
            "GET /api/sessions": srv.url + "/api/sessions",
            "GET /api/sessions/{id}": base,
            "GET /steps (first page, 1000)": base + "/steps",
            "GET /steps?start=90000&end=90999": base + "/steps?start=90000&end=90999",
            "GET /steps (last page)": base + f"/steps?offset={args.steps - 1000}",
            "GET /graphs": base + "/graphs",
            "GET /graph?step=N (2000 ops)": base + f"/graph?step={args.steps // 2}",
            "GET /graph?step=N&module=m1": base + f"/graph?step={args.steps // 2}&module=m1",
            "GET /memory (all steps)": base + "/memory",
            "GET /grads?start=&end= (1000 steps)": base + "/grads?start=50000&end=50999",
            "GET /grads (no range: sampled to max_steps=1000)": base + "/grads",
            "GET /grads?max_steps=100000 (every step)": base + "/grads?max_steps=100000",
            "GET /export (whole file)": base + "/export",
        }
        for label, url in endpoints.items():
            cold = _ms(lambda u=url: _get(u), repeat=1)
            warm = _ms(lambda u=url: _get(u))
            rows.append((f"{label} ms, cold / warm", f"{cold:.1f} / {warm:.1f}", "< 100"))

        # the doctor's first run is its own cost (torchscope.doctor); the server caches the result
        try:
            cold = _ms(lambda: _get(base + "/diagnostics", timeout=args.doctor_timeout), repeat=1)
            warm = _ms(lambda: _get(base + "/diagnostics"))
            rows.append(("GET /diagnostics ms, first run (doctor) / cached", f"{cold:.0f} / {warm:.1f}", "< 100 cached"))
        except TimeoutError:
            rows.append(("GET /diagnostics, first run (doctor)", f"> {args.doctor_timeout:.0f} s (timed out)", ""))

        # 4. import of the same session as a file, and "open" (what the dashboard fetches first)
        path = tmp / "big.tscope"
        path.write_bytes(file_header() + b"".join(synthetic_frames("big2", args.steps)))
        boundary = "benchboundary"
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.tscope\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\n").encode() + path.read_bytes() + \
            f"\r\n--{boundary}--\r\n".encode()
        t = time.perf_counter()
        _post(srv.url + "/api/sessions/import", body, f"multipart/form-data; boundary={boundary}")
        rows.append((f"import {path.stat().st_size >> 20} MiB file, s", f"{time.perf_counter() - t:.2f}", ""))
        b2 = srv.url + "/api/sessions/big2"
        t = time.perf_counter()
        for u in (b2, b2 + "/steps?limit=1000", b2 + "/graphs", b2 + "/memory"):
            _get(u)
        rows.append(("open session (detail + steps page + graphs + memory), ms",
                     f"{(time.perf_counter() - t) * 1000:.0f}", ""))

        # 5. live push: time from POST to the SSE line arriving
        resp = urllib.request.urlopen(srv.url + "/api/live", timeout=10)
        resp.readline()
        lat = []
        for i in range(5):
            t = time.perf_counter()
            _post(srv.url + "/api/ingest/livebench/0", encode_frame(i, [{"kind": "step", "step": i}]))
            while not resp.readline().startswith(b"data: "):
                pass
            lat.append((time.perf_counter() - t) * 1000)
        resp.close()
        rows.append(("live push latency (POST -> SSE line), ms median", f"{statistics.median(lat):.1f}", "< 1000"))
        db = tmp / "data" / "torchscope.db"
        rows.append(("store size for both sessions + ingest run, MiB",
                     f"{sum(p.stat().st_size for p in db.parent.glob('torchscope.db*')) / 2**20:.1f}", ""))
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("| measure | value | target |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    print(f"\n(machine: {os.cpu_count()} cores; steps={args.steps}; {json.dumps(vars(args))})")


if __name__ == "__main__":
    main()
