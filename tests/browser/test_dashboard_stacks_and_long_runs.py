"""Two dashboard bugs QA found (seventeenth session), checked in a real headless Chromium
against a real `torchscope serve`, with runs recorded by a real training script.

- The gradients heat map of a long run scrolls sideways; its module names must stay in view
  (a frozen column), a long name cut in its middle (its end tells sibling layers apart), and
  the hover read-out must name the cell under the pointer after scrolling.
- The graph view laid out a residual stack in an ``nn.ModuleList`` in one row: its blocks are
  linked only through the parent's adds.  They must stack top to bottom, while branches that
  really run in parallel stay side by side; and (twenty-first session) the parent's adds sit
  between the blocks, not all below the ModuleList's frame.
- (twenty-second session) Expanding a module in the forward left its backward (its grad_fn
  nodes) one collapsed box: a module's forward and backward now open and close together.
- "Fit" on a large full-mode graph zoomed out below the zoom at which labels are drawn: it
  now stops at a readable zoom from the graph's top, and a second press shows all of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked_page, open_session, shot, train_side_by_side
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

TRAIN = Path(__file__).resolve().parent / "dashboard_train_shapes.py"
LONG_STEPS = 600  # 2 px per step: 1200 px of cells, wider than the 1280 px window leaves them
SPIKY_STEPS, SPIKE = 1100, 701  # over the 1,000 steps /grads sends: every other one, the spike's an odd one


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("shapes-server")) as s:
        yield s


# the script's arguments by session name (it names a session <model>, or <model>-<mode> outside default mode)
RUNS = {"residual": ["--model", "residual", "--steps", "2"], "long": ["--model", "long", "--steps", str(LONG_STEPS)],
        "residual-full": ["--model", "residual", "--steps", "1", "--mode", "full"],
        "spiky": ["--model", "long", "--steps", str(SPIKY_STEPS), "--mode", "light", "--spike", str(SPIKE), "--name", "spiky"]}


@pytest.fixture(scope="module")
def runs(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Session ids of the runs, streamed to the server side by side."""
    return train_side_by_side(srv, TRAIN, tmp_path_factory.mktemp("shapes-runs"), RUNS)


@pytest.fixture
def page(srv: ServerProc) -> Iterator[Any]:
    with checked_page() as pg:
        yield pg


# ----------------------------------------------------------------------------- gradients
# Scrolls the heat map's scrolling box to its far right; returns its visible rectangle, the
# heat map canvas's rectangle and how far it scrolled.
SCROLL_TO_END = """() => {
  const heat = document.querySelector("[data-testid=heatmap]");
  let box = heat.parentElement;
  while (box && box.scrollWidth <= box.clientWidth) box = box.parentElement;
  if (!box) return null;
  box.scrollLeft = box.scrollWidth;
  const r = (el) => { const b = el.getBoundingClientRect(); return { left: b.left, top: b.top, right: b.right, bottom: b.bottom }; };
  return { box: r(box), heat: r(heat), scrollLeft: box.scrollLeft };
}"""

# What is on top at the left end of each heat map row, and of the step axis's row below them
# (20 px into the frame): the element, its text and its box.
ROW_STARTS = """([rows, cellH]) => {
  const heat = document.querySelector("[data-testid=heatmap]"), top = heat.getBoundingClientRect().top;
  const x = heat.closest(".heat-wrap").getBoundingClientRect().left + 20;
  return Array.from({ length: rows }, (_, m) => {
    const el = document.elementFromPoint(x, top + m * cellH + cellH / 2), b = el.getBoundingClientRect();
    return { tag: el.tagName, text: el.textContent, title: el.title || el.textContent, left: b.left, right: b.right,
             top: b.top, bottom: b.bottom, scrollWidth: el.scrollWidth, clientWidth: el.clientWidth };
  });
}"""


