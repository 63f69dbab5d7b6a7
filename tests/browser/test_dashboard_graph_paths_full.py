"""What the thirty-eighth session's QA (38b) found, checked in a real headless Chromium against a
real `torchscope serve`, with runs recorded by a real training script
(`dashboard_train_paths.py`: a Conv2d, a two-layer nn.TransformerEncoder, a head; in full mode,
default mode, and full mode with two micro-batches a step):

- B1: "Path to loss" from a forward op of a full-mode capture lit up nearly the whole backward
  column too (the backward's kernels read the tensors the forward saved, and the walk followed
  every dataflow edge).  From a forward op it is the op's forward dataflow descendants now,
  the same ops as in default mode; from a backward kernel, the gradient's way back to the loss
  (the kernels whose outputs it reads, back to the loss op the backward started from); a
  grad_fn node's way back to the loss's grad_fn and the "does not reach the loss" notes stay.
- B2: the heat map's row of `blocks.layers.0.self_attn` read `blocks.layers.0.…`, its own name
  given up: every row keeps its module's own (last) name, rows stay told apart.
- B3: a module's details said `parameters 2` for a Conv2d 3 -> 16, 3x3 (two tensors): they say
  `448 (weight [16, 3, 3, 3], bias [16])`, as PyTorch counts parameters.

Everything expected is computed here from what the run recorded (the graph event's ops, their
tensor ids and phases) or from the model itself (the training script's facts: p.numel()).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked, module_browser, open_session, recorded, shot  # noqa: F401 - fixtures
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

SCRIPT = Path(__file__).resolve().parent / "dashboard_train_paths.py"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("paths-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each run's session id, its captured step's graph (as the server sends it) and the
    model's facts, by name: full, default, full with 2 micro-batches."""
    d = tmp_path_factory.mktemp("paths-runs")
    res: dict[str, dict[str, Any]] = {}
    for name, args in {"full": ["--mode", "full"], "default": ["--mode", "default"],
                       "accum": ["--mode", "full", "--accum", "2"]}.items():
        facts = d / f"{name}.json"
        sid = recorded(srv, d / f"{name}.tscope", SCRIPT, *args, "--facts", str(facts))
        step = min(g["step"] for g in srv.get(f"/api/sessions/{sid}/graphs"))  # type: ignore[union-attr]
        graph = srv.get(f"/api/sessions/{sid}/graph?step={step}")
        res[name] = {"sid": sid, "graph": graph, "facts": json.loads(facts.read_text())}
    return res


# ----------------------------------------------------------------------------- the recorded graph
def phase(op: dict[str, Any]) -> str:
    return op.get("phase") or "forward"


def dataflow(graph: dict[str, Any]) -> set[tuple[int, int]]:
    """(producer op id, consumer op id): an op reads a tensor id another op wrote last."""
    producer: dict[int, int] = {}
    edges = set()
    for o in sorted(graph["ops"], key=lambda o: o["id"]):
        for t in o.get("inputs", []):
            if t in producer and producer[t] != o["id"]:
                edges.add((producer[t], o["id"]))
        for t in o.get("outputs", []):
            producer[t] = o["id"]
    return edges


def reach(start: int, edges: set[tuple[int, int]], keep: Any = lambda x: True) -> set[int]:
    """``start`` and what its edges reach (an edge a -> b followed only where keep(b))."""
    out: dict[int, list[int]] = {}
    for a, b in edges:
        if keep(b):
            out.setdefault(a, []).append(b)
    seen, stack = {start}, [start]
    while stack:
        for x in out.get(stack.pop(), []):
            if x not in seen:
                seen.add(x)
                stack.append(x)
    return seen


