"""Layout at 1024 and 800 px (QA 42b), measured on a real recorded run (the P2 dead-branch
pitfall: four module boxes, four ops) imported into a real server, and a second run of it
renamed to 150 letters with no space:

* the graph's first view fits a graph this small whole, as "f" does, also when the window is
  sized after the page opened (the view kept the old width's zoom, and at 1024 px the backward
  column's "gate: Sequ…" ran off the canvas's edge);
* the session page's header cuts a 150-letter name (whole in its title), and "● connected" and
  the theme toggle stay in the window, "● connected" on one line;
* at 800 px the sessions list does not break an ordinary name inside a word ("p02_dea / d_branc
  / h"), and the 150-letter name still does not widen the page."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from browser_page import checked_context, module_browser, open_session, recorded, shot  # noqa: F401 - fixtures
from conftest import EXAMPLES, ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

LONG = "a" * 150
NAME = "p02_dead_branch"  # the script's own name for its run

GRAPH = "window.__torchscope.app.views.graph.obj"
FITTED = "(() => { const v = window.__torchscope.app.views.graph?.obj; return !!v && !!v.scene && v.fitted; })()"
# every box of the scene (collapsed modules and ops) on the page, and the canvas's rectangle
BOXES = f"""() => {{
  const v = {GRAPH}, c = v.canvas, r = c.canvas.getBoundingClientRect();
  return {{ canvas: [r.left, r.top, r.right, r.bottom], scale: c.scale,
    boxes: v.scene.items.map((it) => [it.label, r.left + c.tx + it.box[0] * c.scale, r.top + c.ty + it.box[1] * c.scale,
      r.left + c.tx + (it.box[0] + it.box[2]) * c.scale, r.top + c.ty + (it.box[1] + it.box[3]) * c.scale]) }};
}}"""
RECT = "(sel) => { const r = document.querySelector(sel).getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }"
# how many lines an element's text takes: its text's line boxes (a Range's rects), by their tops
LINES = """(el) => { const r = document.createRange(); r.selectNodeContents(el);
  return new Set([...r.getClientRects()].filter((b) => b.width > 0).map((b) => Math.round(b.top))).size; }"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProc, str, str]]:
    """The server, the P2 run's id and the id of its copy renamed to 150 letters."""
    tmp = tmp_path_factory.mktemp("qa43")
    script = EXAMPLES / "pitfalls" / "p02_dead_branch.py"
    with ServerProc(tmp / "data") as srv:
        # two runs, side by side (an import of the same file twice is the same session)
        with ThreadPoolExecutor(2) as pool:
            sid, long_id = pool.map(lambda n: recorded(srv, tmp / f"p02-{n}.tscope", script, "--steps", n), ["2", "3"])
        httpx.patch(f"{srv.url}/api/sessions/{long_id}", json={"name": LONG}, timeout=30).raise_for_status()
        yield srv, sid, long_id


def all_in_canvas(page: Any, what: str) -> dict[str, Any]:
    got = page.evaluate(BOXES)
    x0, y0, x1, y1 = got["canvas"]
    assert len(got["boxes"]) == 8, (what, got)  # 2 x (body, gate) modules, add, mse_loss and their grad_fns
    for label, bx0, by0, bx1, by1 in got["boxes"]:
        assert x0 <= bx0 and bx1 <= x1 and y0 <= by0 and by1 <= y1, (what, label, [bx0, by0, bx1, by1], got["canvas"])
    assert got["scale"] >= 0.45, (what, got["scale"])  # readable: the boxes' labels are drawn
    return got


def test_a_small_graph_is_fitted_whole_at_1024_px(runs: Any, module_browser: Any) -> None:  # noqa: F811
    srv, sid, _ = runs
    with checked_context(module_browser, 1024, 700) as page:
        open_session(page, srv.url, sid)
        page.wait_for_function(FITTED)
        all_in_canvas(page, "opened at 1024 px")
        page.keyboard.press("f")  # the fit is where the first view was
        assert page.evaluate(f"{GRAPH}.canvas.scale") == pytest.approx(page.evaluate(BOXES)["scale"])
    # the window sized after the page opened at 1280 px (where the graph fits at 100 %)
    with checked_context(module_browser, 1280, 700) as page:
        open_session(page, srv.url, sid)
        page.wait_for_function(FITTED)
        wide = page.evaluate(f"{GRAPH}.canvas.w")
        page.set_viewport_size({"width": 1024, "height": 700})
        page.wait_for_function(f"{GRAPH}.canvas.w < {wide}")
        page.wait_for_timeout(100)  # the observer's fit and its frame
        shot(page, "qa43-graph-1024")
        fitted = all_in_canvas(page, "sized from 1280 to 1024 px")
        # a view the user moved is theirs: a zoom survives the window's next size
        page.evaluate(f"{GRAPH}.canvas.zoomAt(200, 200, 1.5)")
        zoomed = page.evaluate(f"{GRAPH}.canvas.scale")
        assert zoomed == pytest.approx(fitted["scale"] * 1.5)
        narrow = page.evaluate(f"{GRAPH}.canvas.w")
        page.set_viewport_size({"width": 1100, "height": 700})
        page.wait_for_function(f"{GRAPH}.canvas.w > {narrow}")
        page.wait_for_timeout(100)
        assert page.evaluate(f"{GRAPH}.canvas.scale") == zoomed


