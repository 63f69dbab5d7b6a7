"""A big graph, everything expanded, as QA drove it: a real training run of a deep residual
MLP (benchmarks/bench_dashboard.py's model, 120 blocks: about 2,400 nodes and 1,500 module
frames), a real `torchscope serve`, a real headless Chromium.

A click that selects a node no longer rebuilds the whole scene (on 20,000+ nodes that froze
the page for seconds a click): the boxes and routed edges are kept, and only what depends on
the selection is redone.  So this checks that what depends on it still follows it: the
selected node's dashed link to its grad_fn (or op), the path to the loss it highlights (items
and edges, against the walk the captured graph itself gives), both moved by the next click;
and that the residual edges are still routed around the boxes they skip.  How fast it is, the
benchmark says (``bench_dashboard.py --select``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from browser_page import checked_page, open_session, shot
from conftest import REPO, ServerProc, http_json, run_script

playwright_sync = pytest.importorskip("playwright.sync_api")

BLOCKS = 120  # 20 a stage: stages.0 .. stages.5


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("big-graph-server")) as s:
        yield s


@pytest.fixture(scope="module")
def run(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The recorded run imported into the server: its id, and its step's graph as captured."""
    import httpx

    path = tmp_path_factory.mktemp("big-graph-run") / "big.tscope"
    run_script(REPO / "benchmarks" / "bench_dashboard.py", "--train", str(path), "--blocks", str(BLOCKS))
    with open(path, "rb") as f:
        httpx.post(srv.url + "/api/sessions/import", files={"file": (path.name, f)}, timeout=120).raise_for_status()
    sid = next(str(s["id"]) for s in http_json(srv.url + "/api/sessions") if s["name"] == "big-graph")  # type: ignore[union-attr]
    graph = http_json(f"{srv.url}/api/sessions/{sid}/graph?step=0")
    assert isinstance(graph, dict)
    return {"id": sid, "graph": graph}


# ----------------------------------------------------------------------------- what the graph says
def forward_edges(g: dict[str, Any]) -> set[tuple[str, str]]:
    """Dataflow between forward ops: the op that last wrote a tensor -> each op that reads it."""
    producer: dict[int, str] = {}
    edges = set()
    for op in sorted(g["ops"], key=lambda o: o["id"]):
        me = f"o{op['id']}"
        for t in op.get("inputs") or []:
            if t in producer and producer[t] != me:
                edges.add((producer[t], me))
        for t in op.get("outputs") or []:
            producer[t] = me
    return edges


def autograd_edges(g: dict[str, Any]) -> set[tuple[str, str]]:
    """grad_fn node -> each of its next_functions."""
    return {(f"n{a}", f"n{b}") for a, b, *_ in g["edges"]}


def path_to_loss(edges: set[tuple[str, str]], start: str, downstream: bool) -> set[str]:
    """What ``start`` reaches along ``edges`` (``downstream``) or against them: an op's
    forward descendants, a grad_fn node's way back up to the loss's grad_fn."""
    adj: dict[str, list[str]] = {}
    for a, b in edges:
        src, dst = (a, b) if downstream else (b, a)
        adj.setdefault(src, []).append(dst)
    seen, stack = {start}, [start]
    while stack:
        for x in adj.get(stack.pop(), []):
            if x not in seen:
                seen.add(x)
                stack.append(x)
    return seen


# ----------------------------------------------------------------------------- what the page drew
GRAPH_READY = "(() => { const g = window.__torchscope.app.views.graph.obj; return !!(g.scene && g.model); })()"
ALL_EXPANDED = """(() => { const g = window.__torchscope.app.views.graph.obj;
  return !!g.scene && g.scene.items.length === g.model.leaves.length && g.scene.items.every((it) => it.group === undefined); })()"""

# A node in the middle of the canvas (not selected yet), and where it is on the page.
CENTER = """([key]) => {
  const c = window.__torchscope.app.views.graph.obj.canvas, it = c.scene.byKey.get(key);
  c.centerOn([it.box]); c.pending = false; c.draw();
  const r = c.canvas.getBoundingClientRect();
  return [r.left + c.tx + (it.box[0] + it.box[2] / 2) * c.scale, r.top + c.ty + (it.box[1] + it.box[3] / 2) * c.scale];
}"""

