"""The Graph view's "Top ops" table and its Export PNG, in a real headless Chromium against a
real `torchscope serve`, on a run recorded by a real training script.

- Top ops: the shown step's forward ops grouped by name as torch.profiler's operator table
  reads them -- # of calls, total time, share, mean, max, bytes allocated -- checked against
  the recorded file itself (the calls and summed ``dur_us`` per op name of its GraphEvent);
  the same for the grad_fn nodes and grouped by module; sorted by a click on a column's
  header (total time, most first, to start with); a click on a row lights up the ops of that
  name in the graph (and selects the first, the next on a second click); ``?top=1`` in the URL
  opens it, as the app's other state.
- Export PNG: the whole graph drawn by the canvas renderer into an image of its own, of the
  size the scene says, not blank; a click on the button downloads ``<session>-step<N>.png``;
  past the pixel caps the current view is exported instead, and says so.
"""

from __future__ import annotations

import base64
import math
import struct
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked_page, open_session, recorded, shot
from conftest import ServerProc

from torchscope.session import load

playwright_sync = pytest.importorskip("playwright.sync_api")

SCRIPT = Path(__file__).with_name("dashboard_train_topops.py")
STEP = 2  # the run's second captured step (sample_every=2: steps 0 and 2)

TABLE_ROWS = """() => Array.from(document.querySelectorAll("[data-testid=top-ops-table] tr.top-ops-row")).map((tr) => ({
  key: tr.dataset.key, calls: +tr.dataset.calls, total: tr.dataset.totalUs === "" ? null : +tr.dataset.totalUs,
  cells: Array.from(tr.children).map((td) => td.textContent), on: tr.classList.contains("on") }))"""
HEADERS = """() => Array.from(document.querySelectorAll("[data-testid=top-ops-table] th")).map((th) => ({
  key: th.dataset.sort, text: th.textContent, sort: th.getAttribute("aria-sort") }))"""
GRAPH = "window.__torchscope.state().graph"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProc, str, dict[str, Any]]]:
    """The server, the session id of the recorded run, and the step's graph as the file holds it."""
    tmp = tmp_path_factory.mktemp("top-ops")
    path = tmp / "mlp.tscope"
    with ServerProc(tmp / "data") as srv:
        sid = recorded(srv, path, SCRIPT, "--steps", "3")
        session = load(path)
        assert STEP in session.graph_steps, session.graph_steps
        yield srv, sid, dict(session.graph(STEP))


def expected(records: list[dict[str, Any]], key: Any) -> dict[str, tuple[int, float]]:
    """(calls, summed dur_us) per ``key(record)``, summed in id order (as the page does)."""
    calls: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    for r in sorted(records, key=lambda r: r["id"]):
        calls[key(r)] += 1
        total[key(r)] += r.get("dur_us", 0.0)
    return {k: (calls[k], total[k]) for k in calls}


def forward_ops(graph: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for o in graph["ops"] if o.get("phase", "forward") == "forward"]


def assert_rows_match(rows: list[dict[str, Any]], want: dict[str, tuple[int, float]]) -> None:
    got = {r["key"]: (r["calls"], r["total"]) for r in rows}
    assert set(got) == set(want), (got, want)
    for k, (calls, total) in want.items():
        assert got[k][0] == calls, (k, got[k], want[k])
        assert got[k][1] == pytest.approx(total, rel=1e-9, abs=1e-6), (k, got[k], want[k])


def open_top_ops(page: Any, srv: ServerProc, sid: str, query: str = f"?view=graph&step={STEP}&top=1") -> None:
    open_session(page, srv.url, sid, query)
    page.wait_for_function(f"(() => {{ const g = {GRAPH}; return g && g.step === {STEP} && g.nodes.length > 0; }})()", timeout=20_000)
    page.wait_for_selector("[data-testid=top-ops-table] tr.top-ops-row", timeout=10_000)


