"""The side-by-side graph (forward column down, backward column up) as QA found it in the
twenty-sixth session, in a real headless Chromium against a real `torchscope serve`, with runs
recorded by a real training script.

- Edges of the backward column that skip rows were drawn straight through the boxes between
  their ends (``MseLossBackward0 -> head`` across ``SqrtBackward0``, as if connected); every
  backward edge also ran through its own source box.  No edge may cross a box now.
- In full mode the loss's grad_fn sat at the top of the backward column, and with everything
  expanded a forward block sat across from a later block's backward: the loss's grad_fn is
  now across from the loss, and each module's forward frame level with its backward frame.
- A Doctor finding about a grad_fn node centred the node alone: the forward op it links to
  was cut off (1280 px) or off-screen (1024 px).  Both are in view now.
- Small things: words cut mid-word in the details panel, a legend swatch parted from its
  name, nested frame titles cut in the middle, the toolbar's "Fit" alone on a second row.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked_page, open_session, shot, train_side_by_side
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

TRAIN = Path(__file__).resolve().parent / "dashboard_train.py"
RUNS = {"nan": ["--steps", "2", "--backward-nan"], "full": ["--steps", "1", "--mode", "full"]}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("columns-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Session ids by name: a NaN born in the backward (P4, default mode) and a full-mode run."""
    args = {name: ["--name", name, *extra] for name, extra in RUNS.items()}
    # finished, and the NaN run's P4 found (the Doctor tab's finding)
    return train_side_by_side(srv, TRAIN, tmp_path_factory.mktemp("columns-runs"), args,
                              ready=lambda listed: bool(listed["nan"].get("errors")))


def open_graph(page: Any, srv: ServerProc, sid: str, query: str = "") -> None:
    open_session(page, srv.url, sid, f"?view=graph{query}")
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")


# Drawn boxes whose inside (4 px in from each side) an edge's stroke runs through: an edge
# touches its ends' boxes at their borders only, and goes around every other box.
EDGES_THROUGH_BOXES = """() => {
  const v = window.__torchscope.app.views.graph.obj, sc = v.scene;
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.lineWidth = 1;
  const paths = sc.edgePaths.map((ep) => ep.path);
  const hits = [];
  for (const it of sc.items) {
    const [x, y, w, h] = it.box;
    let hit = false;
    for (let px = x + 4; px <= x + w - 4 && !hit; px += 3) for (let py = y + 4; py <= y + h - 4 && !hit; py += 3) {
      hit = paths.some((p) => ctx.isPointInStroke(p, px, py));
    }
    if (hit) hits.push(it.label);
  }
  return { hits, items: sc.items.length, edges: sc.edgePaths.length };
}"""


def test_no_edge_runs_through_a_box(srv: ServerProc, runs: dict[str, str]) -> None:
    with checked_page() as page:
        open_graph(page, srv, runs["nan"])
        shot(page, "graph-columns-edges")
        r = page.evaluate(EDGES_THROUGH_BOXES)
        assert r["items"] > 10 and r["edges"] > 0, r
        # SqrtBackward0 between MseLossBackward0 and the head it feeds above: the skip edge
        # goes around it, as the forward column's skip edges go around theirs
        assert r["hits"] == [], r


# Boxes (x, y, w, h) of the drawn items and expanded frames, by label / frame key.
BOXES = """() => {
  const sc = window.__torchscope.app.views.graph.obj.scene;
  return { items: sc.items.map((it) => [it.label, it.key, Array.from(it.box)]),
           frames: Object.fromEntries(sc.frames.map((f) => [f.key, Array.from(f.box)])) };
}"""


