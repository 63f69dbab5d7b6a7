"""Capture overhead, side by side in one run: plain vs light vs default vs full vs torch.profiler.

Reference models (issue 3) on CPU with one thread: a 4-layer transformer (d=64, 4 heads,
batch 8x32 tokens), a small CNN and an MLP.  Configurations run round-robin in short chunks
(a fresh watch or profiler per chunk, garbage collected between chunks), every step is timed
with the training thread's CPU time, and medians are compared, so load from other processes
on a shared machine does not skew the ratios.  Steps are costed by what the capture does on them and combined as one
watch over the whole run would pay them (``bench()``).  The last column is the CPU the
watch's writer thread spends per step (encoding and writing events), beside the training
thread: it does not slow the loop while a core is free, but it is CPU the machine pays.

    python benchmarks/bench_capture.py            # 200 steps per configuration
    python benchmarks/bench_capture.py --quick    # a smoke run
    python benchmarks/bench_capture.py --classes  # also each step class's median (see step_class)
    python benchmarks/bench_capture.py --device cuda   # on a GPU: wall time, synchronized per step
    python benchmarks/bench_capture.py --models deep-mlp  # 302 small parameters: per-parameter costs
    python benchmarks/bench_capture.py --models resnet20,transformer-medium --steps 80  # real models' steps (~0.3 s)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

import torchscope
from torchscope._watch import COPY_STEPS, GRAD_STATS_EVERY

CONFIGS = ("plain", "light", "default", "full", "profiler")


class Transformer(nn.Module):
    def __init__(self, vocab: int = 256, d: int = 64, heads: int = 4, layers: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(x)))


class Block(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm, and the shortcut (a 1x1
    convolution where the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.short(x))


def resnet20() -> nn.Module:
    """He et al.'s CIFAR-10 ResNet-20: a real model's step, not a worst case (65 parameters,
    ~270k values; 21 convolutions)."""
    blocks: list[nn.Module] = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for cout, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            blocks.append(Block(cin, cout, stride if i == 0 else 1))
            cin = cout
    blocks += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*blocks)


def clock() -> float:
    """The training thread's CPU seconds; on CUDA, wall seconds once queued kernels finished."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.thread_time()


DEVICE = torch.device("cpu")
STREAM = False  # --stream: on CUDA, no synchronization between steps (throughput)
CHUNK_CAPTURE = 15  # the step of each chunk (a fresh watch) default mode captures besides its first


def make(kind: str) -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    model, batch = _make(kind)
    if DEVICE.type == "cpu":
        return model, batch
    return model.to(DEVICE), lambda: tuple(t.to(DEVICE) for t in batch())  # type: ignore[return-value]


def _make(kind: str) -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    if kind == "transformer":
        return Transformer(), lambda: (torch.randint(0, 256, (8, 32)), torch.randint(0, 256, (8 * 32,)))
    if kind == "transformer-medium":  # a real model's step on the CPU (4.2M parameters, ~0.35 s)
        mid = Transformer(vocab=2000, d=256, heads=8, layers=4)
        return mid, lambda: (torch.randint(0, 2000, (8, 64)), torch.randint(0, 2000, (8 * 64,)))
    if kind == "transformer-large":  # a GPU-sized one, for --device cuda
        big = Transformer(vocab=4096, d=512, heads=8, layers=6)
        return big, lambda: (torch.randint(0, 4096, (16, 128)), torch.randint(0, 4096, (16 * 128,)))
    if kind == "deep-mlp":  # per-parameter costs: 302 small parameters, 301 modules
        deep = nn.Sequential(*[m for _ in range(150) for m in (nn.Linear(64, 64), nn.ReLU())], nn.Linear(64, 10))
        return deep, lambda: (torch.randn(16, 64), torch.randint(0, 10, (16,)))
    if kind == "resnet20":
        return resnet20(), lambda: (torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,)))
    if kind == "cnn":
        m = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 8 * 8, 10),
        )  # fmt: skip
        return m, lambda: (torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))
    m = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    return m, lambda: (torch.randn(64, 256), torch.randint(0, 10, (64,)))


@contextlib.contextmanager
def configured(config: str, model: nn.Module, opt: torch.optim.Optimizer, out: Path) -> Iterator[Any]:
    """Yields the watch (None for plain and the profiler)."""
    if config == "plain":
        yield None
    elif config == "profiler":
        with torch.profiler.profile(record_shapes=True, profile_memory=True):
            yield None
    else:
        # default mode captures step 0 of each chunk (a fresh watch) and step CHUNK_CAPTURE, a
        # warm capture as the ones every sample_every steps of a long run are
        with torchscope.watch(
            model,
            opt,
            server=None,
            record=out / f"{config}-{time.monotonic_ns()}.tscope",
            mode=config,
            sample_every=CHUNK_CAPTURE,
        ) as w:
            yield w


