"""Capture overhead, side by side in one run: plain vs light vs default vs full vs torch.profiler.

Reference models (issue 3) on CPU with one thread: a 4-layer transformer (d=64, 4 heads,
batch 8x32 tokens), a small CNN and an MLP.  Configurations run round-robin in chunks of
``--chunk`` steps (a fresh watch per chunk, so default mode's step-0 capture recurs every
chunk exactly like ``sample_every=chunk``), which spreads any load on the machine evenly over
all configurations.  Time is the main thread's CPU time (torch runs on it with one thread),
so other processes on a shared machine do not skew the ratios; wall time is printed too.

    python benchmarks/bench_capture.py            # 200 steps per configuration
    python benchmarks/bench_capture.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torchscope
from torch import nn

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


def make(kind: str) -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    if kind == "transformer":
        return Transformer(), lambda: (torch.randint(0, 256, (8, 32)), torch.randint(0, 256, (8 * 32,)))
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
def configured(config: str, model: nn.Module, opt: torch.optim.Optimizer, out: Path) -> Iterator[None]:
    if config == "plain":
        yield
    elif config == "profiler":
        with torch.profiler.profile(record_shapes=True, profile_memory=True):
            yield
    else:
        with torchscope.watch(model, opt, server=None, record=out / f"{config}-{time.monotonic_ns()}.tscope", mode=config):
            yield


def run_chunk(config: str, state: dict[str, Any], steps: int, out: Path) -> tuple[float, float]:
    model, batch, opt = state["model"], state["batch"], state["opt"]
    data = [batch() for _ in range(steps)]
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    with configured(config, model, opt, out):
        for x, y in data:
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return time.thread_time() - cpu0, time.perf_counter() - wall0


def bench(kind: str, steps: int, chunk: int, out: Path) -> dict[str, tuple[float, float]]:
    states = {}
    for config in CONFIGS:
        model, batch = make(kind)
        states[config] = {"model": model, "batch": batch, "opt": torch.optim.Adam(model.parameters(), lr=1e-3)}
        run_chunk("plain", states[config], 3, out)  # warm-up
    totals = {c: [0.0, 0.0] for c in CONFIGS}
    done = 0
    while done < steps:
        n = min(chunk, steps - done)
        for config in CONFIGS:
            cpu, wall = run_chunk(config, states[config], n, out)
            totals[config][0] += cpu
            totals[config][1] += wall
        done += n
    return {c: (v[0] / steps * 1e3, v[1] / steps * 1e3) for c, v in totals.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--chunk", type=int, default=50, help="steps per round-robin chunk (= default mode's sample_every)")
    ap.add_argument("--quick", action="store_true", help="20 steps per configuration, chunks of 10")
    ap.add_argument("--models", default="transformer,cnn,mlp")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.chunk = 20, 10
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {args.steps} steps per configuration, chunks of {args.chunk}, 1 thread\n")
    print("| model | plain ms/step (cpu / wall) | light | default | full | profiler | profiler ÷ full |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.models.split(","):
            r = bench(kind, args.steps, args.chunk, Path(tmp))
            base = r["plain"][0]

            def ratio(c: str, r: dict[str, tuple[float, float]] = r, base: float = base) -> str:
                return f"{r[c][0] / base:.2f}× (wall {r[c][1] / r['plain'][1]:.2f}×)"

            print(
                f"| {kind} | {r['plain'][0]:.2f} / {r['plain'][1]:.2f} | {ratio('light')} | {ratio('default')} | "
                f"{ratio('full')} | {ratio('profiler')} | {r['profiler'][0] / r['full'][0]:.2f}× |",
                flush=True,
            )


if __name__ == "__main__":
    main()