def test_full_mode_backward_starts_across_from_the_loss_and_modules_line_up(srv: ServerProc, runs: dict[str, str]) -> None:
    with checked_page() as page:
        open_graph(page, srv, runs["full"])
        b = page.evaluate(BOXES)
        loss = next(box for label, _, box in b["items"] if label == "mse_loss")
        root = next(box for label, _, box in b["items"] if label == "MseLossBackward0")
        # the loss's grad_fn, where the backward starts: level with the loss, at the bottom of
        # the backward column (not at its top beside the first module)
        assert loss[1] <= root[1] + root[3] / 2 <= loss[1] + loss[3], (loss, root)
        backward = [box for _, key, box in b["items"] if key.startswith("g:backward:") or key.startswith("n")]
        assert all(box[1] <= root[1] + 1 for box in backward), (root, backward)
        page.evaluate("window.__torchscope.expandAll()")
        page.wait_for_function("window.__torchscope.state().graph.frames.length > 10")
        shot(page, "graph-columns-full-expanded")
        frames = page.evaluate(BOXES)["frames"]
        paired = [k[len("g:forward:"):] for k in frames if k.startswith("g:forward:") and "g:backward:" + k[len("g:forward:"):] in frames]
        assert len(paired) >= 4, frames
        # each top-level module's forward frame level with its backward frame: a grad_fn across
        # from the op that created it, however much taller full mode's backward kernels make it
        top_level = [p for p in paired if "." not in p or p.startswith("blocks.") and p.count(".") == 1]
        assert {"blocks.0", "blocks.1", "head"} <= set(top_level), paired
        for p in top_level:
            assert abs(frames["g:forward:" + p][1] - frames["g:backward:" + p][1]) < 1, (p, frames["g:forward:" + p], frames["g:backward:" + p])


# Where on the canvas the selected grad_fn node and the forward op that created it are.
SELECTED_AND_OP = """() => {
  const v = window.__torchscope.app.views.graph.obj, c = v.canvas, sc = v.scene;
  const node = v.model.byKey.get(v.selected), sel = sc.byKey.get(v.selected), op = sc.byKey.get("o" + node.rec.op);
  const screen = (b) => [c.tx + b[0] * c.scale, c.ty + b[1] * c.scale, c.tx + (b[0] + b[2]) * c.scale, c.ty + (b[1] + b[3]) * c.scale];
  return { label: node.label, node: screen(sel.box), op: screen(op.box), w: c.w, h: c.h, scale: c.scale };
}"""


@pytest.mark.parametrize("width", [1280, 1024])
def test_a_findings_grad_fn_and_its_forward_op_are_both_in_view(srv: ServerProc, runs: dict[str, str], width: int) -> None:
    with checked_page(width=width) as page:
        page.goto(f"{srv.url}/sessions/{runs['nan']}?view=diagnostics")
        page.locator("button.finding", has_text="P4").first.click()
        page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.selected && g.selected.startsWith('n'); })()")
        page.wait_for_timeout(200)
        shot(page, f"graph-columns-finding-{width}")
        r = page.evaluate(SELECTED_AND_OP)
        assert r["label"] == "SqrtBackward0", r
        for box in (r["node"], r["op"]):
            assert box[0] >= 0 and box[2] <= r["w"] and box[1] >= 0 and box[3] <= r["h"], r
        assert r["scale"] >= 0.45, r  # still labelled


# Words of the details panel's values that a line break cut in two (short words only: a long
# path may break anywhere), each as its text.
SPLIT_WORDS = """() => {
  const res = [];
  for (const td of document.querySelectorAll("[data-testid=details] table.kv td")) {
    const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      for (const m of n.textContent.matchAll(/\\S{2,20}/g)) {
        const r = document.createRange();
        r.setStart(n, m.index); r.setEnd(n, m.index + m[0].length);
        if (new Set(Array.from(r.getClientRects(), (q) => Math.round(q.top))).size > 1) res.push(m[0]);
      }
    }
  }
  return res;
}"""

# Legend entries whose swatch and name ended on different lines.
PARTED_SWATCHES = """() => Array.from(document.querySelectorAll("[data-testid=legend] .swatch")).filter((s) => {
  const name = s.nextSibling;
  if (!name) return true;
  const r = document.createRange(); r.selectNodeContents(name);
  const rects = r.getClientRects();
  return !rects.length || Math.abs(rects[0].top + rects[0].height / 2 - (s.getBoundingClientRect().top + s.getBoundingClientRect().height / 2)) > 6;
}).map((s) => s.parentElement.textContent)"""