def writer_cpu(w: Any) -> float:
    """CPU seconds the watch's writer thread (JSON, zlib, file) has used, once everything emitted
    so far is written: work the training thread does not wait for, but a busy machine pays."""
    t = w._transport  # the benchmark reads the private thread: no public API wants this number
    t.flush(timeout=60.0)
    return time.clock_gettime(time.pthread_getcpuclockid(t._thread.ident))


def run_chunk(config: str, state: dict[str, Any], steps: int, out: Path) -> tuple[list[float], float, float]:
    """Per-step CPU seconds of one chunk, the CPU seconds of entering/leaving the configuration,
    and the writer thread's CPU seconds for the chunk."""
    model, batch, opt = state["model"], state["batch"], state["opt"]
    data = [batch() for _ in range(steps)]
    times: list[float] = []
    writer = 0.0
    t_all = clock()
    with configured(config, model, opt, out) as w:
        for i, (x, y) in enumerate(data):
            if not STREAM or i <= 1:
                t0 = clock()
            opt.zero_grad()  # the common loop: zero_grad, forward, loss, backward, step
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y)
            loss.backward()
            opt.step()
            if not STREAM or i == 0:
                times.append(clock() - t0)
        if STREAM and len(data) > 1:  # steps after the first as one block: the GPU's queue stays full
            times += [(clock() - t0) / (len(data) - 1)] * (len(data) - 1)
        if w is not None:
            writer = writer_cpu(w)
    return times, clock() - t_all - sum(times), writer


def step_class(config: str, k: int, sample_every: int) -> str:
    """What step ``k`` of one watch pays, by what the capture does on it (see ``_watch``): the
    first step (everything cold, a capture in default/full), the first COPY_STEPS (host<->device
    copies counted: the function mode stays on), every GRAD_STATS_EVERY-th (all gradient
    columns, copies counted, and without the native extension light mode's graph walk), default
    mode's sampled captures, and the steady steps in between.  The first steps of a plain or
    profiler chunk are classed apart too: a chunk's first steps pay for the chunk before it
    (caches and allocator left by a profiler or full-mode chunk), and a plain median taken
    over them as well, while the watched configurations' exclude them, made every ratio look
    smaller -- the more so with full and the profiler in the mix (the small CNN's `light`
    1.04x with all five configurations, 1.18x with plain, light and default only)."""
    if k == 0:
        return "first"
    if config in ("plain", "profiler", "full"):
        return "early" if k < COPY_STEPS else "steady"
    if config == "default" and k % sample_every == 0:
        return "capture"
    if k < COPY_STEPS:
        return "early"
    return "tenth" if k % GRAD_STATS_EVERY == 0 else "steady"


def bench(
    kind: str, steps: int, chunk: int, sample_every: int, out: Path, configs: tuple[str, ...] = CONFIGS
) -> dict[str, float]:
    """Per-step ms for each configuration as one watch over ``steps`` steps pays it, robust to load.

    Every configuration trains the *same* model and optimizer (one set of tensors in memory:
    separate copies measured up to ±25% apart on this shared machine with nothing watched),
    in chunks whose order is shuffled every round, so drift in the machine's speed falls on
    all of them alike.  Each chunk is a fresh watch, so its step ``i`` is a watch's step ``i``:
    the steps are sorted into classes by what the capture does on them (``step_class``; default
    mode samples step CHUNK_CAPTURE of each chunk, a warm capture), each class's cost is the
    median of its steps, and a configuration's figure is the mean over steps 0..steps-1 of one
    watch with ``sample_every`` -- each step at its class's median.  So the first step, the
    early steps and the every-tenth steps count as often as in a real run of that length, not
    once per chunk.  The profiler's exit (post-processing) cost is spread over the steps of its
    chunk, as a user would pay it.
    """
    model, batch = make(kind)
    state = {"model": model, "batch": batch, "opt": torch.optim.Adam(model.parameters(), lr=1e-3)}
    run_chunk("plain", state, 3, out)  # warm-up
    writer: dict[str, float] = {c: 0.0 for c in configs}
    by_class: dict[str, dict[str, list[float]]] = {c: {} for c in configs}
    overhead: dict[str, float] = {c: 0.0 for c in configs}
    order = list(configs)
    rng = random.Random(0)
    done = 0
    while done < steps:
        n = min(chunk, steps - done)
        rng.shuffle(order)
        for config in order:
            # a chunk's leftover garbage (the profiler's events, captured steps' records) is
            # collected between chunks, on nobody's clock: else a full collection fell in the
            # first steps of whichever configuration ran next (a default-mode first step cost
            # 4-5 plain steps after a profiler chunk, 1.3-1.5 otherwise)
            gc.collect()
            times, extra, wcpu = run_chunk(config, state, n, out)
            writer[config] += wcpu
            for i, t in enumerate(times):
                cls = (
                    "capture"
                    if config == "default" and i == CHUNK_CAPTURE
                    else step_class(config, i, CHUNK_CAPTURE)
                )
                by_class[config].setdefault(cls, []).append(t)
            overhead[config] += extra
        done += n
    result: dict[str, float] = {}
    for config in configs:
        med = {cls: statistics.median(v) for cls, v in by_class[config].items()}
        # a class a short chunk never reached is charged as a first step: never under-counted
        cost = [
            med.get(step_class(config, k, sample_every), med["first"] if "first" in med else med["steady"])
            for k in range(steps)
        ]
        result[config] = sum(cost) / steps * 1e3
        result.update({f"{config}:{cls}": v * 1e3 for cls, v in med.items()})
    for config in configs:
        result[f"{config}_writer"] = writer[config] / done * 1e3
    if "default" in configs:
        steps_of = by_class["default"]
        result["captured_step"] = statistics.median(steps_of.get("capture") or steps_of["first"]) * 1e3
        result["first_step"] = statistics.median(steps_of["first"]) * 1e3
    if "profiler" in configs:
        result["profiler"] += overhead["profiler"] / steps * 1e3
    return result