@pytest.mark.parametrize("width", [1024, 800])
def test_a_long_name_leaves_the_header_indicators_in_view(runs: Any, module_browser: Any, width: int) -> None:  # noqa: F811
    srv, sid, long_id = runs
    with checked_context(module_browser, width, 700) as page:
        for s, name in ((long_id, LONG), (sid, NAME)):
            open_session(page, srv.url, s)
            page.wait_for_function("document.getElementById('conn').textContent === '● connected'")
            shot(page, f"qa43-header-{width}-{len(name)}")
            inner = page.evaluate("window.innerWidth")
            for sel in ("#conn", "#theme"):
                x0, _, x1, _ = page.evaluate(RECT, sel)
                assert x0 >= 0 and x1 <= inner, (name[:20], sel, x0, x1, inner)
            assert page.evaluate(LINES, page.query_selector("#conn")) == 1, (name[:20], "● connected on more lines")
            assert page.evaluate("document.documentElement.scrollWidth") <= inner, name[:20]
            # the name: the whole of it, cut or not, is there to read
            title = page.locator("#session-title")
            assert title.text_content() == name and title.get_attribute("title") == name
            assert page.evaluate(RECT, "#session-title")[2] <= inner


def test_ordinary_names_keep_their_words_at_800_px(runs: Any, module_browser: Any) -> None:  # noqa: F811
    srv, sid, long_id = runs
    with checked_context(module_browser, 800, 600) as page:
        page.goto(srv.url + "/")
        page.wait_for_function("window.__torchscope && window.__torchscope.ready")
        page.evaluate("window.__torchscope.ready")
        page.locator(f"tr[data-id='{sid}'] a.session-link").wait_for()
        page.locator(f"tr[data-id='{long_id}'] a.session-link").wait_for()
        shot(page, "qa43-sessions-800")
        link = page.query_selector(f"tr[data-id='{sid}'] a.session-link")
        assert link is not None and link.text_content() == NAME
        assert page.evaluate(LINES, link) == 1, "p02_dead_branch broken inside its word"
        inner = page.evaluate("window.innerWidth")
        assert page.evaluate("document.documentElement.scrollWidth") <= inner
        for s in (sid, long_id):
            x0, _, x1, _ = page.evaluate(RECT, f"tr[data-id='{s}'] a.session-link")
            assert x0 >= 0 and x1 <= inner, (s, x0, x1, inner)
        # (and at 1280 px, one line as before)
        page.set_viewport_size({"width": 1280, "height": 600})
        assert page.evaluate(LINES, link) == 1


@pytest.mark.parametrize("query", ["?view=graph&step=-3&node=zz&overlay=bogus", "?view=graph&step=abc&node=zz&overlay=bogus"])
def test_a_links_bad_values_are_not_kept(runs: Any, module_browser: Any, query: str) -> None:  # noqa: F811
    """A typo'd or stale link (QA 42b): the graph shows the nearest captured step, colours by
    phase and selects nothing, and the URL then says so -- it kept ``node=zz&overlay=bogus``,
    which a copied link passed on."""
    srv, sid, _ = runs
    with checked_context(module_browser, 1280, 700) as page:
        open_session(page, srv.url, sid, query)
        page.wait_for_function(FITTED)
        page.wait_for_function("!new URLSearchParams(location.search).has('node')")
        q = page.evaluate("Object.fromEntries(new URLSearchParams(location.search))")
        assert "overlay" not in q and "node" not in q, q
        assert q.get("step") in (None, "0"), q  # the nearest captured step, or none asked
        assert page.evaluate(f"{GRAPH}.overlaySel.value") == "phase"
        assert page.evaluate(f"{GRAPH}.step") == 0
