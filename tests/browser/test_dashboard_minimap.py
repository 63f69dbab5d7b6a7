"""The Graph view's minimap, in a real headless Chromium against a real `torchscope serve`, on
runs recorded by real training scripts.

- It shows on a graph larger than the view (a full-mode transformer, every module expanded)
  and not on a tiny one the view holds whole (an MLP, collapsed); it sits inside the canvas,
  over none of the controls around it.
- Its viewport rectangle is the scene rectangle the main view shows (computed here from the
  view's transform and the canvas's size on the page), drawn where the scene maps onto it,
  and follows a pan and a zoom of the main view.
- A click on it centres the main view on the scene point under the pointer; a drag follows.
- Its "–" hides it (a "map" button brings it back), and a reload keeps the choice.
- Cheap: a pan or a zoom redraws only the viewport's rectangle, never the cached scene (which
  an overlay change does redraw), and its part of a frame is a fraction of a millisecond.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked_page, open_session, recorded, shot
from conftest import REPO, ServerProc, http_json, run_script

playwright_sync = pytest.importorskip("playwright.sync_api")

HERE = Path(__file__).resolve().parent
TRANSFORMER = HERE / "dashboard_train.py"
MLP = HERE / "dashboard_train_topops.py"
BLOCKS = 120

VIEW = "window.__torchscope.app.views.graph.obj"
MM = f"{VIEW}.minimap"
GRAPH_READY = f"(() => {{ const g = {VIEW}; return !!(g && g.scene && g.model); }})()"
ALL_EXPANDED = f"""(() => {{ const g = {VIEW};
  return !!g.scene && g.scene.items.length === g.model.leaves.length && g.scene.items.every((it) => it.group === undefined); }})()"""
# two animation frames: whatever was asked to draw has drawn
FRAMES = "() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))"

# The main view as the page lays it out: its transform, the canvas's size on the page, the
# scene's size, the minimap canvas's box (null when not laid out) and the boxes around.
LAYOUT = f"""() => {{
  const v = {VIEW}, c = v.canvas, r = c.canvas.getBoundingClientRect();
  const box = (el) => {{ if (!el) return null; const b = el.getBoundingClientRect(); return b.width && b.height ? [b.left, b.top, b.width, b.height] : null; }};
  return {{ tx: c.tx, ty: c.ty, scale: c.scale, canvas: [r.left, r.top, r.width, r.height], scene: [c.scene.width, c.scene.height],
           minimap: box(document.querySelector("[data-testid=minimap-canvas]")), mapEl: box(document.querySelector("[data-testid=minimap]")),
           showBtn: box(document.querySelector("[data-testid=minimap-show]")),
           stage: box(v.stage), toolbar: box(v.toolbar), foot: box(document.querySelector(".graph-foot")),
           details: box(v.details), status: box(v.status), buttons: [...v.toolbar.querySelectorAll("button, select, input, label")].map(box).filter(Boolean) }};
}}"""

# The minimap's pixels: the colour at a point (CSS px from its top-left), and the share of its
# pixels that are not its background.
PIXELS = f"""([x, y]) => {{
  const m = {MM}, cv = m.canvas, dpr = cv.width / cv.getBoundingClientRect().width, ctx = cv.getContext("2d");
  const at = ctx.getImageData(Math.floor(x * dpr), Math.floor(y * dpr), 1, 1).data;
  const all = ctx.getImageData(0, 0, cv.width, cv.height).data, bg = all.slice(0, 4);
  const probe = document.createElement("canvas").getContext("2d");
  probe.fillStyle = m.ink(); probe.fillRect(0, 0, 1, 1);
  const sel = probe.getImageData(0, 0, 1, 1).data;
  let inked = 0;
  for (let i = 0; i < all.length; i += 4) if (Math.abs(all[i] - bg[0]) + Math.abs(all[i + 1] - bg[1]) + Math.abs(all[i + 2] - bg[2]) > 30) inked++;
  return {{ at: [...at.slice(0, 3)], sel: [...sel.slice(0, 3)], inked: inked / (all.length / 4) }};
}}"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("minimap-server")) as s:
        yield s