def test_top_ops_adds_up_the_recorded_step_and_sorts_by_a_column(run: tuple[ServerProc, str, dict[str, Any]]) -> None:
    srv, sid, graph = run
    with checked_page() as page:
        open_top_ops(page, srv, sid)
        assert page.locator("[data-testid=top-ops]").is_visible()
        assert page.get_attribute("[data-testid=top-ops-toggle]", "aria-pressed") == "true"
        shot(page, "top-ops-table")
        # the forward ops by name, as the file has them: 4 aten::addmm, 3 aten::relu, ...
        want = expected(forward_ops(graph), lambda o: o["name"])
        assert want["aten::addmm"][0] == 4 and want["aten::relu"][0] == 3, want
        rows = page.evaluate(TABLE_ROWS)
        assert_rows_match(rows, want)
        # total time, most first, to start with; the header says so
        totals = [r["total"] for r in rows]
        assert totals == sorted(totals, reverse=True), rows
        heads = page.evaluate(HEADERS)
        assert [h["text"] for h in heads][:4] == ["Name", "# of Calls", "Total time", "% of time"], heads
        assert {h["key"]: h["sort"] for h in heads}["total"] == "descending", heads
        # the cells in words: the name as recorded, the calls, the share adding up to 100 %
        for r in rows:
            assert r["cells"][0] == r["key"] and r["cells"][1] == str(r["calls"]), r
        shares = [float(r["cells"][3].rstrip(" %")) for r in rows]
        assert sum(shares) == pytest.approx(100, abs=0.5), shares
        caption = page.inner_text("[data-testid=top-ops-caption]")
        assert f"{len(forward_ops(graph))} forward ops, {len(want)} names" in caption, caption
        assert "one-time costs" not in caption  # (said of step 0 only, below)

        # a click on "# of Calls": most calls first (ties by name); again: fewest first
        page.click("[data-testid=top-ops-table] th[data-sort=calls]")
        rows = page.evaluate(TABLE_ROWS)
        assert [r["key"] for r in rows] == sorted(want, key=lambda k: (-want[k][0], k)), rows
        assert {h["key"]: h["sort"] for h in page.evaluate(HEADERS)}["calls"] == "descending"
        page.click("[data-testid=top-ops-table] th[data-sort=calls]")
        rows = page.evaluate(TABLE_ROWS)
        assert [r["key"] for r in rows] == sorted(want, key=lambda k: (want[k][0], k)), rows
        assert {h["key"]: h["sort"] for h in page.evaluate(HEADERS)}["calls"] == "ascending"
        page.click("[data-testid=top-ops-table] th[data-sort=name]")
        assert [r["key"] for r in page.evaluate(TABLE_ROWS)] == sorted(want)

        # the grad_fn nodes of the step: AddmmBackward0 4 times, AccumulateGrad 8 (a parameter each)
        page.select_option("[data-testid=top-ops-section]", "nodes")
        page.click("[data-testid=top-ops-table] th[data-sort=total]")  # (a new sort: most first)
        nodes = expected(graph["nodes"], lambda n: n["name"])
        assert nodes["AccumulateGrad"][0] == 8 and nodes["AddmmBackward0"][0] == 4, nodes
        rows = page.evaluate(TABLE_ROWS)
        assert_rows_match(rows, nodes)
        assert [r["total"] for r in rows] == sorted((r["total"] for r in rows), reverse=True)
        assert "top=nodes" in page.evaluate("location.search")

        # the forward ops by the module they ran in (the loss: outside the model)
        page.select_option("[data-testid=top-ops-section]", "forward")
        page.select_option("[data-testid=top-ops-by]", "module")
        outside = lambda o: "(outside the model)" if "outside_model" in o.get("flags", []) else "(root)"  # noqa: E731
        by_module = expected(forward_ops(graph), lambda o: o.get("module") or outside(o))
        assert by_module["0"][0] == 2 and "(outside the model)" in by_module, by_module  # aten::t and aten::addmm
        rows = page.evaluate(TABLE_ROWS)
        assert_rows_match(rows, by_module)
        assert "0 (Linear)" in [r["cells"][0] for r in rows], rows
        assert "topby=module" in page.evaluate("location.search")
        shot(page, "top-ops-by-module")

        # closed: out of the URL too
        page.click("[data-testid=top-ops-toggle]")
        assert not page.locator("[data-testid=top-ops]").is_visible()
        assert "top=" not in page.evaluate("location.search")
        page.click("[data-testid=top-ops-toggle]")
        assert page.locator("[data-testid=top-ops]").is_visible()
        assert "top=1" in page.evaluate("location.search")