def test_heat_map_names_stay_in_view_when_scrolled_to_later_steps(page: Any, srv: ServerProc,
                                                                  runs: dict[str, str]) -> None:
    open_session(page, srv.url, runs["long"], "?view=gradients")
    page.wait_for_function(f"(() => {{ const g = window.__torchscope.state().gradients; return g && g.steps >= {LONG_STEPS}; }})()")
    g = page.evaluate("window.__torchscope.state().gradients")
    modules, geom = g["modules"], g["geom"]
    assert len(modules) == 12 and geom["S"] == LONG_STEPS
    # the view says it holds more steps than it shows (QA 46c: nothing did)
    more = page.locator("[data-testid=heat-more]").inner_text()
    assert more.startswith(f"{LONG_STEPS} steps at {geom['cellW']} px each, wider than the view: scroll it sideways"), more
    scrolled = page.evaluate(SCROLL_TO_END)
    assert scrolled is not None and scrolled["scrollLeft"] > 100, "the heat map did not need to scroll"
    box = scrolled["box"]
    starts = page.evaluate(ROW_STARTS, [len(modules) + 1, geom["cellH"]])
    shot(page, "gradients-scrolled")
    # a numbered child of an nn.Sequential / ModuleList is named with its type ("...0 (Linear)")
    import httpx

    meta = httpx.get(f"{srv.url}/api/sessions/{runs['long']}", timeout=30).json()["meta"]
    types = {m["path"]: m["type"] for m in meta["modules"]}
    labels = [f"{m} ({types[m]})" if m.rpartition(".")[2].isdigit() and m in types else m for m in modules]
    for name, at in zip([*labels, "step →"], starts, strict=True):
        assert at["title"] == name, f"row {name!r} starts with {at['tag']} {at['title']!r} after scrolling, not its name"
        assert at["scrollWidth"] <= at["clientWidth"], f"{name!r} overflows its column: {at}"
        if name != "step →":
            # cut in the middle: the path's start and its layer index (what tells rows apart)
            head, _, tail = at["text"].partition("…")
            assert tail and name.startswith(head) and name.endswith(tail) and tail.endswith(name[-3:]), (name, at)
        assert at["left"] >= 0 and at["right"] <= box["left"] + 1, f"{name!r} is not left of the cells: {at}, {box}"
    # the step axis scrolled with the cells: the window onto them holds several step labels
    assert (box["right"] - box["left"]) / (geom["axisEvery"] * geom["cellW"]) >= 5, geom
    # the hover read-out names the cell under the pointer: the last step at the right end, and
    # the first visible column at the left edge of the scrolled cells
    last_x = scrolled["heat"]["left"] + geom["L"] + (LONG_STEPS - 1) * geom["cellW"] + geom["cellW"] / 2
    first_x = box["left"] + 1
    first_step = int((first_x - scrolled["heat"]["left"] - geom["L"]) // geom["cellW"])
    assert first_step > 0  # scrolled past the first steps
    for x, step in ((last_x, LONG_STEPS - 1), (first_x, first_step)):
        for m in (0, len(modules) - 1):
            page.mouse.move(x, scrolled["heat"]["top"] + m * geom["cellH"] + geom["cellH"] / 2)
            assert page.locator("[data-testid=heat-hover]").inner_text().startswith(f"{labels[m]} · step {step} ·")
    assert page.evaluate(SCROLL_TO_END)["scrollLeft"] == scrolled["scrollLeft"]  # the pointer moved nothing


def test_a_long_runs_sampled_gradients_keep_the_spike_and_say_so(page: Any, srv: ServerProc,
                                                                 runs: dict[str, str]) -> None:
    """Past 1,000 steps the gradient charts show one step of every few: the one with the largest
    total norm, and the page says so (QA 48b: every other step, silently, and a 1e6x explosion
    the doctor named was drawn as a flat line)."""
    import httpx

    open_session(page, srv.url, runs["spiky"], "?view=gradients")
    note = page.locator("[data-testid=grads-sampled]")
    note.wait_for(state="visible", timeout=30_000)
    g = httpx.get(f"{srv.url}/api/sessions/{runs['spiky']}/grads", timeout=30).json()
    assert g["stride"] == 2 and SPIKE in g["steps"]
    # one of every two steps, and the first and last besides
    assert g["steps"][0] == 0 and g["steps"][-1] == SPIKY_STEPS - 1 and len(g["steps"]) in (551, 552)
    assert note.inner_text().startswith(f"{SPIKY_STEPS:,} steps: the gradient charts and the heat map show {len(g['steps'])}, "
                                        "of every 2 steps in a row the one with the largest total ‖grad‖"), note.inner_text()
    assert "and the first and last steps" in note.inner_text()
    norms = [v for v in g["total_norm"] if isinstance(v, float)]
    assert g["total_norm"][g["steps"].index(SPIKE)] == max(norms) > 1e4 * sorted(norms)[len(norms) // 2]
    # the heat map's columns are those steps: hovering the spike's names it
    geom = page.evaluate("window.__torchscope.state().gradients")["geom"]
    heat = page.locator("[data-testid=heatmap]")
    heat.scroll_into_view_if_needed()
    col = g["steps"].index(SPIKE)
    page.evaluate(f"""() => {{ const h = document.querySelector("[data-testid=heatmap]"); h.parentElement.scrollLeft = {geom['L'] + col * geom['cellW']} - 200; }}""")
    box = heat.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + geom["L"] + col * geom["cellW"] + geom["cellW"] / 2, box["y"] + geom["cellH"] / 2)
    assert f" · step {SPIKE} ·" in page.locator("[data-testid=heat-hover]").inner_text()
    # the doctor's explosion, followed here: its note names no line (P3 has none), and says no "null"
    open_session(page, srv.url, runs["spiky"], "?view=diagnostics")
    page.locator("button.finding[data-code=P3]").first.click()
    box = page.locator("[data-testid=gradients-finding]")
    box.wait_for(state="visible")
    assert f"step {SPIKE}" in box.inner_text() and "null" not in box.inner_text(), box.inner_text()


# ----------------------------------------------------------------------------- graph
# Boxes (x, y, w, h) of the drawn items whose key starts with one of the prefixes.
BOXES = """(prefix) => Object.fromEntries(window.__torchscope.app.views.graph.obj.scene.items
  .filter((it) => it.key.startsWith(prefix)).map((it) => [it.key, Array.from(it.box)]))"""


def test_residual_blocks_in_a_module_list_stack_top_to_bottom(page: Any, srv: ServerProc, runs: dict[str, str]) -> None:
    open_session(page, srv.url, runs["residual"])
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")
    page.evaluate("window.__torchscope.expand('layers')")
    page.evaluate("window.__torchscope.expand('layers', 'backward')")
    page.evaluate("window.__torchscope.expand('branches')")
    page.evaluate("(() => { const c = window.__torchscope.app.views.graph.obj.canvas; c.show(c.overviewView()); })()")
    shot(page, "graph-residual-module-list")
    # seen whole, the tall expanded graph ends above the legend that floats over the canvas's bottom
    fitted = page.evaluate("""() => {
      const v = window.__torchscope.app.views.graph.obj, c = v.canvas, cv = v.canvasEl.getBoundingClientRect();
      return { bottom: cv.top + c.ty + v.scene.height * c.scale, legendTop: v.legend.getBoundingClientRect().top };
    }""")
    assert fitted["bottom"] <= fitted["legendTop"], fitted
    blocks = page.evaluate(BOXES, "g:forward:layers.")
    assert sorted(blocks) == [f"g:forward:layers.{i}" for i in range(8)]
    for i in range(1, 8):
        above, below = blocks[f"g:forward:layers.{i - 1}"], blocks[f"g:forward:layers.{i}"]
        assert below[1] >= above[1] + above[3], f"block {i} is not below block {i - 1}: {blocks}"
    # a ModuleList is never called: expanded, it is no frame, and the parent's `x + layer(x)`
    # sits between the block it reads and the next one, where it ran
    assert not any(f.startswith("layers (ModuleList)") for f in page.evaluate("window.__torchscope.state().graph.frames"))
    adds = [b for k, b in page.evaluate(BOXES, "o").items()
            if page.evaluate(f"window.__torchscope.app.views.graph.obj.model.byKey.get('{k}').label") == "add"]
    for i in range(1, 8):
        above, below = blocks[f"g:forward:layers.{i - 1}"], blocks[f"g:forward:layers.{i}"]
        assert any(above[1] + above[3] <= a[1] and a[1] + a[3] <= below[1] for a in adds), f"no add between blocks {i - 1} and {i}"
    # their backward, side by side (the default), flows up from the loss: block 7's grad_fn
    # nodes run first and sit lowest, block 0's last and highest
    assert page.evaluate("window.__torchscope.state().graph.sideBySide")
    back = page.evaluate(BOXES, "g:backward:layers.")
    assert len(back) == 8
    for i in range(1, 8):
        above, below = back[f"g:backward:layers.{i - 1}"], back[f"g:backward:layers.{i}"]
        assert below[1] >= above[1] + above[3], f"backward of block {i} is not below block {i - 1}'s: {back}"
    # three branches fed the same input: side by side, one row
    branches = page.evaluate(BOXES, "g:forward:branches.")
    assert len(branches) == 3
    assert len({b[1] for b in branches.values()}) == 1, branches
    xs = sorted(b[0] for b in branches.values())
    assert all(x1 >= x0 + 100 for x0, x1 in zip(xs, xs[1:], strict=False)), branches


# Boxes of the drawn items with this label (ops, grad_fn nodes).
LABELLED = """(label) => window.__torchscope.app.views.graph.obj.scene.items
  .filter((it) => it.label === label).map((it) => Array.from(it.box))"""


def drawn_keys(page: Any) -> set[str]:
    return {n["key"] for n in page.evaluate("window.__torchscope.state().graph.nodes")}


def wait_drawn(page: Any, key: str, drawn: bool = True) -> None:
    """Until the box ``key`` is (or is no longer) drawn: a click's relayout is asynchronous."""
    page.wait_for_function("([k, on]) => window.__torchscope.state().graph.nodes.some((n) => n.key === k) === on", arg=[key, drawn])


def test_expanding_a_module_opens_its_forward_and_its_backward(page: Any, srv: ServerProc, runs: dict[str, str]) -> None:
    open_session(page, srv.url, runs["residual"])
    wait_drawn(page, "g:backward:layers")
    page.evaluate("window.__torchscope.expand('layers')")  # the forward's box only, as a double-click on it
    keys = drawn_keys(page)
    assert "g:forward:layers" not in keys and "g:backward:layers" not in keys
    assert {"forward:layers", "backward:layers"} <= set(page.evaluate("window.__torchscope.state().graph.expanded"))
    # the backward ModuleList opens as the forward one does: its blocks' grad_fn nodes among the
    # parent's AddBackward0 nodes (`x + layer(x)`), one between each two blocks, where they ran
    back = page.evaluate(BOXES, "g:backward:layers.")
    assert sorted(back) == [f"g:backward:layers.{i}" for i in range(8)]
    adds = page.evaluate(LABELLED, "AddBackward0")
    for i in range(1, 8):
        above, below = back[f"g:backward:layers.{i - 1}"], back[f"g:backward:layers.{i}"]
        assert any(above[1] + above[3] <= a[1] and a[1] + a[3] <= below[1] for a in adds), f"no AddBackward0 between blocks {i - 1} and {i}"
    shot(page, "graph-residual-module-list-both-phases")
    # from the backward side (its details panel's button) a block opens in both phases too
    page.evaluate("window.__torchscope.select('g:backward:layers.3')")
    # its saved activations are its grad_fn nodes': shown on the backward group only (a forward
    # group's said "saved for backward 0 B"; found by QA)
    assert "saved for backward" in page.locator("[data-testid=details]").inner_text()
    page.locator("[data-testid=toggle-group]").click()
    wait_drawn(page, "g:forward:layers.3", False)
    assert "g:backward:layers.3" not in drawn_keys(page)
    page.evaluate("window.__torchscope.select('g:forward:layers')")
    page.wait_for_selector("[data-testid=details] .details-title")
    assert "saved for backward" not in page.locator("[data-testid=details]").inner_text()
    page.evaluate("window.__torchscope.select('g:backward:layers.3')")
    # and closes in both
    page.locator("[data-testid=toggle-group]").click()
    wait_drawn(page, "g:forward:layers.3")
    assert "g:backward:layers.3" in drawn_keys(page)
    # "Collapse" closes every module in both phases, "Expand all" opens every one
    page.locator("button[title='collapse to top-level modules']").click()
    wait_drawn(page, "g:forward:layers")
    assert "g:backward:layers" in drawn_keys(page) and page.evaluate("window.__torchscope.state().graph.expanded") == []
    page.locator("[data-testid=expand-all]").click()
    wait_drawn(page, "g:backward:layers", False)
    groups = page.evaluate("window.__torchscope.app.views.graph.obj.model.groups.map((g) => g.key).filter(Boolean)")
    assert sorted(page.evaluate("window.__torchscope.state().graph.expanded")) == sorted(groups)


# The canvas's view of the graph: zoom, offset, sizes, how many items it shows, where on the
# canvas the step's first op is, the zoom at which labels are drawn, and where the legend that
# floats over the canvas starts.
VIEW = """async () => {
  const { TEXT_MIN_SCALE } = await import("/static/graph/render.js");
  const v = window.__torchscope.app.views.graph.obj, c = v.canvas, items = v.scene.items;
  const x0 = -c.tx / c.scale, y0 = -c.ty / c.scale, x1 = x0 + c.w / c.scale, y1 = y0 + c.h / c.scale;
  const shown = items.filter(({ box: b }) => b[0] < x1 && b[0] + b[2] > x0 && b[1] < y1 && b[1] + b[3] > y0), seen = shown.length;
  const onScreen = shown.map(({ box: b }) => [c.tx + b[0] * c.scale, c.ty + b[1] * c.scale, c.tx + (b[0] + b[2]) * c.scale]);
  const b = items.reduce((p, q) => (q.order < p.order ? q : p)).box;
  return { scale: c.scale, tx: c.tx, ty: c.ty, w: c.w, h: c.h, width: v.scene.width, height: v.scene.height, seen, onScreen,
           items: items.length, labelZoom: TEXT_MIN_SCALE, legendTop: v.legend.getBoundingClientRect().top - v.canvasEl.getBoundingClientRect().top,
           first: [c.tx + b[0] * c.scale, c.ty + b[1] * c.scale, c.tx + (b[0] + b[2]) * c.scale, c.ty + (b[1] + b[3]) * c.scale] };
}"""


def test_fit_on_a_large_graph_keeps_labels_and_a_second_fit_shows_it_all(page: Any, srv: ServerProc, runs: dict[str, str]) -> None:
    open_session(page, srv.url, runs["residual-full"])
    wait_drawn(page, "g:backward:layers")
    page.evaluate("window.__torchscope.expandAll()")
    page.evaluate("window.__torchscope.app.views.graph.obj.canvas.zoomAt(300, 300, 2)")  # the user looked closer
    fit = page.locator("[data-testid=fit]")
    fit.click()
    v = page.evaluate(VIEW)
    assert v["height"] * v["labelZoom"] > 2 * v["h"], f"the graph is not large enough to test Fit: {v}"
    assert v["scale"] >= v["labelZoom"], f"Fit zoomed out below the label zoom: {v}"
    # from where the step starts: its first op near the top, in view
    left, top, right, bottom = v["first"]
    assert left >= 0 and right <= v["w"] and top > 0 and bottom < v["h"] / 3, v
    # what the first screen shows is whole across, unless that too is below the label zoom (Fit
    # takes the width of the rows in view: the widest rows, far below, the optimizer's and the
    # backward's "(outside modules)" groups, are the overview's)
    assert v["scale"] == v["labelZoom"] or all(b[0] >= 0 and b[2] <= v["w"] for b in v["onScreen"]), v
    assert v["seen"] >= 10, v
    shot(page, "graph-full-fit")
    fit.click()  # again: the whole graph, an overview, above the legend
    o = page.evaluate(VIEW)
    assert o["scale"] < o["labelZoom"] and o["seen"] == o["items"], o
    assert o["ty"] + o["height"] * o["scale"] <= o["legendTop"] and o["tx"] + o["width"] * o["scale"] <= o["w"], o
    fit.click()  # and back to reading
    assert page.evaluate(VIEW)["scale"] == v["scale"]


def test_a_findings_late_step_is_scrolled_into_view(page: Any, srv: ServerProc, runs: dict[str, str]) -> None:
    """A Doctor finding's link to a late step of a long run: its outlined column is in view."""
    late = LONG_STEPS - 10
    open_session(page, srv.url, runs["long"], f"?view=gradients&step={late}")
    page.wait_for_function(f"(() => {{ const g = window.__torchscope.state().gradients; return g && g.steps >= {LONG_STEPS}; }})()")
    g = page.evaluate("window.__torchscope.state().gradients")
    assert g["focus"] == late
    geom = g["geom"]
    seen = page.evaluate("""() => {
      const heat = document.querySelector("[data-testid=heatmap]"), box = heat.parentElement;
      return { left: box.scrollLeft, width: box.clientWidth };
    }""")
    column = geom["L"] + late * geom["cellW"]
    assert seen["left"] <= column and column + geom["cellW"] <= seen["left"] + seen["width"], (column, seen)