@pytest.fixture(scope="module")
def big(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A full-mode transformer step: a few thousand nodes, tall once expanded."""
    return recorded(srv, tmp_path_factory.mktemp("minimap-big") / "full.tscope", TRANSFORMER,
                    "--steps", "1", "--mode", "full", "--name", "minimap-full")


@pytest.fixture(scope="module")
def deep(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> str:
    """test_dashboard_big_graph's run: a deep residual MLP (120 blocks), about 2,400 nodes and
    1,500 module frames once expanded."""
    import httpx

    path = tmp_path_factory.mktemp("minimap-deep") / "deep.tscope"
    run_script(REPO / "benchmarks" / "bench_dashboard.py", "--train", str(path), "--blocks", str(BLOCKS), "--name", "minimap-deep")
    with open(path, "rb") as f:
        httpx.post(srv.url + "/api/sessions/import", files={"file": (path.name, f)}, timeout=120).raise_for_status()
    return next(str(s["id"]) for s in http_json(srv.url + "/api/sessions") if s["name"] == "minimap-deep")  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def tiny(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small MLP's step (default mode): its collapsed graph fits the view."""
    return recorded(srv, tmp_path_factory.mktemp("minimap-tiny") / "mlp.tscope", MLP, "--steps", "1")


def state(page: Any) -> dict[str, Any]:
    page.evaluate(FRAMES)
    return page.evaluate(f"{MM}.state()")  # type: ignore[no-any-return]


def open_expanded(page: Any, srv: ServerProc, sid: str) -> None:
    open_session(page, srv.url, sid, "?view=graph")
    page.wait_for_function(GRAPH_READY, timeout=20_000)
    page.get_by_test_id("expand-all").click()
    page.wait_for_function(ALL_EXPANDED, timeout=60_000)
    page.wait_for_function(f"{MM}.state().visible", timeout=10_000)


def visible_rect(lay: dict[str, Any]) -> list[float]:
    """The scene rectangle the main view shows, from its transform and the canvas's size."""
    s = lay["scale"]
    return [-lay["tx"] / s, -lay["ty"] / s, lay["canvas"][2] / s, lay["canvas"][3] / s]


def map_geometry(lay: dict[str, Any]) -> tuple[float, float, float, float]:
    """The minimap's mapping (kx, ky, ox, oy: minimap px = o + scene px * k), computed from the
    scene's size and the minimap canvas's size: the scene scaled to fit 180x140 and centred;
    across (or down) a graph thinner than 48 px so is stretched to 40 px, 4 px in from the sides."""
    w, h = lay["scene"]
    s = min(180 / w, 140 / h)

    def axis(length: float, side: float) -> tuple[float, float]:
        return (s, (side - length * s) / 2) if length * s >= 48 else (40 / length, 4)

    (kx, ox), (ky, oy) = axis(w, lay["minimap"][2]), axis(h, lay["minimap"][3])
    return kx, ky, ox, oy


def map_rect(lay: dict[str, Any], rect: list[float]) -> tuple[list[float], list[float]]:
    """Where a scene rectangle lies on the minimap (CSS px from its top-left); and the scales."""
    kx, ky, ox, oy = map_geometry(lay)
    return [kx, ky], [ox + rect[0] * kx, oy + rect[1] * ky, rect[2] * kx, rect[3] * ky]


def overlaps(a: list[float], b: list[float]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def assert_viewport_matches(page: Any) -> dict[str, Any]:
    lay, st = page.evaluate(LAYOUT), state(page)
    want = visible_rect(lay)
    assert st["viewport"] == pytest.approx(want, abs=0.5), (st["viewport"], want)
    k, on_map = map_rect(lay, want)
    assert st["scale"] == pytest.approx(k, rel=1e-6), (st["scale"], k)
    assert st["rect"] == pytest.approx(on_map, abs=0.01), (st["rect"], on_map)
    # and drawn there: the left edge of the rectangle (clipped to the minimap) in the accent colour
    # (no smaller than a few px: zoomed in, the view is a speck of a tall graph; on whole pixels)
    x0, y0 = max(on_map[0], 1), max(on_map[1], 1)
    x1, y1 = min(on_map[0] + on_map[2], lay["minimap"][2] - 1), min(on_map[1] + on_map[3], lay["minimap"][3] - 1)
    d = st["drawn"]
    assert d is not None, (st, lay)
    assert d[0] <= x0 + 0.5 and d[1] <= y0 + 0.5 and d[0] + d[2] >= x1 - 0.5 and d[1] + d[3] >= y1 - 0.5, (d, on_map)
    assert d[2] >= min(6, lay["minimap"][2] - 2) - 1 and d[3] >= min(6, lay["minimap"][3] - 2) - 1, d
    if on_map[2] >= 6:
        assert d[0] == pytest.approx(x0, abs=0.5) and d[0] + d[2] == pytest.approx(x1, abs=0.5), (d, on_map)
    if on_map[3] >= 6:
        assert d[1] == pytest.approx(y0, abs=0.5) and d[1] + d[3] == pytest.approx(y1, abs=0.5), (d, on_map)
    px = page.evaluate(PIXELS, [d[0], d[1] + d[3] / 2])
    assert sum(abs(a - b) for a, b in zip(px["at"], px["sel"], strict=True)) < 60, px
    return st


def test_shown_on_a_big_graph_not_on_one_that_fits(srv: ServerProc, big: str, tiny: str) -> None:
    with checked_page() as page:
        open_session(page, srv.url, tiny, "?view=graph")
        page.wait_for_function(GRAPH_READY, timeout=20_000)
        st = state(page)
        assert st["fits"] and not st["visible"] and not st["showButton"], st
        assert page.evaluate(LAYOUT)["minimap"] is None

        open_expanded(page, srv, big)
        st = state(page)
        lay = page.evaluate(LAYOUT)
        assert st["visible"] and not st["fits"], st
        assert lay["scene"][1] > 4 * lay["canvas"][3], lay["scene"]  # far taller than the view
        shot(page, "graph-minimap")
        # the graph's aspect ratio, no larger than 180x140, most of it not background
        w, h = lay["scene"]
        k = min(180 / w, 140 / h)
        assert lay["minimap"][2] <= 181 and lay["minimap"][3] <= 141, lay["minimap"]
        assert max(w * k, 48) == pytest.approx(lay["minimap"][2], abs=1) and max(h * k, 48) == pytest.approx(lay["minimap"][3], abs=1)
        assert page.evaluate(PIXELS, [0, 0])["inked"] > 0.15
        # in the canvas's corner, over none of the controls around it
        m, stage = lay["mapEl"], lay["stage"]
        assert stage[0] <= m[0] and m[0] + m[2] <= stage[0] + stage[2] and stage[1] <= m[1] and m[1] + m[3] <= stage[1] + stage[3], (m, stage)
        assert m[0] + m[2] > stage[0] + stage[2] - 20 and m[1] + m[3] > stage[1] + stage[3] - 20  # bottom-right
        for other in [lay["toolbar"], lay["foot"], lay["details"], lay["status"], *lay["buttons"]]:
            assert other is None or not overlaps(m, other), (m, other)
        tops = {round(b[1]) for b in lay["buttons"]}  # the toolbar still one row at 1280 px
        assert max(tops) - min(tops) < 20, tops
        assert_viewport_matches(page)


@pytest.mark.parametrize("run", ["big", "deep"])  # deep: so narrow it is stretched across
def test_viewport_follows_the_main_view_and_a_click_centres_it(srv: ServerProc, run: str, request: pytest.FixtureRequest) -> None:
    sid = request.getfixturevalue(run)
    with checked_page() as page:
        open_expanded(page, srv, sid)
        before = assert_viewport_matches(page)
        lay = page.evaluate(LAYOUT)
        cx, cy = lay["canvas"][0] + lay["canvas"][2] / 2, lay["canvas"][1] + lay["canvas"][3] / 2
        # a drag on the main canvas: the rectangle moves with the view
        page.mouse.move(cx - 200, cy)
        page.mouse.down()
        page.mouse.move(cx - 100, cy - 150, steps=5)
        page.mouse.move(cx, cy - 300, steps=5)
        page.mouse.up()
        moved = assert_viewport_matches(page)
        assert moved["viewport"][1] > before["viewport"][1] + 100, (before["viewport"], moved["viewport"])
        # the wheel: zoomed out, a larger rectangle
        page.mouse.move(cx, cy)
        page.mouse.wheel(0, 400)
        page.wait_for_function(f"{MM}.state().viewport[2] > {moved['viewport'][2] * 1.3}")
        zoomed = assert_viewport_matches(page)
        assert zoomed["rect"][2] > moved["rect"][2] * 1.3

        # a click on the minimap: the scene point under it in the middle of the main view
        lay = page.evaluate(LAYOUT)
        mm, (w, h) = lay["minimap"], lay["scene"]
        kx, ky, ox, oy = map_geometry(lay)
        for fx, fy in [(0.3, 0.7), (0.8, 0.15), (0.5, 0.95)]:
            mx, my = ox + fx * w * kx, oy + fy * h * ky
            page.mouse.click(mm[0] + mx, mm[1] + my)
            page.evaluate(FRAMES)
            lay = page.evaluate(LAYOUT)
            sx, sy = fx * w, fy * h  # the scene point clicked
            screen = [lay["tx"] + sx * lay["scale"], lay["ty"] + sy * lay["scale"]]
            assert screen == pytest.approx([lay["canvas"][2] / 2, lay["canvas"][3] / 2], abs=3), (fx, fy, screen, lay)
            assert_viewport_matches(page)
        # a drag across it: the view follows the pointer to where it is let go
        page.mouse.move(mm[0] + ox + 0.2 * w * kx, mm[1] + oy + 0.2 * h * ky)
        page.mouse.down()
        page.mouse.move(mm[0] + ox + 0.6 * w * kx, mm[1] + oy + 0.5 * h * ky, steps=6)
        page.mouse.up()
        page.evaluate(FRAMES)
        lay = page.evaluate(LAYOUT)
        screen = [lay["tx"] + 0.6 * w * lay["scale"], lay["ty"] + 0.5 * h * lay["scale"]]
        assert screen == pytest.approx([lay["canvas"][2] / 2, lay["canvas"][3] / 2], abs=3), screen
        # the test hook: the same as a click there
        page.evaluate(f"{MM}.clickAt({ox + 0.1 * w * kx}, {oy + 0.4 * h * ky})")
        page.evaluate(FRAMES)
        lay = page.evaluate(LAYOUT)
        screen = [lay["tx"] + 0.1 * w * lay["scale"], lay["ty"] + 0.4 * h * lay["scale"]]
        assert screen == pytest.approx([lay["canvas"][2] / 2, lay["canvas"][3] / 2], abs=3), screen
        assert page.evaluate(f"{VIEW}.selected") is None  # a click on the minimap selects nothing under it


def test_hide_button_hides_it_and_a_reload_keeps_that(srv: ServerProc, big: str) -> None:
    with checked_page() as page:
        open_expanded(page, srv, big)
        page.get_by_test_id("minimap-hide").click()
        st = state(page)
        assert not st["visible"] and st["showButton"] and st["on"] is False, st
        assert page.evaluate("localStorage.getItem('torchscope-minimap')") == "0"
        lay = page.evaluate(LAYOUT)
        assert lay["minimap"] is None and lay["showBtn"] is not None
        for other in [lay["toolbar"], lay["foot"], lay["details"], lay["status"]]:
            assert other is None or not overlaps(lay["showBtn"], other), (lay["showBtn"], other)

        page.reload()
        page.wait_for_function("window.__torchscope && window.__torchscope.ready")
        page.wait_for_function(GRAPH_READY, timeout=20_000)
        page.get_by_test_id("expand-all").click()
        page.wait_for_function(ALL_EXPANDED, timeout=60_000)
        st = state(page)
        assert not st["visible"] and st["showButton"] and not st["fits"], st
        assert st["cacheDraws"] == 0  # hidden: never drawn

        page.get_by_test_id("minimap-show").click()
        st = state(page)
        assert st["visible"] and not st["showButton"], st
        assert page.evaluate("localStorage.getItem('torchscope-minimap')") == "1"
        assert_viewport_matches(page)
        page.reload()
        page.wait_for_function("window.__torchscope && window.__torchscope.ready")
        page.wait_for_function(GRAPH_READY, timeout=20_000)
        page.get_by_test_id("expand-all").click()
        page.wait_for_function(ALL_EXPANDED, timeout=60_000)
        assert state(page)["visible"]


def test_pan_and_zoom_redraw_only_the_viewport_on_a_big_graph(srv: ServerProc, deep: str) -> None:
    with checked_page() as page:
        open_expanded(page, srv, deep)
        n = page.evaluate(f"{VIEW}.scene.items.length + {VIEW}.scene.frames.length")
        assert n > 3000, n
        st0 = state(page)
        assert st0["cacheDraws"] >= 1
        lay = page.evaluate(LAYOUT)
        cx, cy = lay["canvas"][0] + lay["canvas"][2] / 2, lay["canvas"][1] + lay["canvas"][3] / 2
        frames0 = page.evaluate(f"{VIEW}.canvas.frames")
        for i in range(12):  # drags and wheel turns, as a user looks around
            page.mouse.move(cx, cy)
            page.mouse.down()
            page.mouse.move(cx + (30 if i % 2 else -30), cy - 120, steps=4)
            page.mouse.up()
            page.mouse.wheel(0, -120 if i % 3 else 120)
            page.evaluate(FRAMES)
        st = state(page)
        frames = page.evaluate(f"{VIEW}.canvas.frames") - frames0
        assert frames >= 12, frames
        assert st["cacheDraws"] == st0["cacheDraws"], (st0, st)  # the scene's image kept
        assert st["viewDraws"] - st0["viewDraws"] >= frames  # the rectangle redrawn every frame
        assert_viewport_matches(page)
        # a selection keeps the scene's boxes: no redraw either
        page.evaluate(f"{VIEW}.select({VIEW}.scene.items[5].key)")
        assert state(page)["cacheDraws"] == st0["cacheDraws"]

        # panning only redraws the viewport rectangle over the kept image (how fast a frame's
        # part is: benchmarks/bench_dashboard.py)
        cache = page.evaluate(f"""() => {{
          const m = {MM}, c = m.graph;
          for (let i = 0; i < 20; i++) {{ c.tx += 1; m.update(); }}
          for (let i = 0; i < 5; i++) {{ c.tx -= 1; c.paint(); }}
          return m.cacheDraws;
        }}""")
        assert cache == st0["cacheDraws"], (cache, st0)

        # an overlay change recolours the boxes: the scene's image is redrawn, once
        page.select_option("[data-testid=overlay]", "dtype")
        page.wait_for_function(f"{MM}.state().cacheDraws === {st0['cacheDraws'] + 1}")
        shot(page, "graph-minimap-dtype")
