"""Dashboard benchmark: headless Chromium on a synthetic 48-layer transformer step.

Not a pass/fail test: it prints a markdown table of real timings next to the targets of
issue 6.  A synthetic but schema-true session (>= 10,000 forward ops + grad_fn nodes) is
written with the real session-file writer, imported into a real `torchscope serve`, and
opened in Debian's Chromium:

- first paint of the collapsed graph after the graph data arrived,
- expanding one group (the 48-block ModuleList; one block),
- pan/zoom frames per second with everything expanded (zoomed out, and at reading zoom),
- the page's JS heap with everything expanded (CDP, after a GC),
- the minimap's part of a pan frame, and its whole scene redrawn (an overlay change),
- the memory chart of a 100,000-step session drawn,
- a 100,000-step loss with a spike: setData (finding the bulk range), drawn fitted and whole.

``--select``: instead, a real training run (a deep residual MLP, ``--blocks`` blocks, one
step watched by ``torchscope.watch``) in a subprocess, whose graph, everything expanded, has
tens of thousands of nodes; timed: expand everything, then clicks that select a node (from the
click until the details panel shows it and the next frame is drawn).  The same script trains
the model of tests/browser/test_dashboard_big_graph.py (``--train PATH``).

    python benchmarks/bench_dashboard.py [--layers 48] [--steps 100000]
    python benchmarks/bench_dashboard.py --select [--blocks 1200] [--clicks 12] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from torchscope.sessionfile import SessionFileWriter

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]

# Layer norm and rotary embeddings written out as the elementwise ops they decompose into.
_LN = ["aten::mean", "aten::sub", "aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul", "aten::mul", "aten::add", "aten::native_layer_norm"]
_ROTARY = ["aten::slice", "aten::slice", "aten::neg", "aten::cat", "aten::mul", "aten::mul", "aten::add", "aten::mul"]

# The aten ops one logical layer runs, by submodule: (submodule, [op names]).  Each op takes
# the previous op's output; parameter ops also take the submodule's weight (and bias).
_LAYER = [
    ("ln1", _LN),
    ("attn.q", ["aten::view", "aten::t", "aten::addmm", "aten::view", *_ROTARY]),
    ("attn.k", ["aten::view", "aten::t", "aten::addmm", "aten::view", *_ROTARY]),
    ("attn.v", ["aten::view", "aten::t", "aten::addmm", "aten::view"]),
    ("attn", ["aten::view", "aten::transpose", "aten::view", "aten::transpose", "aten::transpose", "aten::expand",
              "aten::clone", "aten::_unsafe_view", "aten::bmm", "aten::view", "aten::div", "aten::masked_fill",
              "aten::amax", "aten::sub", "aten::_softmax", "aten::native_dropout", "aten::expand", "aten::view", "aten::bmm", "aten::view",
              "aten::transpose", "aten::clone", "aten::view"]),
    ("attn.out", ["aten::view", "aten::t", "aten::addmm", "aten::view"]),
    ("attn.drop", ["aten::native_dropout", "aten::mul"]),
    ("", ["aten::add"]),
    ("ln2", _LN),
    ("mlp.fc1", ["aten::view", "aten::t", "aten::addmm", "aten::view"]),
    ("mlp.act", ["aten::mul", "aten::pow", "aten::mul", "aten::add", "aten::mul", "aten::tanh", "aten::add", "aten::mul"]),
    ("mlp.fc2", ["aten::view", "aten::t", "aten::addmm", "aten::view"]),
    ("mlp.drop", ["aten::native_dropout", "aten::mul"]),
    ("", ["aten::add"]),
]
_PARAM_MODULES = {"ln1", "ln2", "attn.q", "attn.k", "attn.v", "attn.out", "mlp.fc1", "mlp.fc2"}
_TYPES = {"ln1": "LayerNorm", "ln2": "LayerNorm", "attn": "SelfAttention", "attn.q": "Linear", "attn.k": "Linear",
          "attn.v": "Linear", "attn.out": "Linear", "attn.drop": "Dropout", "mlp": "MLP", "mlp.fc1": "Linear",
          "mlp.act": "GELU", "mlp.fc2": "Linear", "mlp.drop": "Dropout"}
_BACKWARD = {"aten::mean": "MeanBackward1", "aten::sub": "SubBackward0", "aten::pow": "PowBackward0", "aten::rsqrt": "RsqrtBackward0",
             "aten::mul": "MulBackward0", "aten::slice": "SliceBackward0", "aten::neg": "NegBackward0", "aten::cat": "CatBackward0",
             "aten::tanh": "TanhBackward0", "aten::amax": "AmaxBackward0",
             "aten::native_layer_norm": "NativeLayerNormBackward0", "aten::addmm": "AddmmBackward0", "aten::t": "TBackward0",
             "aten::view": "ViewBackward0", "aten::_unsafe_view": "UnsafeViewBackward0", "aten::transpose": "TransposeBackward0",
             "aten::expand": "ExpandBackward0", "aten::clone": "CloneBackward0", "aten::bmm": "BmmBackward0",
             "aten::div": "DivBackward0", "aten::masked_fill": "MaskedFillBackward0", "aten::_softmax": "SoftmaxBackward0",
             "aten::native_dropout": "NativeDropoutBackward0", "aten::add": "AddBackward0", "aten::gelu": "GeluBackward0",
             "aten::embedding": "EmbeddingBackward0", "aten::nll_loss_forward": "NllLossBackward0",
             "aten::_log_softmax": "LogSoftmaxBackward0"}


class _Builder:
    def __init__(self, d: int, seq: int, batch: int) -> None:
        self.d, self.seq, self.batch = d, seq, batch
        self.ops: list[dict[str, Any]] = []
        self.tensors: list[dict[str, Any]] = []
        self.nodes: list[dict[str, Any]] = []
        self.edges: list[list[int]] = []
        self.params: list[dict[str, Any]] = []
        self.modules: list[dict[str, Any]] = [{"path": "", "type": "GPT", "n_params": 0, "training": True}]
        self.grad_fn_of: dict[int, int] = {}  # tensor id -> node id
        self.acc_of: dict[int, int] = {}  # param tensor id -> AccumulateGrad node id
        self.live = 0
        self.timeline: list[list[int]] = []

    def tensor(self, shape: list[int], param: str | None = None, storage: int | None = None) -> int:
        tid = len(self.tensors)
        numel = math.prod(shape)
        t: dict[str, Any] = {"id": tid, "shape": shape, "dtype": "float32", "device": "cpu", "requires_grad": True,
                             "is_leaf": param is not None, "stride": _strides(shape), "storage": tid if storage is None else storage,
                             "offset": 0, "nbytes": numel * 4}
        if param:
            t["param"] = param
        self.tensors.append(t)
        return tid

    def param(self, module: str, name: str, shape: list[int]) -> int:
        qual = f"{module}.{name}" if module else name
        tid = self.tensor(shape, param=qual)
        self.params.append({"name": qual, "module": module, "shape": shape, "dtype": "float32", "device": "cpu",
                            "requires_grad": True, "numel": math.prod(shape), "nbytes": math.prod(shape) * 4})
        nid = len(self.nodes)
        self.nodes.append({"id": nid, "name": "AccumulateGrad", "param": qual, "module": module})
        self.acc_of[tid] = nid
        return tid

    def op(self, name: str, module: str, inputs: list[int], shape: list[int]) -> int:
        oid = len(self.ops)
        view = name in ("aten::view", "aten::t", "aten::transpose", "aten::expand", "aten::_unsafe_view")
        out = self.tensor(shape, storage=self.tensors[inputs[0]]["storage"] if view else None)
        alloc = 0 if view else math.prod(shape) * 4
        self.live += alloc
        rec: dict[str, Any] = {"id": oid, "name": name, "module": module, "call": 0, "phase": "forward", "micro": 0,
                               "inputs": inputs, "outputs": [out], "grad_mode": True, "inplace": False,
                               "src": "model.py:42", "dur_us": 5.0 + random.random() * (200 if not view else 5),
                               "alloc": alloc, "free": 0, "live": self.live}
        nid = len(self.nodes)
        saved = [] if view else [{"name": "_saved_self", "shape": self.tensors[inputs[0]]["shape"], "dtype": "float32",
                                  "nbytes": self.tensors[inputs[0]]["nbytes"]}]
        self.nodes.append({"id": nid, "name": _BACKWARD.get(name, "Backward0"), "module": module, "op": oid, "saved": saved,
                           "saved_bytes": sum(s["nbytes"] for s in saved), "micro": 0})
        rec["grad_fn"] = nid
        for k, t in enumerate(inputs):
            src = self.grad_fn_of.get(t, self.acc_of.get(t))
            if src is not None:
                self.edges.append([nid, src, k])
        self.grad_fn_of[out] = nid
        self.tensors[out]["grad_fn"] = nid
        self.ops.append(rec)
        self.timeline.append([oid, self.live])
        return out


def _strides(shape: list[int]) -> list[int]:
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return list(reversed(st))


def transformer_events(layers: int = 48, steps: int = 3, d: int = 64, seq: int = 32, batch: int = 4,
                       name: str = "synthetic-gpt") -> list[dict[str, Any]]:
    random.seed(0)
    b = _Builder(d, seq, batch)
    x = b.tensor([batch, seq])
    emb = b.param("embed", "weight", [1000, d])
    b.modules.append({"path": "embed", "type": "Embedding", "n_params": 1, "training": True})
    h = b.op("aten::embedding", "embed", [emb, x], [batch, seq, d])
    b.modules.append({"path": "layers", "type": "ModuleList", "n_params": 0, "training": True})
    for i in range(layers):
        base = f"layers.{i}"
        b.modules.append({"path": base, "type": "Block", "n_params": 0, "training": True})
        for sub in _TYPES:
            b.modules.append({"path": f"{base}.{sub}", "type": _TYPES[sub], "n_params": 2 if sub in _PARAM_MODULES else 0, "training": True})
        weights = {sub: (b.param(f"{base}.{sub}", "weight", [d, d] if "ln" not in sub else [d]),
                         b.param(f"{base}.{sub}", "bias", [d])) for sub in _PARAM_MODULES}
        resid = h
        for sub, names in _LAYER:
            module = f"{base}.{sub}" if sub else base
            for n in names:
                ins = [h]
                if n in ("aten::addmm", "aten::native_layer_norm"):
                    ins += list(weights[sub])
                if n == "aten::add" and not sub:
                    ins.append(resid)
                h = b.op(n, module, ins, [batch, seq, d])
                if n == "aten::add" and not sub:
                    resid = h
    lnf = b.param("ln_f", "weight", [d])
    b.modules.append({"path": "ln_f", "type": "LayerNorm", "n_params": 1, "training": True})
    h = b.op("aten::native_layer_norm", "ln_f", [h, lnf], [batch, seq, d])
    head = b.param("head", "weight", [1000, d])
    b.modules.append({"path": "head", "type": "Linear", "n_params": 1, "training": True})
    h = b.op("aten::addmm", "head", [h, head], [batch * seq, 1000])
    h = b.op("aten::_log_softmax", "", [h], [batch * seq, 1000])
    h = b.op("aten::nll_loss_forward", "", [h], [])
    root = b.grad_fn_of[h]
    # backward runs in reverse creation order; record it as the execution order
    for k, node in enumerate(sorted((x for x in b.nodes if x["name"] != "AccumulateGrad"), key=lambda x: -x["id"])):
        node["order"] = k
        node["dur_us"] = 3.0 + random.random() * 100
    t0 = time.time()
    sid = f"bench-{layers}-{int(t0)}"
    events: list[dict[str, Any]] = [{
        "kind": "session", "schema": [1, 0], "session_id": sid, "name": name, "started_at": t0, "pid": 1, "host": "bench",
        "rank": 0, "world_size": 1, "mode": "default", "torch_version": "2.13.0", "device": "cpu", "model": "GPT",
        "modules": b.modules, "params": b.params, "optimizer": "AdamW"}]
    n_params = len(b.params)
    pbytes = sum(p["nbytes"] for p in b.params)
    for s in range(steps):
        norms = [abs(random.gauss(1.0, 0.3)) * (0.97 ** (i // 12)) for i in range(n_params)]
        events.append({"kind": "step", "step": s, "rank": 0, "t": t0 + s, "duration_us": 100_000, "loss": 7.0 - 0.01 * s,
                       "graph_captured": s < 2, "grads": {"norm": norms, "max_abs": [n / 10 for n in norms], "nan": [0] * n_params,
                       "inf": [0] * n_params, "none": []},
                       "memory": {"params": pbytes, "grads": pbytes, "optimizer": 2 * pbytes, "saved": b.live, "live": 4 * pbytes + b.live,
                                  "peak": 4 * pbytes + 2 * b.live}})
        if s < 2:
            events.append({"kind": "graph", "step": s, "rank": 0, "micro": 0, "complete": True, "ops": b.ops, "tensors": b.tensors,
                           "nodes": b.nodes, "edges": b.edges, "root": root, "memory_timeline": b.timeline})
    events.append({"kind": "end", "t": t0 + steps, "status": "finished", "steps": steps})
    return events


def memory_steps_events(n: int) -> list[dict[str, Any]]:
    """A session of `n` steps with memory statistics only (the 100,000-step chart)."""
    t0 = time.time()
    events: list[dict[str, Any]] = [{"kind": "session", "schema": [1, 0], "session_id": f"bench-mem-{n}-{int(t0)}", "name": f"memory-{n}",
                                     "started_at": t0, "rank": 0, "world_size": 1, "model": "Net", "modules": [], "params": []}]
    for s in range(n):
        live = 1_000_000 + (s % 1000) * 1000 + int(300_000 * math.sin(s / 5000))
        events.append({"kind": "step", "step": s, "rank": 0, "t": t0 + s * 0.01, "duration_us": 1000,
                       "memory": {"params": 400_000, "grads": 400_000, "optimizer": 800_000, "saved": live // 3, "live": live, "peak": live + 50_000}})
    events.append({"kind": "end", "t": t0 + n, "status": "finished", "steps": n})
    return events


def write_session(path: Path, events: list[dict[str, Any]], chunk: int = 2000) -> Path:
    w = SessionFileWriter(path)
    batch: list[dict[str, Any]] = []
    for ev in events:
        if ev["kind"] == "graph":  # graph events get frames of their own
            if batch:
                w.append(batch)
                batch = []
            w.append([ev])
            continue
        batch.append(ev)
        if len(batch) >= chunk:
            w.append(batch)
            batch = []
    if batch:
        w.append(batch)
    w.close()
    return path


# ----------------------------------------------------------------------------- the measurement
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(data: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "torchscope.server.cli", "serve", "--port", str(port), "--data", str(data),
                             "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/api/health", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    raise SystemExit("torchscope serve did not start")


def _import(url: str, path: Path) -> str:
    import httpx

    with open(path, "rb") as f:
        r = httpx.post(url + "/api/sessions/import", files={"file": (path.name, f, "application/octet-stream")}, timeout=600)
    r.raise_for_status()
    body = r.json()
    return str(body.get("id") or body.get("session_id") or body["ids"][0])


_PANZOOM = """async ([seconds, zoomIn]) => {
  const c = window.__torchscope.app.views.graph.obj.canvas;
  if (zoomIn) { c.scale = 1; c.tx = 0; c.ty = -c.scene.height / 2; } else c.show(c.overviewView());
  const t0 = performance.now(); let frames = 0; let worst = 0; let last = t0;
  await new Promise((done) => {
    const tick = () => {
      const now = performance.now();
      worst = Math.max(worst, now - last); last = now;
      if (now - t0 > seconds * 1000) return done();
      c.tx += 7; c.ty -= 5; c.zoomAt(c.w / 2, c.h / 2, frames % 40 < 20 ? 1.01 : 0.99);
      c.pending = false; c.draw(); frames++;
      requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
  });
  return [frames / ((performance.now() - t0) / 1000), worst];
}"""

_EXPAND = """async ([path]) => {
  const g = window.__torchscope.app.views.graph.obj;
  const t0 = performance.now();
  await window.__torchscope.expand(path);
  await new Promise((r) => requestAnimationFrame(() => r()));
  return [performance.now() - t0, g.lastLayoutMs];
}"""


# ----------------------------------------------------------------------------- a real big graph
def train(record: Path, blocks: int, per_stage: int = 20, name: str = "big-graph") -> None:
    """One watched training step of a deep residual MLP: ``blocks`` blocks ``x + mlp(norm(x))``
    in stages of ``per_stage`` (an nn.ModuleList of nn.Sequential), recorded to ``record``.
    About 20 graph nodes and 10 module frames a block, everything expanded."""
    import torch
    from torch import nn

    import torchscope

    d = 8

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.mlp(self.norm(x))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(4, d)
            sizes = [min(per_stage, blocks - i) for i in range(0, blocks, per_stage)]
            self.stages = nn.ModuleList([nn.Sequential(*[Block() for _ in range(n)]) for n in sizes])
            self.head = nn.Linear(d, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed(x)
            for stage in self.stages:
                h = stage(h)
            return self.head(h)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w: Any = torchscope.watch(model, opt, server=None, record=str(record), name=name)
    x, y = torch.randn(2, 4), torch.randn(2, 1)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    w.close()


def record_big_graph(out: Path, blocks: int, name: str = "big-graph") -> Path:
    """A real training run of train() in a subprocess, recorded to ``out``."""
    subprocess.run([sys.executable, __file__, "--train", str(out), "--blocks", str(blocks), "--name", name],
                   check=True, timeout=900)
    return out


_CLICK_AT = """([key]) => {
  // the item in the middle of the canvas (not selected), and where to click it, in page pixels
  const c = window.__torchscope.app.views.graph.obj.canvas, it = c.scene.byKey.get(key);
  c.centerOn([it.box]); c.pending = false; c.draw();
  const r = c.canvas.getBoundingClientRect();
  if (!window.__clickT0Set) {
    window.__clickT0Set = true;
    window.addEventListener("pointerdown", () => { window.__clickT0 = performance.now(); }, true);
  }
  return [r.left + c.tx + (it.box[0] + it.box[2] / 2) * c.scale, r.top + c.ty + (it.box[1] + it.box[3] / 2) * c.scale];
}"""

_SELECTED = """async ([key]) => {
  // from the pointerdown until the node is selected, the details panel shows it, and the next
  // frame was drawn
  const g = window.__torchscope.app.views.graph.obj;
  while (g.selected !== key || !g.details.textContent) await new Promise((r) => setTimeout(r, 0));
  await new Promise((r) => requestAnimationFrame(() => r()));
  return performance.now() - window.__clickT0;
}"""

_TIMED = """async ([what]) => {
  const g = window.__torchscope.app.views.graph.obj;
  const t0 = performance.now();
  if (what === "expand all") await g.expandAll();
  else if (what === "collapse all") await g.collapseAll();
  else await g.toggleGroup(g.model.gIndex.get(what));
  await new Promise((r) => requestAnimationFrame(() => r()));
  return [performance.now() - t0, g.lastLayoutMs, g.scene.items.length, g.scene.frames.length];
}"""


def _serve_from(page: Any, folder: Path) -> None:
    """The page gets /static/graph/<name>.js from ``folder`` where it has that file."""
    def fulfil(route: Any) -> None:
        name = route.request.url.split("?")[0].rsplit("/", 1)[-1]
        f = folder / name
        if f.is_file():
            route.fulfill(status=200, content_type="text/javascript", body=f.read_text())
        else:
            route.continue_()

    page.route("**/static/graph/*.js*", fulfil)


def bench_select(blocks: int, clicks: int, baseline: Path | None = None) -> None:
    """Expand everything on a real run's graph; time expand/collapse and clicks that select nodes.
    ``baseline``: a folder of frontend/graph/*.js files served in place of the checkout's (the
    code before a change, for a before/after on the same run)."""
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="bench-select-"))
    t0 = time.perf_counter()
    record_big_graph(tmp / "big.tscope", blocks)
    train_s = time.perf_counter() - t0
    proc, url = _serve(tmp / "data")
    rows: list[tuple[str, str]] = [(f"training run recorded ({blocks} residual blocks, one step)", f"{train_s:.1f} s")]
    try:
        sid = _import(url, tmp / "big.tscope")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            if baseline:
                _serve_from(page, baseline)
            page.goto(f"{url}/sessions/{sid}?view=graph")
            page.wait_for_function("window.__torchscope && window.__torchscope.state().graph && window.__torchscope.state().graph.firstPaintMs")
            ms, lay, items, frames = page.evaluate(_TIMED, ["expand all"])
            rows.append((f"expand all ({items:,} nodes, {frames:,} frames drawn)", f"{ms:.0f} ms (layout {lay:.0f} ms)"))
            keys = page.evaluate("""([n]) => {
              const items = window.__torchscope.app.views.graph.obj.scene.items.filter((it) => it.group === undefined);
              return Array.from({ length: n }, (_, i) => items[Math.floor((i + 0.5) * items.length / n)].key);
            }""", [clicks])
            times = []
            for key in keys:
                x, y = page.evaluate(_CLICK_AT, [key])
                page.mouse.click(x, y)
                times.append(page.evaluate(_SELECTED, [key]))
            times.sort()
            rows.append((f"select a node by a click ({clicks} clicks over the graph)",
                         f"median {times[len(times) // 2]:.0f} ms, worst {times[-1]:.0f} ms"))
            block = f"forward:stages.{blocks // 2 // 20}.{(blocks // 2) % 20}"
            ms, lay, _, _ = page.evaluate(_TIMED, [block])
            rows.append(("collapse one block (everything else expanded)", f"{ms:.0f} ms (layout {lay:.0f} ms)"))
            ms, lay, _, _ = page.evaluate(_TIMED, [block])
            rows.append(("expand it again", f"{ms:.0f} ms (layout {lay:.0f} ms)"))
            ms, lay, _, _ = page.evaluate(_TIMED, ["collapse all"])
            rows.append(("collapse all", f"{ms:.0f} ms (layout {lay:.0f} ms)"))
            browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    print("| measure (headless Chromium, Canvas 2D) | result |\n|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} |")


# least of several tries (shared cores): the minimap's update per pan frame, and its scene drawn
_MINIMAP = """() => {
  const m = window.__torchscope.app.views.graph.obj.minimap, c = m.graph, N = 200;
  let t = performance.now();
  for (let i = 0; i < N; i++) { c.tx += 1; m.update(); }
  const mini = (performance.now() - t) / N;
  const scene = [];
  for (let i = 0; i < 3; i++) { t = performance.now(); m.drawCache(window.devicePixelRatio || 1); scene.push(performance.now() - t); }
  return [mini, Math.min(...scene)];
}"""

# a 100,000-step series with one spike and one dip, in a LineChart of its own: least of tries
_SPIKE = """async () => {
  const { LineChart } = await import("/static/chart.js");
  const host = document.createElement("div"); host.style.width = "900px"; document.body.append(host);
  const c = new LineChart(host, { title: "long" });
  const n = 100000, x = new Array(n), y = new Array(n);
  for (let i = 0; i < n; i++) { x[i] = i; y[i] = 2 + Math.sin(i / 500) + 0.1 * ((i * 7919) % 13) / 13; }
  y[31337] = 7e27; y[77777] = -5e20;
  const sets = [], fit = [], whole = [];
  for (let k = 0; k < 3; k++) { const t = performance.now(); c.setData(x, [{ name: "loss", y: y.slice() }]); sets.push(performance.now() - t); }
  for (let k = 0; k < 7; k++) { c.fitChoice = true; fit.push(c.draw()); c.fitChoice = false; whole.push(c.draw()); }
  return [Math.min(...sets), Math.min(...fit), Math.min(...whole)];
}"""


def main() -> None:
    ap = argparse.ArgumentParser(description="dashboard benchmark (headless Chromium)")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--steps", type=int, default=100_000, help="steps of the memory-chart session")
    ap.add_argument("--select", action="store_true", help="time selection and expansion on a real run's big graph")
    ap.add_argument("--blocks", type=int, default=1200, help="residual blocks of the real run (--select, --train)")
    ap.add_argument("--clicks", type=int, default=12, help="nodes selected by a click (--select)")
    ap.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                    help="serve frontend/graph/*.js from DIR where it has them (--select: the code before a change)")
    ap.add_argument("--train", type=Path, default=None, metavar="PATH", help="only record the real run to PATH")
    ap.add_argument("--name", default="big-graph", help="the recorded run's name (--train)")
    args = ap.parse_args()
    if args.train:
        return train(args.train, args.blocks, name=args.name)
    if args.select:
        return bench_select(args.blocks, args.clicks, args.baseline)
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="bench-dashboard-"))
    events = transformer_events(args.layers)
    graph = next(e for e in events if e["kind"] == "graph")
    n_ops, n_nodes = len(graph["ops"]), len(graph["nodes"])
    write_session(tmp / "gpt.tscope", events)
    write_session(tmp / "mem.tscope", memory_steps_events(args.steps))
    proc, url = _serve(tmp / "data")
    rows: list[tuple[str, str, str]] = []
    try:
        gpt, mem = _import(url, tmp / "gpt.tscope"), _import(url, tmp / "mem.tscope")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{url}/sessions/{gpt}?view=graph")
            page.wait_for_function("window.__torchscope && window.__torchscope.state().graph && window.__torchscope.state().graph.firstPaintMs")
            first = page.evaluate("window.__torchscope.state().graph.firstPaintMs")
            fetch_ms = page.evaluate("Math.max(...performance.getEntriesByType('resource').filter(e => e.name.includes('/graph?')).map(e => e.duration))")
            rows.append((f"graph data fetched from the server ({n_ops:,} ops + {n_nodes:,} grad_fn nodes)", f"{fetch_ms:.0f} ms", "–"))
            rows.append(("first paint of the collapsed graph after the data arrived", f"{first:.0f} ms", "< 1 s"))
            ms, lay = page.evaluate(_EXPAND, ["layers"])
            rows.append((f"expand one group: `layers` ({args.layers} blocks)", f"{ms:.0f} ms (layout {lay:.1f} ms)", "< 200 ms"))
            ms, lay = page.evaluate(_EXPAND, ["layers.10"])
            rows.append(("expand one group: `layers.10` (one block)", f"{ms:.0f} ms (layout {lay:.1f} ms)", "< 200 ms"))
            t0 = time.perf_counter()
            page.evaluate("window.__torchscope.expandAll()")
            all_ms = (time.perf_counter() - t0) * 1000
            visible = page.evaluate("window.__torchscope.state().graph.nodes.length")
            rows.append((f"expand everything ({visible:,} nodes drawn)", f"{all_ms:.0f} ms", "–"))
            fps, worst = page.evaluate(_PANZOOM, [3, False])
            rows.append(("pan/zoom, everything expanded, whole graph in view", f"{fps:.0f} fps (worst frame {worst:.0f} ms)", ">= 50 fps"))
            fps, worst = page.evaluate(_PANZOOM, [3, True])
            rows.append(("pan/zoom, everything expanded, reading zoom (labels)", f"{fps:.0f} fps (worst frame {worst:.0f} ms)", ">= 50 fps"))
            mini, scene = page.evaluate(_MINIMAP)
            rows.append(("minimap's part of a pan frame (viewport rectangle over its kept image)", f"{mini:.2f} ms", "< 1 ms"))
            rows.append(("minimap's whole scene redrawn (overlay change), everything expanded", f"{scene:.0f} ms", "< 150 ms"))
            cdp = page.context.new_cdp_session(page)
            cdp.send("HeapProfiler.collectGarbage")
            heap = cdp.send("Runtime.getHeapUsage")["usedSize"] / 2**20
            rows.append(("JS heap, everything expanded (page, after GC)", f"{heap:.0f} MB", "<= 250 MB"))
            page.goto(f"{url}/sessions/{mem}?view=memory")
            page.wait_for_function("(() => { const m = window.__torchscope.state().memory; return m && m.steps > 0; })()", timeout=120_000)
            draw = page.evaluate("window.__torchscope.app.views.memory.obj.drawPerStep()")
            steps = page.evaluate("window.__torchscope.state().memory.steps")
            rows.append((f"memory chart, {steps:,} steps x 8 series drawn", f"{draw:.0f} ms", "< 300 ms"))
            sets, fit, whole = page.evaluate(_SPIKE)
            rows.append(("100,000-step loss with a spike: setData (bulk range by selection)", f"{sets:.0f} ms", "< 300 ms"))
            rows.append(("  drawn with the axis fitted to the bulk / to the whole range", f"{fit:.0f} / {whole:.0f} ms",
                         "fitted <= 2x whole + 10 ms"))
            browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    print("| measure (headless Chromium, Canvas 2D) | result | target |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
