"""Correctness checks for the C++ recorder, with the numbers the README quotes.

    python benchmarks/native_observer/verify.py 2>&1 | grep -v '^\\[W'

1. Observing does not change training: loss and parameters after 5 steps are bit-identical.
2. What the observer records vs what a TorchDispatchMode sees in one step (counts, scopes, and
   the records left after filtering kernel-internal and composite-parent calls).
3. Exact check: observer and dispatch mode active together; the records the mode re-dispatches
   must equal the mode's own op list.
4. The c10 memory ledger (MemoryReportingInfoBase) on CPU.

(The grep drops one-time c10 warnings, e.g. about frees of blocks allocated before the ledger.)
"""

from __future__ import annotations

import difflib
from collections import Counter
from typing import Any

import common
import ext
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class Log(TorchDispatchMode):
    """Records (op name, input shapes) like the Python recorder would, minus everything else."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, list[tuple[int, ...]]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        shapes = [tuple(a.shape) for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        self.ops.append((str(func), shapes))
        return func(*args, **kwargs)


def dm_aten(ops: list[tuple[str, list[tuple[int, ...]]]]) -> list[tuple[str, list[tuple[int, ...]]]]:
    # "aten.mm.default" -> "aten::mm", "aten.add.Tensor" -> "aten::add.Tensor" (RF naming).
    return [(n.replace("aten.", "aten::").rsplit(".default", 1)[0], s) for n, s in ops if n.startswith("aten.")]


def diffs(a: list[Any], b: list[Any]) -> list[tuple[int, Any, Any]]:
    # Positions where two op lists disagree, over their common prefix length (strict=False on
    # purpose: the lists may differ in length, and that is reported separately).
    return [(i, x, y) for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]


def main() -> None:
    torch.set_num_threads(1)
    rec: Any = ext.get()

    # --- 1. loss bit-identity: 5 steps plain vs 5 steps with the observer
    def run5(observe: bool) -> tuple[float, list[torch.Tensor]]:
        torch.manual_seed(123)
        m, o, x, y = common.make()
        if observe:
            rec.start(True, True)
        for _ in range(5):
            loss = common.step(m, o, x, y)
            if observe:
                rec.drain()
        if observe:
            rec.stop()
        return loss.item(), [p.detach().clone() for p in m.parameters()]

    l0, p0 = run5(False)
    l1, p1 = run5(True)
    same = l0 == l1 and all(torch.equal(a, b) for a, b in zip(p0, p1, strict=True))
    print("loss plain", repr(l0), "observed", repr(l1), "bit-identical:", same)

    # --- 2. one step under a dispatch mode, the same step (same RNG) under the observer
    m, o, x, y = common.make()
    common.step(m, o, x, y)  # warm-up, so both runs below see the same lazily-initialised state
    torch.manual_seed(1)
    with Log() as lg:
        common.step(m, o, x, y)
    torch.manual_seed(1)
    rec.drain()
    rec.start(True, True)
    common.step(m, o, x, y)
    rec.stop()
    buf = rec.drain()
    ops = common.decode(buf, rec.names())
    print(
        "dispatch-mode ops/step:", len(lg.ops), " RecordFunction records/step:", len(ops),
        f" buffer words: {buf.numel()} ({buf.numel() * 8 / 1024:.0f} KiB)",
    )
    print("scopes (0=FUNCTION, 1=BACKWARD_FUNCTION):", dict(Counter(d["scope"] for d in ops)))

    # CompositeImplicitAutograd ops decompose above the Python dispatch key, so a mode never sees
    # them, only what they decompose into.
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    ci_cache: dict[str, bool] = {}

    def composite(name: str) -> bool:
        if name not in ci_cache:
            base = name.split("::", 1)[-1]
            ci_cache[name] = name.startswith("aten::") and has("aten::" + base, "CompositeImplicitAutograd")
        return ci_cache[name]

    def transparent(d: dict[str, Any]) -> bool:
        # ancestors that do not hide their children from a dispatch mode
        return d["scope"] == 1 or not d["name"].startswith("aten::") or composite(d["name"])

    # Keep the records a mode would see: dispatch-level aten ops whose every ancestor is
    # transparent (a kernel's internal at:: calls happen below the Python key).
    expected = []
    for d in ops:
        if d["scope"] != 0 or not d["name"].startswith("aten::") or composite(d["name"]):
            continue
        p = d["parent"]
        ok = True
        while p != -1:
            if not transparent(ops[p]):
                ok = False
                break
            p = ops[p]["parent"]
        if ok:
            expected.append(d)

    dm = dm_aten(lg.ops)
    rf = [(d["name"], common.input_shapes(d)) for d in expected]
    print(f"dispatch-mode aten ops: {len(dm)}   RF records after dropping kernel-internal + composite-parent ops: {len(rf)}")
    first_bwd = next(i for i, d in enumerate(ops) if d["scope"] == 1)
    fwd_rf = [(d["name"], common.input_shapes(d)) for d in expected if d["t0"] < ops[first_bwd]["t0"]]
    # loss.backward() seeds with ones_like before the first backward node; cut the mode's list at
    # the same count.
    print("forward ops RF:", len(fwd_rf), " forward names+shapes identical to dispatch mode:", fwd_rf == dm[: len(fwd_rf)])
    mism = diffs(rf, dm)
    print("whole-step name+shape mismatches:", len(mism), mism[:5])
    sm = difflib.SequenceMatcher(None, [n for n, _ in rf], [n for n, _ in dm], autojunk=False)
    print(f"unperturbed run: name-sequence similarity RF vs DM = {sm.ratio():.3f}; example diffs:")
    for tag, a0, a1, b0, b1 in [op for op in sm.get_opcodes() if op[0] != "equal"][:6]:
        print(f"   {tag}: RF {[n for n, _ in rf[a0:a1]][:3]}  DM {[n for n, _ in dm[b0:b1]][:3]}")

    # --- 3. exact check: the observer *while* the mode is active.  Every op the mode sees is
    # re-dispatched by the mode's func(*args) -> a nested RF record under the Python key
    # fallback's own "PythonDispatchMode" RecordFunction.  Those records must equal the mode's list.
    torch.manual_seed(1)
    rec.drain()
    rec.start(True, True)
    with Log() as lg2:
        common.step(m, o, x, y)
    rec.stop()
    ops2 = common.decode(rec.drain(), rec.names())
    inner = [
        (d["name"], common.input_shapes(d))
        for d in ops2
        if d["scope"] == 0 and d["parent"] != -1 and ops2[d["parent"]]["name"] == "PythonDispatchMode"
    ]
    dm2 = dm_aten(lg2.ops)
    fb = next(i for i, (n, _) in enumerate(dm2) if "ones_like" in n)
    print(
        f"simultaneous run: DM aten ops {len(dm2)}, RF records re-dispatched by the mode {len(inner)}; "
        f"identical names+input shapes (whole step): {inner == dm2}; forward-only ({fb} ops) identical: {inner[:fb] == dm2[:fb]}"
    )
    if inner != dm2:
        print("   first diffs:", diffs(inner, dm2)[:5])
        missing = Counter(n for n, _ in dm2) - Counter(n for n, _ in inner)
        extra = Counter(n for n, _ in inner) - Counter(n for n, _ in dm2)
        print("   seen by DM but not RF:", dict(missing), " RF-only:", dict(extra))
        # RF fires on Dispatcher::call/callBoxed only, never on redispatch; the mode's own detach
        # calls go through redispatch.  Compare without the ops RF cannot see.
        unobs = set(missing)
        f_in = [t for t in inner if t[0] not in unobs]
        f_dm = [t for t in dm2 if t[0] not in unobs]
        nf = fb - sum(1 for t in dm2[:fb] if t[0] in unobs)
        print(
            f"   after dropping {sorted(unobs)}: identical whole step: {f_in == f_dm}; "
            f"first diffs {diffs(f_in, f_dm)[:3]}; "
            f"forward identical: {f_in[:nf] == f_dm[:nf]}"
        )

    # --- 4. memory ledger (shares the PROFILER_STATE debug-info slot with torch.profiler)
    print("memoryProfilingEnabled() before:", rec.mem_enabled())
    print("mem_start -> memoryProfilingEnabled():", rec.mem_start())
    common.step(m, o, x, y)
    ev = rec.mem_stop()
    print("memoryProfilingEnabled() after stop:", rec.mem_enabled())
    alloc = ev[ev[:, 1] > 0]
    free = ev[ev[:, 1] < 0]
    print(
        f"ledger events in one step: {ev.shape[0]} (alloc {alloc.shape[0]}, free {free.shape[0]}), "
        f"devices {sorted(set(ev[:, 3].tolist()))}, bytes alloc {int(alloc[:, 1].sum())} freed {int(-free[:, 1].sum())}"
    )


if __name__ == "__main__":
    main()
