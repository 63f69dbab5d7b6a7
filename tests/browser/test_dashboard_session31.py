"""The graph view as the thirty-first session found it, in a real headless Chromium against a
real `torchscope serve`, with runs recorded by the real example and pitfall scripts:

- "Expand all" on a tall graph (full mode) fitted the whole graph's width, which is its last
  rows' (the "(outside modules)" backward group: a detach per AccumulateGrad, a dozen a row),
  thousands of pixels below what the view shows: both columns small, a third of the canvas
  empty.  It fits the width of what the first screen shows now;
- the time overlay's zero (a `detach()` or `.item()` recorded as a 0 µs op) has a grey of
  its own, outside the ramp -- checked here, as the memory overlay's zero bytes already were;
- the dashed link from an op to its grad_fn, grey on grey, vanished over a grey box (a view's
  0 B) in the dark theme: it is cased in the canvas's colour now;
- a P8 finding (an in-place op overwrote a tensor saved for backward) centred its op alone:
  the grad_fn that needed the old value was off the canvas.  Every target is in view now;
- a review as a PyTorch user: an nn.Sequential's children were rows "0", "1", "4" of the
  gradient heat map and the memory view's table (now "0 (Conv2d)"); a 0.47 µs op read "0 µs",
  the time overlay's word for an op not timed at all; the legend named the collapsed module's
  forward colour only, not its backward one; a collapsed module's label was cut in the middle
  of its type ("blocks: …nsformerEncoder").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked_page, open_session, recorded, shot
from conftest import EXAMPLES, ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("s31-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("s31-runs")


def record(srv: ServerProc, out: Path, script: Path, *args: str) -> str:
    """The session id of a real run of ``script``, recorded to a new file in ``out`` and imported."""
    return recorded(srv, out / f"{script.stem}-{len(list(out.iterdir()))}.tscope", script, "--server", "none", *args)


@pytest.fixture(scope="module")
def transformer_full(srv: ServerProc, runs_dir: Path) -> str:
    return record(srv, runs_dir, EXAMPLES / "transformer.py", "--steps", "1", "--mode", "full")


@pytest.fixture(scope="module")
def transformer(srv: ServerProc, runs_dir: Path) -> str:
    return record(srv, runs_dir, EXAMPLES / "transformer.py", "--steps", "1")


@pytest.fixture(scope="module")
def p01(srv: ServerProc, runs_dir: Path) -> str:
    return record(srv, runs_dir, EXAMPLES / "pitfalls" / "p01_no_grad_detach.py", "--steps", "2")


@pytest.fixture(scope="module")
def p08(srv: ServerProc, runs_dir: Path) -> str:
    return record(srv, runs_dir, EXAMPLES / "pitfalls" / "p08_inplace_modification.py")


def open_graph(page: Any, srv: ServerProc, sid: str, query: str = "") -> None:
    open_session(page, srv.url, sid, f"?view=graph{query}")
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")


def set_theme(page: Any, theme: str) -> None:
    if page.evaluate("document.documentElement.dataset.theme") != theme:
        page.locator("#theme").click()
    assert page.evaluate("document.documentElement.dataset.theme") == theme


# ----------------------------------------------------------------------------- 1. Expand all, tall
# The boxes (items and frames) on the canvas, on screen; the topmost box of each column; the
# canvas's size and the status line's inset.
FIRST_SCREEN = """() => {
  const v = window.__torchscope.app.views.graph.obj, c = v.canvas, sc = v.scene, m = v.model;
  const S = (b) => [c.tx + b[0] * c.scale, c.ty + b[1] * c.scale, c.tx + (b[0] + b[2]) * c.scale, c.ty + (b[1] + b[3]) * c.scale];
  const onScreen = (b) => b[1] < c.h && b[3] > 0;
  const items = sc.items.map((it) => S(it.box)).filter(onScreen), frames = sc.frames.map((f) => S(f.box)).filter(onScreen);
  const leaves = sc.items.filter((it) => it.leaf !== undefined);
  const top = (bwd) => S(leaves.filter((it) => (m.leaves[it.leaf].phase === "backward") === bwd)
    .reduce((p, q) => (q.box[1] < p.box[1] ? q : p)).box);
  return { items, frames, fwdTop: top(false), bwdTop: top(true), w: c.w, h: c.h, inset: c.topInset(), scale: c.scale };
}"""


@pytest.mark.parametrize("size", [(1920, 1080), (1280, 800)])
def test_expand_all_on_a_tall_graph_fits_what_the_first_screen_shows(srv: ServerProc, transformer_full: str,
                                                                      size: tuple[int, int]) -> None:
    with checked_page(*size) as page:
        open_graph(page, srv, transformer_full)
        page.evaluate("window.__torchscope.expandAll()")
        page.wait_for_function("window.__torchscope.state().graph.expanded.length > 10")
        page.wait_for_timeout(200)
        shot(page, f"s31-expand-all-tall-{size[0]}")
        r = page.evaluate(FIRST_SCREEN)
        assert len(r["items"]) > 40 and r["scale"] >= 0.45, r  # a tall graph, labelled
        # both columns' tops in view, whole across: at 1280 px the backward column began where
        # the forward column's widest row ended, the "(optimizer.step())" group far below, and
        # its top was cut at the canvas's edge (QA 50b)
        for top in (r["fwdTop"], r["bwdTop"]):
            assert r["inset"] <= top[1] and top[3] <= r["h"] / 3, r
            assert top[0] >= 0 and top[2] <= r["w"], r
        # every box on the first screen whole across, and the canvas's width used: fitted to
        # the whole graph's width (its last rows'), a sixth of it was left empty
        assert all(b[0] >= 0 and b[2] <= r["w"] for b in r["items"]), [b for b in r["items"] if b[0] < 0 or b[2] > r["w"]]
        boxes = r["items"] + r["frames"]
        left, right = min(b[0] for b in boxes), max(min(b[2], r["w"]) for b in boxes)
        assert right - left >= 0.9 * r["w"], (left, right, r["w"], r["scale"])


def test_the_collapsed_optimizer_group_has_the_optimizers_colour(srv: ServerProc, transformer_full: str) -> None:
    """Full mode's collapsed "(optimizer.step())" group was filled with the forward modules'
    blue while its ops and the legend were lilac (QA 50b): now a lilac of its own, in the legend."""
    with checked_page() as page:
        open_graph(page, srv, transformer_full)
        r = page.evaluate("""() => {
          const v = window.__torchscope.app.views.graph.obj, css = getComputedStyle(document.documentElement);
          const box = v.scene.items.find((it) => it.group !== undefined && it.name === "(optimizer.step())");
          const fwd = v.scene.items.find((it) => it.group !== undefined && it.name !== "(optimizer.step())" && !/backward/.test(it.key));
          return { opt: box && box.color, fwd: fwd && fwd.color, want: css.getPropertyValue("--group-opt").trim(),
                   legend: v.legend.textContent };
        }""")
        assert r["opt"] and r["want"] and r["opt"] == r["want"] and r["opt"] != r["fwd"], r
        assert "module, collapsed (forward | backward | optimizer.step())" in r["legend"], r


# ----------------------------------------------------------------------------- 2. time overlay zero
TIME_COLOURS = """async () => {
  const { NOTHING } = await import("/static/colors.js");
  const v = window.__torchscope.app.views.graph.obj, m = v.model;
  const items = v.scene.items.filter((it) => it.leaf !== undefined)
    .map((it) => ({ label: it.label, color: it.color, value: m.leaves[it.leaf].rec.dur_us }));
  const legend = [...v.legend.querySelectorAll(".legend-item")].map((e) => ({
    text: e.textContent, swatch: getComputedStyle(e.querySelector(".swatch")).backgroundColor }));
  const probe = document.createElement("span"); probe.style.color = NOTHING; document.body.append(probe);
  const grey = getComputedStyle(probe).color; probe.remove();
  return { items, legend, nothing: NOTHING, grey };
}"""


def test_the_time_overlay_tells_zero_microseconds_from_the_fastest_op(srv: ServerProc, p01: str) -> None:
    with checked_page() as page:
        open_graph(page, srv, p01, "&overlay=time")
        page.evaluate("window.__torchscope.expandAll()")  # every op its own box, none summed into a module's
        page.wait_for_function("window.__torchscope.state().graph.expanded.length > 0")
        page.wait_for_timeout(200)
        shot(page, "s31-time-overlay-zero")
        r = page.evaluate(TIME_COLOURS)
        zeros = [it for it in r["items"] if it["value"] == 0]
        timed = [it for it in r["items"] if isinstance(it["value"], (int, float)) and it["value"] > 0]
        assert zeros and len(timed) >= 3, r  # the detach() is recorded as a 0 µs op
        assert {it["color"] for it in zeros} == {r["nothing"]}, zeros
        fastest = min(timed, key=lambda it: it["value"])
        assert r["nothing"] != fastest["color"] and r["nothing"] not in {it["color"] for it in timed}, (r["nothing"], fastest)
        named = [e for e in r["legend"] if e["swatch"] == r["grey"]]
        assert named and "0 µs" in named[0]["text"], r["legend"]


# ----------------------------------------------------------------------------- 3. link over grey, dark
# A forward op level with its grad_fn with a grey (zero: a view's 0 B) box between them.
LINK_OVER_GREY = """async () => {
  const { NOTHING } = await import("/static/colors.js");
  const v = window.__torchscope.app.views.graph.obj, sc = v.scene, m = v.model;
  for (const [a, b, type] of m.edges) {
    if (type !== 2) continue;
    const A = sc.byKey.get(m.leaves[a].key), B = sc.byKey.get(m.leaves[b].key);
    if (!A || !B || Math.abs(A.box[1] - B.box[1]) > 1) continue;
    const y = A.box[1] + A.box[3] / 2, x0 = A.box[0] + A.box[2], x1 = B.box[0];
    const grey = sc.items.find((it) => it !== A && it !== B && it.color === NOTHING && it.box[1] < y && it.box[1] + it.box[3] > y
      && it.box[0] >= x0 && it.box[0] + it.box[2] <= x1);
    if (grey) return { op: A.key, grey: grey.key };
  }
  return null;
}"""

# Zoomed onto the grey box, the canvas's pixels inside it (3 px in) with the link drawn and
# with none: the highest contrast ratio (WCAG) of a pixel the link changed against the fill.
LINK_CONTRAST = """(grey) => {
  const v = window.__torchscope.app.views.graph.obj, c = v.canvas, sc = v.scene;
  const [x, y, w, h] = sc.byKey.get(grey).box;
  c.show({ scale: 2, tx: c.w / 2 - (x + w / 2) * 2, ty: c.h / 2 - (y + h / 2) * 2 });
  const read = () => { c.draw(); return c.ctx.getImageData(0, 0, c.canvas.width, c.canvas.height).data; };
  const link = sc.linkPath, shown = read();
  sc.linkPath = new Path2D();
  const bare = read();
  sc.linkPath = link; c.draw();
  const lum = (d, i) => {
    const l = [0, 1, 2].map((k) => { const u = d[i + k] / 255; return u <= 0.03928 ? u / 12.92 : ((u + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2];
  };
  let changed = 0, best = 1;
  for (let wx = x + 3; wx <= x + w - 3; wx += 0.5) for (let wy = y + 3; wy <= y + h - 3; wy += 0.5) {
    const px = Math.round((c.tx + wx * c.scale) * c.dpr), py = Math.round((c.ty + wy * c.scale) * c.dpr);
    if (px < 0 || py < 0 || px >= c.canvas.width || py >= c.canvas.height) continue;
    const i = 4 * (py * c.canvas.width + px);
    if (shown[i] === bare[i] && shown[i + 1] === bare[i + 1] && shown[i + 2] === bare[i + 2]) continue;
    changed++;
    const a = lum(shown, i), b = lum(bare, i);
    best = Math.max(best, (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05));
  }
  return { changed, contrast: best };
}"""


@pytest.mark.parametrize("theme", ["dark", "light"])
def test_the_link_to_a_grad_fn_shows_over_a_grey_box(srv: ServerProc, transformer: str, theme: str) -> None:
    with checked_page() as page:
        open_graph(page, srv, transformer, "&overlay=memory")
        set_theme(page, theme)
        pair = page.evaluate(LINK_OVER_GREY)
        assert pair, "no forward op level with its grad_fn with a grey box between them"
        page.evaluate(f"window.__torchscope.select({pair['op']!r})")
        page.wait_for_function(f"window.__torchscope.state().graph.selected === {pair['op']!r}")
        r = page.evaluate(LINK_CONTRAST, pair["grey"])
        shot(page, f"s31-link-over-grey-{theme}")
        assert r["changed"] > 20, r  # the link runs across the grey box
        # a line, not a shade: at least 3:1 against the fill somewhere along it (WCAG's non-text contrast)
        assert r["contrast"] >= 3, r


# ----------------------------------------------------------------------------- 4. P8 targets in view
TARGETS_ON_SCREEN = """() => {
  const v = window.__torchscope.app.views.graph.obj, c = v.canvas, sc = v.scene;
  const S = (b) => [c.tx + b[0] * c.scale, c.ty + b[1] * c.scale, c.tx + (b[0] + b[2]) * c.scale, c.ty + (b[1] + b[3]) * c.scale];
  return { boxes: Object.fromEntries([...v.highlight].map((k) => [k, S(sc.byKey.get(v.visibleKey(k)).box)])),
           w: c.w, h: c.h, inset: c.topInset(), scale: c.scale, selected: v.selected };
}"""


@pytest.mark.parametrize("size", [(1280, 800), (1024, 700)])
def test_a_p8_finding_shows_all_its_targets(srv: ServerProc, p08: str, size: tuple[int, int]) -> None:
    findings = srv.get(f"/api/sessions/{p08}/diagnostics")
    assert isinstance(findings, list)
    p8 = next(f for f in findings if f["code"] == "P8")
    keys = {f"o{t['op']}" for t in p8["targets"] if "op" in t} | {f"n{t['node']}" for t in p8["targets"] if "node" in t}
    assert any(k.startswith("o") for k in keys) and any(k.startswith("n") for k in keys), p8["targets"]
    with checked_page(*size) as page:
        open_session(page, srv.url, p08, "?view=diagnostics")
        page.locator("button.finding[data-code=P8]").click()
        page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.selected && g.nodes.some((n) => n.hi); })()")
        page.wait_for_timeout(300)
        shot(page, f"s31-p8-finding-{size[0]}")
        r = page.evaluate(TARGETS_ON_SCREEN)
        assert keys <= set(r["boxes"]), r
        for k in keys:
            b = r["boxes"][k]
            assert b[0] >= 0 and b[2] <= r["w"] and b[1] >= r["inset"] and b[3] <= r["h"], (k, r)
        assert r["scale"] >= 0.45, r  # two boxes fit at a zoom where labels are drawn


# ----------------------------------------------------------------------------- 5. the review's fixes
@pytest.fixture(scope="module")
def cnn(srv: ServerProc, runs_dir: Path) -> str:
    return record(srv, runs_dir, EXAMPLES / "cnn.py", "--steps", "3")


def test_numbered_modules_are_named_with_their_type(srv: ServerProc, cnn: str) -> None:
    """An nn.Sequential's children are modules "0", "1", "4"...: the heat map's rows and the
    memory view's table say what each is."""
    meta = srv.get(f"/api/sessions/{cnn}")
    assert isinstance(meta, dict)
    types = {m["path"]: m["type"] for m in meta["meta"]["modules"]}
    with checked_page() as page:
        open_session(page, srv.url, cnn, "?view=gradients")
        page.wait_for_function("document.querySelectorAll('[data-testid=heat-labels] .heat-label').length > 2")
        shot(page, "s31-heat-labels-types")
        rows = page.locator("[data-testid=heat-labels] .heat-label:not(.muted)").all_inner_texts()
        numbered = [p for p in types if p.isdigit()]
        assert len(rows) >= 3 and numbered, (rows, types)
        for row in rows:
            path = row.split(" ")[0]
            assert path in types and row == f"{path} ({types[path]})", (row, types)
        page.locator("nav#tabs button[data-view=memory]").click()
        page.wait_for_selector(".top-allocs table tr td")
        cells = page.evaluate("[...document.querySelectorAll('.top-allocs table tr')].slice(1).map((tr) => tr.children[2].textContent)")
        assert cells and all(c == f"{c.split(' ')[0]} ({types[c.split(' ')[0]]})" for c in cells), (cells, types)


def test_a_sub_microsecond_op_does_not_read_zero(srv: ServerProc, transformer: str) -> None:
    """The time overlay's scale starts at the fastest op (a view: well under a microsecond);
    its end reads that time, not "0 µs", the legend's word for an op not timed at all."""
    with checked_page() as page:
        open_graph(page, srv, transformer, "&overlay=time")
        page.wait_for_selector("[data-testid=ramp-legend]")
        lo = page.evaluate("window.__torchscope.app.views.graph.obj.scene.legend.lo")
        text = page.locator("[data-testid=ramp-legend] .ramp-end").first.inner_text()
        shot(page, "s31-time-legend")
        factor = {"µs": 1, "ms": 1e3, "s": 1e6}
        number, unit = text.split(" ")
        assert abs(float(number) * factor[unit] - lo) <= 0.05 * lo, (text, lo)
        # and the op's details say the same
        key = page.evaluate("""() => { const v = window.__torchscope.app.views.graph.obj;
          const l = v.model.leaves.filter((l) => l.rec.dur_us > 0).reduce((p, q) => (q.rec.dur_us < p.rec.dur_us ? q : p));
          return l.key; }""")
        page.evaluate(f"window.__torchscope.select({key!r})")
        page.wait_for_selector("[data-testid=details] table.kv")
        duration = page.evaluate("""() => [...document.querySelectorAll('[data-testid=details] table.kv tr')]
          .find((tr) => tr.children[0].textContent === 'duration').children[1].textContent""")
        assert duration != "0 µs", duration


# Every legend entry: its text and its swatch's computed colours; the theme's module colours.
LEGEND = """() => {
  const probe = (v) => { const e = document.createElement('span'); e.style.color = `var(${v})`; document.body.append(e);
    const c = getComputedStyle(e).color; e.remove(); return c; };
  return { items: [...document.querySelectorAll('[data-testid=legend] .legend-item')].map((e) => {
             const s = getComputedStyle(e.querySelector('.swatch'));
             return { text: e.textContent, paint: s.backgroundColor + ' ' + s.backgroundImage }; }),
           fwd: probe('--group-fwd'), bwd: probe('--group-bwd') };
}"""


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_legend_names_a_collapsed_modules_backward_colour(srv: ServerProc, transformer: str, theme: str) -> None:
    with checked_page() as page:
        open_graph(page, srv, transformer)
        set_theme(page, theme)
        r = page.evaluate(LEGEND)
        module = [e for e in r["items"] if "module" in e["text"]]
        assert module, r
        assert any(r["fwd"] in e["paint"] and r["bwd"] in e["paint"] and "backward" in e["text"] for e in module), r


# The collapsed modules' labels as drawn (cut to their box) beside their parts.
GROUP_LABELS = """() => window.__torchscope.app.views.graph.obj.scene.items
  .filter((it) => it.group !== undefined && it.fitLabel !== undefined)
  .map((it) => ({ label: it.label, fit: it.fitLabel, name: it.name, type: it.type, mark: it.mark }))"""


def test_a_collapsed_modules_label_keeps_its_name_and_the_start_of_its_type(srv: ServerProc, transformer: str) -> None:
    with checked_page() as page:
        open_graph(page, srv, transformer)
        page.wait_for_timeout(200)  # drawn: labels are cut as they are drawn
        shot(page, "s31-group-labels")
        labels = page.evaluate(GROUP_LABELS)
        cut = [g for g in labels if g["fit"] != g["label"]]
        assert cut, labels  # "blocks: TransformerEncoder" is wider than its box
        for g in cut:
            assert g["type"] and g["fit"].startswith(f"{g['name']}: {g['type'][:3]}") and g["fit"].endswith(g["mark"] or "…"), g