def test_details_words_and_legend_swatches_stay_whole(srv: ServerProc, runs: dict[str, str]) -> None:
    with checked_page(width=1024) as page:
        open_graph(page, srv, runs["nan"])
        page.evaluate("window.__torchscope.select(window.__torchscope.app.views.graph.obj.model.leaves.find((l) => l.label === 'SqrtBackward0').key)")
        page.wait_for_selector("[data-testid=details] table.kv td")
        assert "NaN" in page.locator("[data-testid=details]").inner_text()
        assert page.evaluate(SPLIT_WORDS) == []
        assert page.locator("[data-testid=legend] .swatch").count() >= 4
        assert page.evaluate(PARTED_SWATCHES) == []
        page.locator("[data-testid=overlay]").select_option("grad")
        page.wait_for_function("document.querySelector('[data-testid=legend]').textContent.includes('.grad is None')")
        shot(page, "graph-columns-legend-1024")
        assert page.evaluate(PARTED_SWATCHES) == []


def test_the_toolbar_is_one_row_at_1280_px(srv: ServerProc, runs: dict[str, str]) -> None:
    with checked_page(width=1280) as page:
        open_graph(page, srv, runs["nan"])
        # "Fit" is not left alone on a second row
        tops = page.evaluate("""() => Array.from(document.querySelector(".view-graph .toolbar").children)
          .filter((c) => c.offsetParent).map((c) => Math.round(c.getBoundingClientRect().top))""")
        assert max(tops) - min(tops) < 10, tops  # one row (its groups centred: a pixel apart)
        fit, expand = (page.locator(f"[data-testid={t}]").bounding_box() for t in ("fit", "expand-all"))
        assert fit and expand and abs(fit["y"] - expand["y"]) < 2, (fit, expand)


def test_nested_frame_titles_keep_their_end_and_show_in_full_on_hover(srv: ServerProc, runs: dict[str, str]) -> None:
    with checked_page() as page:
        open_graph(page, srv, runs["full"])
        page.evaluate("window.__torchscope.expandAll()")
        page.wait_for_function("window.__torchscope.state().graph.frames.length > 10")
        # closer, so frames draw their titles
        r = page.evaluate("""async () => {
          const v = window.__torchscope.app.views.graph.obj, c = v.canvas;
          const f = v.scene.frames.find((f) => f.key === "g:forward:blocks.0.norm");
          c.centerOn([f.box], 1);
          await new Promise((ok) => requestAnimationFrame(() => requestAnimationFrame(ok)));
          const rect = v.canvasEl.getBoundingClientRect();
          return { title: f.title, fit: f.fitTitle, x: rect.left + c.tx + (f.box[0] + 20) * c.scale, y: rect.top + c.ty + (f.box[1] + 8) * c.scale };
        }""")
        shot(page, "graph-columns-nested-titles")
        # "blocks.0.norm (LayerNorm) · forward" is wider than its frame: the phase goes first
        # (the frame's colour and column say it), then the path's start; the module's own name
        # and type stay readable
        whole = "blocks.0.norm (LayerNorm)"
        assert r["fit"] != r["title"] and "norm (LayerNorm)" in r["fit"], r
        assert r["fit"] == whole or (r["fit"].startswith("…") and whole.endswith(r["fit"][1:])), r
        page.mouse.move(r["x"], r["y"])
        assert page.locator("canvas").first.get_attribute("title") == r["title"]


def test_nan_gradients_are_in_the_legend_with_every_module_expanded(srv: ServerProc, runs: dict[str, str]) -> None:
    """The gradient overlay of a step whose gradients are NaN: each AccumulateGrad is drawn in
    the NaN colour, and the legend names it -- expanded too (the norms came as the JSON string
    "NaN", which the colour scale did not count as non-finite; found by QA)."""
    with checked_page() as page:
        open_graph(page, srv, runs["nan"])
        page.locator("[data-testid=overlay]").select_option("grad")
        page.wait_for_function("document.querySelector('[data-testid=legend]').textContent.includes('NaN / Inf')")
        page.evaluate("window.__torchscope.expandAll()")  # awaited: laid out and drawn
        page.wait_for_timeout(300)
        assert page.evaluate("window.__torchscope.app.views.graph.obj.expandedIdx.size") > 0
        assert "NaN / Inf" in page.locator("[data-testid=legend]").inner_text()