def _timing() -> str:
    if DEVICE.type != "cuda":
        return "CPU time of the training thread"
    how = "back to back (no sync between steps)" if STREAM else "synchronized per step"
    return f"wall time {how} on {torch.cuda.get_device_name()}"


def import_cost() -> float:
    """Seconds ``import torchscope`` plus loading ``watch`` (the package imports lazily) add on top
    of ``import torch`` (fresh interpreter, best of 3)."""
    code = (
        "import time; import torch; t = time.perf_counter(); import torchscope; torchscope.watch; "
        "print(time.perf_counter() - t)"
    )
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
            for _ in range(3)]  # fmt: skip
    return min(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument(
        "--chunk", type=int, default=20, help="steps per round-robin chunk (one fresh watch each)"
    )
    ap.add_argument("--sample-every", type=int, default=50, help="default mode's sample_every")
    ap.add_argument("--quick", action="store_true", help="40 steps per configuration")
    ap.add_argument("--models", default="transformer,cnn,mlp")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="a subset to compare, e.g. plain,light")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda on a machine with a GPU")
    ap.add_argument(
        "--stream", action="store_true", help="CUDA: time steps back to back, no sync between them"
    )
    ap.add_argument("--classes", action="store_true", help="also print each step class's median (see step_class)")
    args = ap.parse_args()
    global DEVICE, STREAM
    DEVICE = torch.device(args.device)
    STREAM = args.stream and DEVICE.type == "cuda"
    if args.quick:
        args.steps = 40
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, {args.steps} steps per configuration in chunks of {args.chunk}, medians of steps, "
        f"default mode sample_every={args.sample_every}, 1 thread, "
        f"{_timing()}\n"
    )
    print(
        f"import torchscope + torchscope.watch after import torch: {import_cost() * 1e3:.0f} ms (target < 300 ms)\n"
    )
    configs = tuple(c for c in CONFIGS if c in args.configs.split(",") or c == "plain")
    cols = [c for c in configs if c != "plain"]
    both = "full" in configs and "profiler" in configs
    head = ["model", "plain ms/step", *cols] + (["profiler ÷ full"] if both else [])
    head += ["captured step", "first step"] if "default" in configs else []
    watched = [c for c in cols if c != "profiler"]
    head += [f"writer thread ({'/'.join(watched)})"] if watched else []
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.models.split(","):
            r = bench(kind, args.steps, args.chunk, args.sample_every, Path(tmp), configs)
            base = r["plain"]
            row = [kind, f"{base:.2f}", *(f"{r[c] / base:.2f}×" for c in cols)]
            row += [f"{r['profiler'] / r['full']:.2f}×"] if both else []
            row += (
                [f"{r['captured_step'] / base:.1f}×", f"{r['first_step'] / base:.1f}×"]
                if "default" in configs
                else []
            )
            row += ["/".join(f"{r[f'{c}_writer'] / base:.2f}×" for c in watched)] if watched else []
            print("| " + " | ".join(row) + " |", flush=True)
            if args.classes:
                print("  " + ", ".join(f"{k} {v / base:.2f}×" for k, v in r.items() if ":" in k), flush=True)


if __name__ == "__main__":
    main()