def ops_by_id(graph: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {o["id"]: o for o in graph["ops"]}


def loss_ops(graph: dict[str, Any]) -> set[int]:
    """Each micro-batch's loss: the last forward op it ran (the script's loss / accum); the
    root grad_fn's op among them."""
    last: dict[int, int] = {}
    for o in graph["ops"]:
        if phase(o) == "forward":
            m = o.get("micro", 0)
            last[m] = max(last.get(m, -1), o["id"])
    root = next(n for n in graph["nodes"] if n["id"] == graph["root"])
    assert root["op"] in last.values(), (root, last)
    return set(last.values())


def forward_path(graph: dict[str, Any], op: int) -> set[str]:
    ops = ops_by_id(graph)
    return {f"o{i}" for i in reach(op, dataflow(graph), lambda b: phase(ops[b]) == "forward")}


def backward_path(graph: dict[str, Any], kernel: int) -> set[str]:
    """A backward kernel's way back to the loss: the kernels whose outputs it reads (back to the
    loss op the backward began from), those the loss's gradient flows through."""
    ops, losses = ops_by_id(graph), loss_ops(graph)
    back = {(b, a) for a, b in dataflow(graph) if phase(ops[b]) == "backward" and (phase(ops[a]) == "backward" or a in losses)}
    up = reach(kernel, back)
    down = {(a, b) for b, a in back if a in up and b in up}
    on: set[int] = set()
    for loss in losses & up:
        on |= reach(loss, down)
    return {f"o{i}" for i in on}


def node_path(graph: dict[str, Any], node: int) -> set[str]:
    """A grad_fn node's autograd ancestors: the way back to the loss's grad_fn."""
    return {f"n{i}" for i in reach(node, {(b, a) for a, b, *_ in graph["edges"]})}


# ----------------------------------------------------------------------------- the page
@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


def open_graph(page: Any, srv: ServerProc, sid: str) -> None:
    open_session(page, srv.url, sid, "?view=graph")
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")
    page.evaluate("window.__torchscope.expandAll()")
    page.wait_for_function("window.__torchscope.state().graph.expanded.length > 5")


PATH = """() => { const v = window.__torchscope.app.views.graph.obj, note = document.querySelector('[data-testid=path-note]');
  return { hi: v.highlight ? [...v.highlight] : null, note: note && !note.hidden ? note.textContent : null,
           lit: v.scene.items.filter((it) => it.hi && it.leaf !== undefined).map((it) => it.key) }; }"""


def path_to_loss(page: Any, key: str) -> dict[str, Any]:
    """Select ``key`` and click its details panel's "Path to loss": what is highlighted then."""
    page.evaluate("(k) => window.__torchscope.select(k)", key)
    page.wait_for_function("(k) => window.__torchscope.app.views.graph.obj.selected === k && !window.__torchscope.app.views.graph.obj.highlight",
                           arg=key)
    page.locator("[data-testid=path-to-loss]").click()
    page.wait_for_function("window.__torchscope.app.views.graph.obj.highlight !== null")
    page.wait_for_timeout(100)
    r = page.evaluate(PATH)
    r["hi"] = set(r["hi"])
    return r  # type: ignore[no-any-return]


def find(graph: dict[str, Any], name: str, module: str, ph: str = "forward", micro: int = 0) -> int:
    return next(o["id"] for o in sorted(graph["ops"], key=lambda o: o["id"])
                if o["name"] == name and o.get("module", "") == module and phase(o) == ph and o.get("micro", 0) == micro)


# ----------------------------------------------------------------------------- B1
def test_b1_path_from_a_forward_op_stays_in_the_forward(page: Any, srv: ServerProc, runs: dict[str, dict[str, Any]]) -> None:
    full, default = runs["full"]["graph"], runs["default"]["graph"]
    ops = ops_by_id(full)
    assert sum(phase(o) == "backward" for o in full["ops"]) > 100  # full mode: the backward's kernels recorded
    assert all(phase(o) == "forward" for o in default["ops"])
    # the same forward in both runs (same seed, same model): op i of one is op i of the other
    fwd = [o for o in sorted(full["ops"], key=lambda o: o["id"]) if phase(o) == "forward"]
    assert [(o["name"], o.get("module")) for o in fwd] == [(o["name"], o.get("module")) for o in sorted(default["ops"], key=lambda o: o["id"])]
    (loss,) = loss_ops(full)
    # a view inside layer 0's attention (QA's o40), its first Linear, the conv
    starts = [find(full, "aten::view", "blocks.layers.0.self_attn"), find(full, "aten::addmm", "blocks.layers.0.linear1"),
              find(full, "aten::convolution", "conv")]
    open_graph(page, srv, runs["full"]["sid"])
    for op in starts:
        want = forward_path(full, op)
        assert f"o{loss}" in want and len(want) > 20, (op, want)
        # its output read by backward kernels too (the saved tensors): what the old walk followed
        into_backward = reach(op, dataflow(full)) - reach(op, dataflow(full), lambda b: phase(ops[b]) == "forward")
        got = path_to_loss(page, f"o{op}")
        assert got["hi"] == want, (op, sorted(got["hi"] - want)[:10], sorted(want - got["hi"])[:10], len(into_backward))
        assert all(ops[int(k[1:])]["phase"] == "forward" for k in got["lit"]) and set(got["lit"]) == want, got["lit"]
        assert got["note"] is None, got["note"]  # it reaches the loss
        if op == starts[0]:
            shot(page, "paths-full-forward-op")
    # the same ops as in default mode
    open_graph(page, srv, runs["default"]["sid"])
    for op in starts:
        got = path_to_loss(page, f"o{op}")
        assert got["hi"] == forward_path(default, op) == forward_path(full, op), op
    # an op whose output feeds nothing of the loss (a statistic the model keeps): still said
    open_graph(page, srv, runs["full"]["sid"])
    stray = find(full, "aten::abs", "")
    got = path_to_loss(page, f"o{stray}")
    assert got["hi"] == forward_path(full, stray) and len(got["hi"]) == 2, got  # abs, amax
    assert got["note"] and got["note"].startswith("This op does not reach the loss") and "the 1 op computed from it" in got["note"], got["note"]


def test_b1_path_from_a_backward_kernel_or_grad_fn_goes_back_to_the_loss(page: Any, srv: ServerProc,
                                                                         runs: dict[str, dict[str, Any]]) -> None:
    full = runs["full"]["graph"]
    ops = ops_by_id(full)
    (loss,) = loss_ops(full)
    edges = dataflow(full)
    # layer 0's first Linear, backward: the mm giving its input's gradient (reads the gradient)
    kernels = [o["id"] for o in sorted(full["ops"], key=lambda o: o["id"])
               if phase(o) == "backward" and o["name"] == "aten::mm" and o.get("module") == "blocks.layers.0.linear1"]
    assert len(kernels) == 2, kernels
    open_graph(page, srv, runs["full"]["sid"])
    for k in kernels:
        want = backward_path(full, k)
        assert f"o{loss}" in want and f"o{k}" in want and len(want) > 30, want
        assert all(phase(ops[int(x[1:])]) == "backward" for x in want - {f"o{loss}"})
        got = path_to_loss(page, f"o{k}")
        assert got["hi"] == want, (k, sorted(got["hi"] - want)[:10], sorted(want - got["hi"])[:10])
        assert got["note"] is None, got["note"]
        # every highlighted kernel comes before it and leads to it (none of the forward but the loss)
        assert all(int(x[1:]) <= k for x in got["hi"]), got["hi"]
    shot(page, "paths-full-backward-kernel")
    # a kernel the gradient does not flow through: the .t() of a weight the forward saved
    t = next(o["id"] for o in sorted(full["ops"], key=lambda o: o["id"]) if phase(o) == "backward" and o["name"] == "aten::t"
             and all(phase(ops[a]) == "forward" for a, b in edges if b == o["id"]))
    got = path_to_loss(page, f"o{t}")
    assert got["hi"] == {f"o{t}"}, got
    assert got["note"] and got["note"].startswith("This op, run by backward(), is not on the gradient's way back from the loss"), got["note"]
    # a grad_fn node: its way back to the loss's grad_fn, as before
    node = next(n["id"] for n in full["nodes"] if n["name"] == "AddmmBackward0" and n.get("module") == "blocks.layers.0.linear1")
    got = path_to_loss(page, f"n{node}")
    assert got["hi"] == node_path(full, node) and f"n{full['root']}" in got["hi"] and got["note"] is None, got


def test_b1_with_gradient_accumulation_every_micro_batch_reaches_its_loss(page: Any, srv: ServerProc,
                                                                          runs: dict[str, dict[str, Any]]) -> None:
    acc = runs["accum"]["graph"]
    ops = ops_by_id(acc)
    losses = loss_ops(acc)
    assert len(losses) == 2 and {ops[i].get("micro", 0) for i in losses} == {0, 1}, losses
    open_graph(page, srv, runs["accum"]["sid"])
    for micro in (0, 1):
        (loss,) = (i for i in losses if ops[i].get("micro", 0) == micro)
        op = find(acc, "aten::convolution", "conv", micro=micro)
        got = path_to_loss(page, f"o{op}")
        assert got["hi"] == forward_path(acc, op) and f"o{loss}" in got["hi"], (micro, len(got["hi"]))
        assert got["note"] is None, got["note"]
        kernel = find(acc, "aten::convolution_backward", "conv", "backward", micro)
        got = path_to_loss(page, f"o{kernel}")
        assert got["hi"] == backward_path(acc, kernel) and f"o{loss}" in got["hi"], micro
        assert got["note"] is None, got["note"]


# ----------------------------------------------------------------------------- B2
LABELS = """() => [...document.querySelectorAll('[data-testid=heat-labels] .heat-label:not(.muted)')].map((e) =>
  ({ text: e.textContent, title: e.title, over: e.scrollWidth > e.clientWidth }))"""


def elided(label: str, name: str) -> bool:
    """Whether ``label`` is the dotted path ``name`` with whole parts given up for "…" (its last
    part, the module's own name, kept), maybe followed by the start of its type."""
    path, _, typ = name.partition(" (")
    lpath, sep, ltyp = label.partition(" (")
    pattern = r"\.".join(r".+" if x == "…" else re.escape(x) for x in lpath.split("."))
    if lpath.split(".")[-1] != path.split(".")[-1] or not re.fullmatch(pattern, path):
        return False
    return not sep or ("(" + typ).startswith("(" + ltyp.rstrip("…")) and len(ltyp.rstrip("…")) >= 3


def test_b2_heat_map_rows_keep_the_module_s_own_name(page: Any, srv: ServerProc, runs: dict[str, dict[str, Any]]) -> None:
    facts = runs["full"]["facts"]
    open_session(page, srv.url, runs["full"]["sid"], "?view=gradients")
    page.wait_for_function("document.querySelectorAll('[data-testid=heat-labels] .heat-label:not(.muted)').length >= 8")
    page.wait_for_timeout(200)
    rows = page.evaluate(LABELS)
    shot(page, "paths-heat-labels")
    types = facts["modules"]
    owners = {p["name"].rsplit(".", 1)[0] for p in facts["params"]}
    for r in rows:
        path = r["title"].partition(" (")[0]
        assert r["title"] == f"{path} ({types[path]})" and path in owners, r  # the tooltip: the whole path and type
        assert elided(r["text"], r["title"]), r
        assert not r["over"], r  # fits its column
    texts = [r["text"] for r in rows]
    assert len(set(texts)) == len(texts), texts  # told apart
    by_path = {r["title"].partition(" (")[0]: r["text"] for r in rows}
    for i in (0, 1):
        attn, out = by_path[f"blocks.layers.{i}.self_attn"], by_path[f"blocks.layers.{i}.self_attn.out_proj"]
        # was "blocks.layers.0.…" and "blocks.layers.0.self_attn.…"; whole where the cells leave the
        # room (forty-second session), else cut in the middle, the block's number and own name kept
        assert re.search(rf"(^|\.){i}\.", attn) and attn.partition(" (")[0].endswith(".self_attn"), attn
        assert re.search(rf"(^|\.){i}\.", out) and attn.partition(" (")[0] != out.partition(" (")[0], out
        assert out.partition(" (")[0].endswith(".out_proj"), out


# ----------------------------------------------------------------------------- B3
PARAMS_ROW = """() => { const th = [...document.querySelectorAll('[data-testid=details] table.kv th')].find((e) => e.textContent === 'parameters');
  return th ? { text: th.nextElementSibling.textContent, title: th.nextElementSibling.title } : null; }"""


def params_row(page: Any, key: str) -> dict[str, str]:
    page.evaluate("(k) => window.__torchscope.select(k)", key)
    page.wait_for_function("(p) => document.querySelector('[data-testid=details] h3')?.textContent === p", arg=key.split(":", 2)[2])
    r = page.evaluate(PARAMS_ROW)
    assert r, key
    return r  # type: ignore[no-any-return]


def test_b3_module_details_count_parameters_as_pytorch_does(page: Any, srv: ServerProc, runs: dict[str, dict[str, Any]]) -> None:
    params = runs["full"]["facts"]["params"]
    open_session(page, srv.url, runs["full"]["sid"], "?view=graph")
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")
    conv = [p for p in params if p["name"].startswith("conv.")]
    assert sum(p["numel"] for p in conv) == 448 and len(conv) == 2
    r = params_row(page, "g:forward:conv")
    shot(page, "paths-conv-details")
    # was "2": the count of tensors
    assert r["text"] == "448 (weight [16, 3, 3, 3], bias [16])", r
    # a module of many tensors: its count (in PyTorch's sum of numel), its first tensors, the rest in the tooltip
    layer = [p for p in params if p["name"].startswith("blocks.layers.0.")]
    assert len(layer) > 6
    total = sum(p["numel"] for p in layer)
    r = params_row(page, "g:forward:blocks.layers.0")
    rel = [f"{p['name'][len('blocks.layers.0.'):]} [{', '.join(map(str, p['shape']))}]" for p in layer]
    assert r["text"] == f"{total:,} ({', '.join(rel[:4])}, … {len(rel) - 4} more tensors)", r
    assert r["title"].splitlines()[1:] == rel and r["title"].startswith(f"{total:,} parameters"), r["title"]
    # the backward group says the same
    assert params_row(page, "g:backward:conv")["text"] == "448 (weight [16, 3, 3, 3], bias [16])"