# The marks of the scene drawn: the selection, the highlighted items, and for each edge asked
# about ([from, to] keys) whether the highlighted path's and the dashed link's strokes run
# through its middle (null for an edge long enough to be routed around boxes, its middle
# elsewhere; the first ``links`` are op -> grad_fn links, never routed).  An edge leaves the bottom of one box for the top of the next (the top for
# the bottom when the next lies above), a symmetric curve through the middle of its ends.
MARKS = """([edges, links]) => {
  const sc = window.__torchscope.app.views.graph.obj.scene;
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.lineWidth = 2;
  const probe = ([a, b], i) => {
    const A = sc.byKey.get(a).box, B = sc.byKey.get(b).box, up = B[1] + B[3] <= A[1];
    const ay = up ? A[1] : A[1] + A[3], by = up ? B[1] + B[3] : B[1];
    if (i >= links && Math.abs(by - ay) >= 60) return null;
    const x = (A[0] + A[2] / 2 + B[0] + B[2] / 2) / 2, y = (ay + by) / 2;
    return [!!sc.hiPath && ctx.isPointInStroke(sc.hiPath, x, y), ctx.isPointInStroke(sc.linkPath, x, y)];
  };
  return { selected: sc.selected, hi: sc.items.filter((it) => it.hi).map((it) => it.key), probes: edges.map(probe) };
}"""

# Boxes of the given leaves whose inside (4 px in from each side) an edge's stroke runs through.
THROUGH_BOXES = """([keys]) => {
  const sc = window.__torchscope.app.views.graph.obj.scene;
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.lineWidth = 1;
  const hits = [];
  for (const k of keys) {
    const [x, y, w, h] = sc.byKey.get(k).box;
    const paths = sc.edgePaths.filter((ep) => ep.y0 <= y + h && ep.y1 >= y).map((ep) => ep.path);
    let hit = false;
    for (let px = x + 4; px <= x + w - 4 && !hit; px += 3) for (let py = y + 4; py <= y + h - 4 && !hit; py += 3) {
      hit = paths.some((p) => ctx.isPointInStroke(p, px, py));
    }
    if (hit) hits.push(k);
  }
  return hits;
}"""


def click_node(page: Any, key: str) -> None:
    """Select ``key`` as a user does: a click on its box; the details panel then names it."""
    x, y = page.evaluate(CENTER, [key])
    page.mouse.click(x, y)
    page.wait_for_function("([k]) => window.__torchscope.app.views.graph.obj.selected === k", arg=[key])


def show_path(page: Any) -> None:
    """The details panel's "Path to loss" for the selected node."""
    page.get_by_test_id("path-to-loss").click()
    page.wait_for_function("window.__torchscope.app.views.graph.obj.scene.dimOthers")


