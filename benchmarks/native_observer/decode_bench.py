"""Cost of decoding one recorded step's buffer in Python, with the garbage collector on and off.

    python benchmarks/native_observer/decode_bench.py

Separates buf.tolist(), the full decode (dicts + parent links) and decode_fast (tuples): the
decode, not the observer, is what makes "record everything, decode each step" expensive.
"""

from __future__ import annotations

import gc
import statistics as st
import time
from typing import Any

import common
import ext
import torch


def main() -> None:
    torch.set_num_threads(1)
    rec: Any = ext.get()
    m, o, x, y = common.make()
    common.step(m, o, x, y)
    rec.start(True, True)
    common.step(m, o, x, y)
    rec.stop()
    buf = rec.drain()
    names = rec.names()
    print(f"buffer: {buf.numel()} int64 words = {buf.numel() * 8 / 1e6:.2f} MB/step")
    # The decode allocates hundreds of thousands of small objects; gen-0 collections triggered by
    # those allocations are a large part of its cost, hence the two runs.
    for label, gc_on in (("gc enabled", True), ("gc disabled", False)):
        (gc.enable if gc_on else gc.disable)()
        tl, td, tf = [], [], []
        for _ in range(15):
            t0 = time.thread_time()
            buf.tolist()
            tl.append(time.thread_time() - t0)
            t0 = time.thread_time()
            ops = common.decode(buf, names)
            td.append(time.thread_time() - t0)
            t0 = time.thread_time()
            common.decode_fast(buf, names)
            tf.append(time.thread_time() - t0)
        print(
            f"{label}: tolist {st.median(tl) * 1e3:.2f} ms, full decode to {len(ops)} dicts "
            f"{st.median(td) * 1e3:.2f} ms (min {min(td) * 1e3:.2f}); decode_fast (tuples) {st.median(tf) * 1e3:.2f} ms"
        )
    gc.enable()


if __name__ == "__main__":
    main()
