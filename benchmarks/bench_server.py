"""Server benchmarks: ingest op events/s with a real client process, API latency on a
synthetic 100,000-step session, import/open time, live push latency.  Prints a markdown table.

usage: python benchmarks/bench_server.py [--steps 100000] [--seconds 10] [--import-mib 64]
       python benchmarks/bench_server.py --import-only [--steps 100000] [--repeat 3]
--import-only: just the imports of a --steps session file, each into a fresh server: one the
capture writes (benchmarks/bench_file.py's, format 1.1 with series frames) and the synthetic one
(no series frames); wall seconds of the CLI's upload() and the server process's CPU seconds.
Targets (issue 4): ingest >= 200,000 op events/s; every API call < 100 ms on 100k steps;
an import never holds the whole file in memory (server peak RSS while importing a big file).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from conftest import ServerProc  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from bench_file import big_session  # noqa: E402

from torchscope.server.client import upload  # noqa: E402
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


def incompressible_file(path: Path, mib: int) -> Path:
    """A session file of about ``mib`` MiB that zlib cannot shrink (random hex in the steps'
    free-form ``events``), so the import handles that many bytes of frames."""
    with open(path, "wb") as f:
        f.write(file_header())
        f.write(encode_frame(0, [{"kind": "session", "session_id": "bigimport", "rank": 0}]))
        seq = step = 0
        while f.tell() < mib << 20:
            seq += 1
            events = [{"kind": "step", "step": step + j, "t": 1.0, "events": [{"what": secrets.token_hex(40_000)}]}
                      for j in range(20)]
            step += 20
            f.write(encode_frame(seq, events))
    return path


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next((int(line.split()[1]) for line in status if line.startswith("VmRSS")), 0)


def peak_rss_during(pid: int, fn) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """Seconds ``fn()`` takes and the peak resident memory (KiB) of process ``pid`` meanwhile."""
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_kib(pid))
            time.sleep(0.02)

    watcher = threading.Thread(target=sample)
    watcher.start()
    t = time.perf_counter()
    try:
        fn()
    finally:
        done.set()
        watcher.join()
    return time.perf_counter() - t, peak[0]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_import(path: Path, tmp: Path) -> tuple[float, float]:
    """Wall seconds of ``upload()`` of ``path`` into a fresh server, and that server's CPU
    seconds meanwhile (the doctor it starts afterwards runs in a child process: not counted)."""
    srv = ServerProc(tmp / f"data-{secrets.token_hex(4)}").start()
    try:
        assert srv.proc is not None
        c0, t = cpu_s(srv.proc.pid), time.perf_counter()
        upload(srv.url, path)
        return time.perf_counter() - t, cpu_s(srv.proc.pid) - c0
    finally:
        srv.stop()


def import_only(steps: int, repeat: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-import-"))
    try:
        files = {"capture-written (format 1.1, series frames)": tmp / "capture.tscope",
                 "synthetic (no series frames)": tmp / "synthetic.tscope"}
        big_session(files["capture-written (format 1.1, series frames)"], steps, series=True)
        files["synthetic (no series frames)"].write_bytes(file_header() + b"".join(synthetic_frames("big2", steps)))
        print("| file | MiB | wall s (each run) | server CPU s (each run) |\n|---|---:|---|---|")
        for label, path in files.items():
            runs = [timed_import(path, tmp) for _ in range(repeat)]
            print(f"| {label}, {steps:,} steps | {path.stat().st_size / 2**20:.1f} "
                  f"| {', '.join(f'{w:.2f}' for w, _ in runs)} | {', '.join(f'{c:.2f}' for _, c in runs)} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n(machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--doctor-timeout", type=float, default=30.0)
    ap.add_argument("--ops", type=int, default=5000, help="ops per graph event in the ingest test")
    ap.add_argument("--import-mib", type=int, default=64, help="size of the big-file import test (0: skip)")
    ap.add_argument("--import-only", action="store_true", help="only time imports of a --steps file (see above)")
    ap.add_argument("--repeat", type=int, default=3, help="imports of each file with --import-only")
    args = ap.parse_args()
    if args.import_only:
        import_only(args.steps, args.repeat)
        return
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

        # 4b. a big file: the import streams it to disk and stores it frame by frame, so the
        # server's memory stays far below the file's size (Linux: /proc)
        if args.import_mib and srv.proc is not None and Path(f"/proc/{srv.proc.pid}/status").exists():
            big = incompressible_file(tmp / "bigimport.tscope", args.import_mib)
            size = big.stat().st_size >> 20
            before = rss_kib(srv.proc.pid)
            secs, peak = peak_rss_during(srv.proc.pid, lambda: upload(srv.url, big))
            rows.append((f"import {size} MiB incompressible file: s / server RSS before, peak MiB",
                         f"{secs:.1f} / {before >> 10}, {peak >> 10}", "peak - before << file size"))

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
