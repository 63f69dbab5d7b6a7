"""The capture's cost counted in instructions, not timed: noise-free where the timed ratios of
``bench_capture.py`` move by ±0.1x between runs on a shared machine.

Each configuration runs in its own process under ``valgrind --tool=callgrind``, counting only
the steady steps (collection switched on and off around them through callgrind's client
requests, from a tiny C helper built here), per thread: the training thread's instructions per
step are what the capture adds to the step; the other threads' (the writer: JSON, zlib, file)
run beside it.  Instructions are not time -- the capture's code runs with cold caches after
each step's kernels, so its share of the time is larger than its share of the instructions --
but a change that removes work shows here exactly, run after run.

    python benchmarks/bench_instructions.py                      # the MLP: plain, light, default
    python benchmarks/bench_instructions.py --models mlp,cnn --steps 10

Needs valgrind (Debian: ``apt-get install valgrind``, which brings ``callgrind.h``) and a C
compiler; each configuration takes a few minutes (two run at a time).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HELPER_C = """#include <valgrind/callgrind.h>
void ts_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void ts_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS; }
"""


def child(config: str, kind: str, warm: int, steps: int, helper: str, record: str) -> None:
    """One configuration's steps, the steady ones counted (runs under valgrind)."""
    import ctypes

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_capture
    from bench_capture import configured, make

    bench_capture.CHUNK_CAPTURE = 10**9  # default mode: steady steps only (no sampled capture among them)

    torch.set_num_threads(1)
    model, batch = make(kind)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = [batch() for _ in range(warm + steps)]
    counter = ctypes.CDLL(helper)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad()
        logits = model(x)
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y).backward()
        opt.step()

    with configured(config, model, opt, Path(record)):
        for x, y in data[:warm]:
            step(x, y)
        counter.ts_start()
        for x, y in data[warm:]:
            step(x, y)
        counter.ts_stop()


def per_thread(out: Path, stem: str) -> dict[int, int]:
    """Instructions per thread from callgrind's dumps ``stem*`` (thread 1 is the training thread)."""
    totals: dict[int, int] = {}
    for f in out.glob(f"{stem}*"):
        text = f.read_text(errors="replace")
        thread = re.search(r"^thread: (\d+)", text, re.M)
        total = re.search(r"^totals: (\d+)", text, re.M) or re.search(r"^summary: (\d+)", text, re.M)
        if thread and total:
            totals[int(thread.group(1))] = totals.get(int(thread.group(1)), 0) + int(total.group(1))
    return totals


def measure(config: str, kind: str, warm: int, steps: int, helper: Path, out: Path) -> dict[int, int]:
    stem = f"cg.{kind}.{config}"
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
           f"--callgrind-out-file={out / stem}", sys.executable, __file__, "--child", config, kind,
           str(warm), str(steps), str(helper), str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"bench_instructions: {config} on {kind} failed under valgrind:\n{res.stderr[-2000:]}")
    return per_thread(out, stem)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7])
        return
    ap = argparse.ArgumentParser(description="capture cost in instructions per step, under callgrind")
    ap.add_argument("--models", default="mlp", help="comma-separated: mlp, cnn, transformer, deep-mlp")
    ap.add_argument("--configs", default="plain,light,default")
    ap.add_argument("--warm", type=int, default=20, help="steps before counting (a fresh watch's first ones)")
    ap.add_argument("--steps", type=int, default=20, help="steady steps counted")
    args = ap.parse_args()
    cc = shutil.which("cc") or shutil.which("gcc")
    if not shutil.which("valgrind") or not cc or not Path("/usr/include/valgrind/callgrind.h").exists():
        raise SystemExit("bench_instructions: needs valgrind (with /usr/include/valgrind/callgrind.h) and a C compiler")
    configs = args.configs.split(",")
    if "plain" not in configs:
        configs.insert(0, "plain")
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        out = Path(tmp)
        (out / "helper.c").write_text(HELPER_C)
        helper = out / "helper.so"
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(helper), str(out / "helper.c")], check=True)
        jobs = [(kind, config) for kind in args.models.split(",") for config in configs]
        print(f"{len(jobs)} runs under callgrind, {args.steps} steady steps each after {args.warm}; "
              "a few minutes each, two at a time", file=sys.stderr)
        with ThreadPoolExecutor(max_workers=2) as pool:
            counts = dict(zip(jobs, pool.map(lambda j: measure(j[1], j[0], args.warm, args.steps, helper, out), jobs),
                              strict=True))
    print("| model | config | training thread, M instructions/step | vs plain | other threads, M/step |")
    print("|---|---|---|---|---|")
    for kind, config in jobs:
        threads = counts[(kind, config)]
        train = threads.get(1, 0) / args.steps / 1e6
        plain = counts[(kind, "plain")].get(1, 0) / args.steps / 1e6
        others = sum(v for t, v in threads.items() if t != 1) / args.steps / 1e6
        vs = f"+{(train - plain) / plain:.1%}" if config != "plain" and plain else "—"
        print(f"| {kind} | {config} | {train:.2f} | {vs} | {others:.2f} |")


if __name__ == "__main__":
    main()