def test_step_zeros_table_says_its_times_include_one_time_costs(run: tuple[ServerProc, str, dict[str, Any]]) -> None:
    """The first watched step's times hold its first kernel calls and allocations: a short run's
    only captured step read as steady times (QA 48b)."""
    srv, sid, _ = run
    with checked_page() as page:
        open_session(page, srv.url, sid, "?view=graph&step=0&top=1")
        page.wait_for_selector("[data-testid=top-ops-table] tr.top-ops-row", timeout=20_000)
        page.wait_for_function(f"{GRAPH}.step === 0")
        caption = page.inner_text("[data-testid=top-ops-caption]")
        assert "Step 0's times include one-time costs" in caption, caption


def test_the_sort_is_kept_in_the_url(run: tuple[ServerProc, str, dict[str, Any]]) -> None:
    """A sorted table shared as a link opens sorted the same way (topsort=); the default sort,
    total time most first, leaves the URL alone."""
    srv, sid, graph = run
    want = expected(forward_ops(graph), lambda o: o["name"])
    by_calls = sorted(want, key=lambda k: (want[k][0], k))  # fewest first, ties by name
    with checked_page() as page:
        open_top_ops(page, srv, sid)
        assert "topsort" not in page.evaluate("location.search")
        page.click("[data-testid=top-ops-table] th[data-sort=calls]")
        assert "topsort=calls" in page.evaluate("location.search")
        page.click("[data-testid=top-ops-table] th[data-sort=calls]")
        assert "topsort=calls-asc" in page.evaluate("location.search")
        assert [r["key"] for r in page.evaluate(TABLE_ROWS)] == by_calls
        page.reload()
        page.wait_for_selector("[data-testid=top-ops-table] tr.top-ops-row", timeout=10_000)
        assert [r["key"] for r in page.evaluate(TABLE_ROWS)] == by_calls
        assert {h["key"]: h["sort"] for h in page.evaluate(HEADERS)}["calls"] == "ascending"
        page.click("[data-testid=top-ops-toggle]")  # closed: out of the URL with the rest
        assert "topsort" not in page.evaluate("location.search")


def test_a_row_lights_up_the_ops_of_its_name_in_the_graph(run: tuple[ServerProc, str, dict[str, Any]]) -> None:
    srv, sid, graph = run
    addmm = [f"o{o['id']}" for o in sorted(forward_ops(graph), key=lambda o: o["id"]) if o["name"] == "aten::addmm"]
    assert len(addmm) == 4
    with checked_page() as page:
        open_top_ops(page, srv, sid)
        page.evaluate("window.__torchscope.expandAll()")
        page.wait_for_function(f"{GRAPH}.nodes.some((n) => n.key === '{addmm[-1]}')")
        page.click("[data-testid=top-ops-table] tr.top-ops-row[data-key='aten::addmm']")
        page.wait_for_function(f"{GRAPH}.selected === '{addmm[0]}'")
        g = page.evaluate(GRAPH)
        assert sorted(g["highlighted"]) == sorted(addmm), g["highlighted"]
        lit = [n for n in g["nodes"] if n["hi"]]
        assert sorted(n["key"] for n in lit) == sorted(addmm), lit
        assert {n["label"] for n in lit} == {"addmm"}, lit
        assert [r["on"] for r in page.evaluate(TABLE_ROWS) if r["key"] == "aten::addmm"] == [True]
        shot(page, "top-ops-row-highlight")
        # the same row again: the next of them selected, all still lit
        page.click("[data-testid=top-ops-table] tr.top-ops-row[data-key='aten::addmm']")
        page.wait_for_function(f"{GRAPH}.selected === '{addmm[1]}'")
        assert sorted(page.evaluate(GRAPH)["highlighted"]) == sorted(addmm)
        # another row: its ops instead
        relu = [f"o{o['id']}" for o in forward_ops(graph) if o["name"] == "aten::relu"]
        page.click("[data-testid=top-ops-table] tr.top-ops-row[data-key='aten::relu']")
        page.wait_for_function(f"{GRAPH}.selected === '{min(relu, key=lambda k: int(k[1:]))}'")
        assert sorted(page.evaluate(GRAPH)["highlighted"]) == sorted(relu)
        # Escape takes the highlight off, and the row's mark with it
        page.locator("canvas").first.focus()
        page.keyboard.press("Escape")
        page.wait_for_function(f"{GRAPH}.highlighted.length === 0")
        assert not any(r["on"] for r in page.evaluate(TABLE_ROWS))


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    assert data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