def test_selection_moves_highlight_and_links_on_a_big_expanded_graph(srv: ServerProc, run: dict[str, Any]) -> None:
    g = run["graph"]
    fwd, bwd = forward_edges(g), autograd_edges(g)
    # the residual add of block stages.1.5 (x + mlp(norm(x))), and the grad_fn of the first
    # Linear of block stages.3.7 -- far apart, in the forward and the backward column
    op = next(o for o in g["ops"] if o["module"] == "stages.1.5" and o["name"] == "aten::add")
    node = next(n for n in g["nodes"] if n.get("module") == "stages.3.7.mlp.0" and n["name"] == "AddmmBackward0")
    op_key, node_key = f"o{op['id']}", f"n{node['id']}"
    grad_fn = next(n for n in g["nodes"] if n.get("op") == op["id"])  # the node the op created
    op_link, node_link = (op_key, f"n{grad_fn['id']}"), (f"o{node['op']}", node_key)
    op_path, node_path = path_to_loss(fwd, op_key, True), path_to_loss(bwd, node_key, False)
    assert len(op_path) > 100 and len(node_path) > 50  # both reach the loss across many blocks
    op_edges = sorted((a, b) for a, b in fwd if a in op_path and b in op_path)
    node_edges = sorted((a, b) for a, b in bwd if a in node_path and b in node_path)
    probes = [op_link, node_link, *op_edges, *node_edges]
    n_op = len(op_edges)

    with checked_page() as page:
        open_session(page, srv.url, run["id"], "?view=graph")
        page.wait_for_function(GRAPH_READY)
        page.get_by_test_id("expand-all").click()
        page.wait_for_function(ALL_EXPANDED, timeout=60_000)
        leaves = page.evaluate("window.__torchscope.app.views.graph.obj.model.leaves.length")
        assert leaves > 2000, leaves

        click_node(page, op_key)
        m = page.evaluate(MARKS, [probes, 2])
        assert m["selected"] == op_key and m["hi"] == [], m["hi"][:5]
        assert m["probes"][0] == [False, True] and m["probes"][1] == [False, False]  # its link, dashed; not the other's

        show_path(page)
        shot(page, "graph-big-path-to-loss")
        m = page.evaluate(MARKS, [probes, 2])
        assert set(m["hi"]) == op_path
        drawn = [p for p in m["probes"][2:2 + n_op] if p is not None]
        assert len(drawn) > 50 and all(p[0] for p in drawn), drawn  # every edge of the path highlighted
        assert all(p is None or not p[0] for p in m["probes"][2 + n_op:])  # and no other

        click_node(page, node_key)  # a new selection: the path goes, the link moves
        m = page.evaluate(MARKS, [probes, 2])
        assert m["selected"] == node_key and m["hi"] == []
        assert m["probes"][0] == [False, False] and m["probes"][1] == [False, True]
        assert all(p is None or p == [False, False] for p in m["probes"][2:])

        show_path(page)
        m = page.evaluate(MARKS, [probes, 2])
        assert set(m["hi"]) == node_path
        drawn = [p for p in m["probes"][2 + n_op:] if p is not None]
        assert len(drawn) > 30 and all(p[0] for p in drawn), drawn
        assert all(p is None or not p[0] for p in m["probes"][2:2 + n_op])

        # the residual edges skip the blocks' norm and mlp, down the forward column and up the
        # backward one: still drawn around their boxes.  (Not TBackward0: AddmmBackward0's edge
        # to the bias's AccumulateGrad, one row further, runs across it -- an edge that short
        # is not routed, before this change as after it.)
        blocks = ("stages.1.5", "stages.3.7")
        keys = [f"o{o['id']}" for o in g["ops"] if o["module"].startswith(blocks)]
        keys += [f"n{n['id']}" for n in g["nodes"] if (n.get("module") or "").startswith(blocks) and n["name"] != "TBackward0"]
        assert len(keys) > 30
        assert page.evaluate(THROUGH_BOXES, [keys]) == []


def test_marks_follow_a_collapse(srv: ServerProc, run: dict[str, Any]) -> None:
    """A layout change (one block collapsed, everything else expanded) rebuilds the scene; the
    highlight is drawn on the new one: the collapsed block's box in its nodes' stead."""
    g = run["graph"]
    op = next(o for o in g["ops"] if o["module"] == "stages.2.4.mlp.0" and o["name"] == "aten::addmm")
    op_key = f"o{op['id']}"
    with checked_page() as page:
        open_session(page, srv.url, run["id"], "?view=graph")
        page.wait_for_function(GRAPH_READY)
        page.get_by_test_id("expand-all").click()
        page.wait_for_function(ALL_EXPANDED, timeout=60_000)
        click_node(page, op_key)
        show_path(page)
        hi = page.evaluate("""async () => {
          const v = window.__torchscope.app.views.graph.obj;
          await v.toggleGroup(v.model.gIndex.get("forward:stages.4.2"));
          return v.scene.items.filter((it) => it.hi).map((it) => [it.key, it.group === undefined ? v.model.byKey.get(it.key).module : ""]);
        }""")
        keys = {k for k, _ in hi}
        assert {"g:forward:stages.4.2", op_key} <= keys
        assert not [k for k, module in hi if module.startswith("stages.4.2")]  # inside the box, not drawn
