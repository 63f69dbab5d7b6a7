"""Per-step overhead of the C++ RecordFunction recorder vs a Python TorchDispatchMode.

    python benchmarks/native_observer/bench.py [rounds=8] [chunk=20]

Configurations (see README.md for what each answers):
  plain       no instrumentation
  rf          observer on, inputs + outputs recorded, buffer drained each step (no decode)
  rf_decode   rf + Python decode of the buffer each step (common.decode, dicts + parent links)
  rf_mod      rf + global module forward pre/post hooks calling set_module (module context)
  rf_noargs   observer on, no inputs/outputs (names, ids, timestamps only)
  rf_mem      rf + the c10 memory ledger (alloc/free events) around each step
  hooks_only  the rf_mod module hooks alone
  dm_noop     a TorchDispatchMode that only calls func: the floor of the Python recorder

Configurations run round-robin in short chunks (order reversed every other round) and each step
is timed with the training thread's CPU time, so load from other processes on a shared machine
skews the ratios as little as possible.  Sibling modules import because Python puts this
script's folder first on sys.path.
"""

from __future__ import annotations

import gc
import statistics as st
import sys
import time
from typing import Any

import common
import ext
import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

CFGS = ["plain", "rf", "rf_decode", "rf_mod", "rf_noargs", "rf_mem", "hooks_only", "dm_noop"]


class Noop(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def main() -> None:
    # One intra-op thread: the comparison is about per-op overhead, and on a small shared machine
    # extra threads mostly add noise.
    torch.set_num_threads(1)
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    chunk = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    rec: Any = ext.get()
    model, opt, x, y = common.make()

    mod_ids = {id(m): i for i, (_, m) in enumerate(model.named_modules())}
    stack: list[int] = []

    def pre(m: torch.nn.Module, inp: Any) -> None:
        mid = mod_ids.get(id(m), -1)
        stack.append(mid)
        rec.set_module(mid)

    def post(m: torch.nn.Module, inp: Any, out: Any) -> None:
        stack.pop()
        rec.set_module(stack[-1] if stack else -1)

    decode_times: list[float] = []
    records: list[int] = []

    def run_chunk(cfg: str, n: int) -> list[float]:
        times = []
        hooks = []
        if cfg in ("rf_mod", "hooks_only"):
            hooks = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
        if cfg.startswith("rf"):
            rec.start(cfg != "rf_noargs", cfg != "rf_noargs")
        for _ in range(n):
            t0 = time.thread_time()
            if cfg == "dm_noop":
                with Noop():
                    common.step(model, opt, x, y)
            elif cfg == "rf_mem":
                rec.mem_start()
                common.step(model, opt, x, y)
                rec.mem_stop()
                rec.drain()
            else:
                common.step(model, opt, x, y)
                if cfg.startswith("rf"):
                    buf = rec.drain()
                    if cfg == "rf_decode":
                        td = time.thread_time()
                        ops = common.decode(buf, rec.names())
                        decode_times.append(time.thread_time() - td)
                        records.append(len(ops))
            times.append(time.thread_time() - t0)
        if cfg.startswith("rf"):
            rec.stop()
            rec.drain()
        for h in hooks:
            h.remove()
        return times

    res: dict[str, list[float]] = {c: [] for c in CFGS}
    per_round: dict[str, list[float]] = {c: [] for c in CFGS}  # chunk median / same-round plain median
    for c in CFGS:
        run_chunk(c, 3)  # warm-up: first-call dispatch caches, allocator, extension's name table
    gc.collect()
    for r in range(rounds):
        order = CFGS if r % 2 == 0 else CFGS[::-1]
        meds = {}
        for c in order:
            t = run_chunk(c, chunk)
            res[c] += t
            meds[c] = st.median(t)
        for c in CFGS:
            per_round[c].append(meds[c] / meds["plain"])

    base = st.median(res["plain"])
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, rounds={rounds} x chunk={chunk}")
    print(f"{'config':12s} {'median ms':>10s} {'ratio':>6s}  {'p25..p75 ms':>14s}  per-round ratio median [min..max]")
    for c in CFGS:
        q = st.quantiles(res[c], n=4) if len(res[c]) > 1 else [res[c][0]] * 3
        pr = per_round[c]
        print(
            f"{c:12s} {st.median(res[c]) * 1e3:10.2f} {st.median(res[c]) / base:6.2f}  "
            f"{q[0] * 1e3:6.2f}..{q[2] * 1e3:6.2f}   {st.median(pr):.2f} [{min(pr):.2f}..{max(pr):.2f}]"
        )
    print(
        f"records/step {st.median(records):.0f}; python decode alone: median "
        f"{st.median(decode_times) * 1e3:.2f} ms/step ({st.median(decode_times) / base:.2f}x of a plain step)"
    )


if __name__ == "__main__":
    main()