def test_export_png_draws_the_whole_graph_into_an_image(run: tuple[ServerProc, str, dict[str, Any]]) -> None:
    srv, sid, _graph = run
    with checked_page() as page:
        open_session(page, srv.url, sid, f"?view=graph&step={STEP}")
        page.wait_for_function(f"(() => {{ const g = {GRAPH}; return g && g.step === {STEP} && g.nodes.length > 0; }})()", timeout=20_000)
        page.evaluate("window.__torchscope.expandAll()")
        res = page.evaluate("""async () => {
          const v = window.__torchscope.app.views.graph.obj;
          const r = await v.exportPng({ download: false, dataUrl: true });
          // the image's pixels: how many differ from its top-left corner (the background)
          const bmp = await createImageBitmap(await (await fetch(r.dataUrl)).blob());
          const c = document.createElement("canvas"); c.width = bmp.width; c.height = bmp.height;
          const ctx = c.getContext("2d"); ctx.drawImage(bmp, 0, 0);
          const px = ctx.getImageData(0, 0, c.width, c.height).data;
          let ink = 0;
          for (let i = 0; i < px.length; i += 4) if (px[i] !== px[0] || px[i + 1] !== px[1] || px[i + 2] !== px[2]) ink++;
          return { ...r, ink, sceneW: v.scene.width, sceneH: v.scene.height, dpr: window.devicePixelRatio };
        }""")
        assert res["whole"] is True and res["scale"] == 1 and res["ratio"] == res["dpr"] == 1, {k: v for k, v in res.items() if k != "dataUrl"}
        # the whole scene, a 20 px margin round it and a 30 px title line above
        assert (res["width"], res["height"]) == (math.ceil(res["sceneW"] + 40), math.ceil(res["sceneH"] + 70)), res
        assert res["width"] > 300 and res["height"] > 300, res
        head, b64 = res["dataUrl"].split(",", 1)
        assert head == "data:image/png;base64"
        data = base64.b64decode(b64)
        assert len(data) == res["bytes"] > 5000
        assert png_size(data) == (res["width"], res["height"])
        assert res["ink"] > 0.02 * res["width"] * res["height"], res["ink"]  # boxes, edges and labels drawn
        assert res["filename"] == f"top_ops_mlp-step{STEP}.png"

        # the button downloads it, named after the session and the step
        with page.expect_download() as dl:
            page.click("[data-testid=export-png]")
        download = dl.value
        assert download.suggested_filename == f"top_ops_mlp-step{STEP}.png"
        saved = Path(download.path()).read_bytes()
        assert png_size(saved) == (res["width"], res["height"])
        page.wait_for_selector("[data-testid=export-note]")
        assert "top_ops_mlp-step2.png" in page.inner_text("[data-testid=export-note]")
        shot(page, "top-ops-export-note")

        # past the caps: the whole graph smaller while its labels are drawn, else the view
        caps = page.evaluate("""() => {
          const c = window.__torchscope.app.views.graph.obj.canvas;
          const small = c.exportCanvas({ maxSide: 1000, maxPixels: 1000 * 1000 });
          const tiny = c.exportCanvas({ maxSide: 250, maxPixels: 250 * 250, header: (whole) => (whole ? "whole" : "view") });
          return { small: { w: small.width, h: small.height, whole: small.whole, scale: small.scale },
                   tiny: { w: tiny.width, h: tiny.height, whole: tiny.whole, ratio: tiny.ratio, full: tiny.full },
                   view: [c.w, c.h] };
        }""")
        small, tiny = caps["small"], caps["tiny"]
        assert small["whole"] and 0.45 <= small["scale"] < 1 and max(small["w"], small["h"]) <= 1000, caps
        assert not tiny["whole"] and max(tiny["w"], tiny["h"]) <= 250, caps
        assert tiny["full"] == [res["width"], res["height"]], caps
        view_w, view_h = caps["view"]
        assert (tiny["w"], tiny["h"]) == (math.ceil(view_w * tiny["ratio"]), math.ceil((view_h + 30) * tiny["ratio"])), caps
