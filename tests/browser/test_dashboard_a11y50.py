"""Accessibility and keyboard findings of QA 50b, in a real headless Chromium against a real
`torchscope serve`:

- F1: a chart's screen-reader label said the last *finite* value ("last 0.066" of a run NaN for
  its second half) and never NaN/Inf; now "last NaN (step 199); NaN/Inf at 100 steps, first at
  step 100", on the session page and on Compare runs.
- F17: Compare runs drew a NaN total gradient norm as no data; now red ticks, as the session page.
- F15: the ranks view's peak bytes zoomed a few bytes' wobble to the plot's height, in bytes.
- F2 / F18: the graph canvas had no role (its label not exposed) and selecting a node said
  nothing; the step slider said its index, its buttons their glyphs.
- F4: the heat map was mouse-only, its label "Hover a cell".
- F3 / F11: the activation rows' focus had no outline; a chart's live read-out was ``hidden``
  until a key was pressed (several screen readers then miss the first announcement).
- F5 / F10: the empty sessions page told a server on another port to use watch(model), which
  goes to 6150; each row's "Delete" did not say which run.
- F9 / F16: every tab was a Tab stop, the Doctor tab read "Doctor1"; following a finding left
  the focus on <body>; the theme toggle's state was not exposed.

The runs are frames posted to the server's ingest endpoint (the real codec): a run whose loss and
first parameter's gradient are NaN from step 100 to its end (200 steps), and a finite one.
"""

from __future__ import annotations

import math
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from browser_page import checked, graph_settled, module_browser, open_session  # noqa: F401 (fixtures)
from conftest import ServerProc

from torchscope.sessionfile import encode_frame

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect

STEPS, NAN_FROM = 200, 100
GRADS = "window.__torchscope.app.views.gradients.obj"


def _frames(sid: str, name: str, nan_from: int | None, decay: bool = False) -> bytes:
    """A finished run of STEPS steps as the transport frames it, NaN from ``nan_from`` on; with
    ``decay`` the first parameter's gradient norm falls from 1 to 1e-4 (four decades)."""
    session = {"kind": "session", "schema": [1, 0], "session_id": sid, "name": name, "rank": 0, "world_size": 1,
               "model": "MLP", "started_at": time.time(),
               "params": [{"name": "fc0.weight", "module": "fc0"}, {"name": "fc1.weight", "module": "fc1"}]}
    ops = [{"id": i, "name": "aten::addmm" if i % 2 == 0 else "aten::relu", "module": f"fc{i % 2}",
            "phase": "forward", "inputs": [i], "outputs": [i + 1]} for i in range(4)]
    graph = {"kind": "graph", "step": 0, "rank": 0, "micro": 0, "complete": True, "ops": ops,
             "nodes": [{"id": i, "name": "AddmmBackward0", "op": i, "module": ops[i]["module"]} for i in range(4)],
             "edges": [[i, i + 1, 0] for i in range(3)], "tensors": [{"id": i, "shape": [2, 3]} for i in range(5)], "root": 0}
    # an attention op's long name and wide tensors, for the details panel at 800 px (F19)
    wide = {"id": 5, "shape": [128, 4, 32, 32], "stride": [4096, 1024, 32, 1], "dtype": "torch.float32", "storage": 9, "offset": 0}
    graph["tensors"].append(wide)
    ops.append({"id": 4, "name": "aten::_scaled_dot_product_flash_attention_for_cpu", "module": "fc1", "phase": "forward",
                "inputs": [5, 5, 5], "outputs": [5]})
    steps = []
    for s in range(STEPS):
        bad = nan_from is not None and s >= nan_from
        steps.append({"kind": "step", "step": s, "rank": 0, "t": 1000.0 + s, "duration_us": 1000 + s,
                      "loss": math.nan if bad else 1.0 / (s + 1), "graph_signature": "sig", "graph_captured": s == 0,
                      "grads": {"norm": [math.nan if bad else 10 ** (-s / 50) if decay else 0.5 + s / 100, 0.2 + s / 1000],
                                "nan": [int(bad), 0],
                                "inf": [0, 0], "none": []},
                      "memory": {"live": 1000 + s, "peak": 2000 + s, "params": 400, "grads": 400}})
    batches = [[session], [graph], *(steps[i:i + 50] for i in range(0, STEPS, 50)),
               [{"kind": "end", "t": time.time(), "status": "finished", "steps": STEPS}]]
    return b"".join(encode_frame(i, b) for i, b in enumerate(batches))


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """One server holding the NaN run "nanrun" (id nan50) and the finite "okrun" (ok50), both diagnosed."""
    with ServerProc(tmp_path_factory.mktemp("a11y50-server")) as s:
        for sid, name, nan_from in (("nan50", "nanrun", NAN_FROM), ("ok50", "okrun", None), ("dec50", "decayrun", None)):
            req = urllib.request.Request(f"{s.url}/api/ingest/{sid}/0", data=_frames(sid, name, nan_from, sid == "dec50"),
                                         headers={"Content-Type": "application/x-tscope-frames"})
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 200
        deadline = time.monotonic() + 30
        while not all(x.get("diagnosed") and x["status"] == "finished" for x in s.get("/api/sessions")):  # type: ignore[union-attr]
            assert time.monotonic() < deadline, s.get("/api/sessions")
            time.sleep(0.2)
        yield s


@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


def gradients(page: Any, srv: ServerProc, query: str = "", sid: str = "nan50") -> None:
    open_session(page, srv.url, sid, "?view=gradients" + query)
    page.wait_for_function(f"{GRADS}.loss.x?.length === {STEPS} && {GRADS}.total.x?.length === {STEPS} && !!{GRADS}.heatGeom")


def test_chart_labels_say_nan_and_compare_marks_a_nan_norm(page: Any, srv: ServerProc) -> None:
    """F1, F11, F15, F17: the labels say the last value as it is and the NaN/Inf steps, per line;
    the read-out is a live region from the start; Compare ticks a NaN gradient norm."""
    gradients(page, srv)
    loss = page.locator("[data-testid=loss] canvas").get_attribute("aria-label") or ""
    assert (f"loss: from 0.01000 to 1.000, last NaN (step {STEPS - 1}); "
            f"NaN/Inf at {STEPS - NAN_FROM} steps, first at step {NAN_FROM}.") in loss, loss
    assert "Enter marks the step of the point read" in loss and loss.endswith("Arrow keys read the points."), loss
    total = page.locator("[data-testid=total-norm] canvas").get_attribute("aria-label") or ""
    assert f"last NaN (step {STEPS - 1}); NaN/Inf at {STEPS - NAN_FROM} steps, first at step {NAN_FROM}" in total, total
    # the read-out is in the accessibility tree before any key (no box on screen), then says the point
    tip = page.locator("[data-testid=loss] .chart-tip")
    assert tip.get_attribute("hidden") is None and tip.get_attribute("role") == "status"
    assert page.evaluate("getComputedStyle(document.querySelector('[data-testid=loss] .chart-tip')).display") != "none"
    assert not tip.is_visible()
    tree = page.context.new_cdp_session(page).send("Accessibility.getFullAXTree")["nodes"]
    regions = [n for n in tree if n.get("role", {}).get("value") == "status" and not n.get("ignored")]
    assert len(regions) >= 4, regions  # the loss's, the total norm's, the parameters' and the lr's read-outs
    page.locator("[data-testid=loss] canvas").focus()
    page.keyboard.press("End")
    tip.wait_for(state="visible")
    assert tip.inner_text().split("\n") == [f"step {STEPS - 1}", "loss: NaN"]
    # F18: a dot marks the point read on its line (none on a NaN: no point there), gone on blur
    dots = "document.querySelectorAll('[data-testid=loss] .chart-dot').length"
    assert page.evaluate(dots) == 0
    page.keyboard.press("Home")
    dot = page.evaluate("""() => { const d = document.querySelector('[data-testid=loss] .chart-dot'), c = document.querySelector('[data-testid=loss] canvas');
      if (!d) return null; const a = d.getBoundingClientRect(), b = c.getBoundingClientRect(); return [a.left + a.width / 2 - b.left, a.top + a.height / 2 - b.top, b.width, b.height]; }""")
    assert dot is not None and 60 <= dot[0] <= 75 and 0 <= dot[1] <= dot[3], dot  # step 0, at the plot's left edge
    page.locator("[data-testid=loss] canvas").blur()
    assert page.evaluate(dots) == 0

    # F15: the peak bytes per step (2,000 to 2,199 B) from 0, in KiB: no 199-byte "spike" over the plot's height
    open_session(page, srv.url, "nan50", "?view=ranks")
    page.wait_for_function("window.__torchscope.app.views.ranks?.obj.mem.axis?.labels.length > 0")
    axis = page.evaluate("window.__torchscope.app.views.ranks.obj.mem.axis")
    assert axis["lo"] == 0 and all(x.endswith(" KiB") for x in axis["labels"]), axis

    page.goto(f"{srv.url}/compare?a=nan50&b=ok50")
    page.wait_for_function("window.__torchscope && window.__torchscope.state().charts.grad_norm?.x.length > 0")
    state = page.evaluate("window.__torchscope.state()")
    assert state["charts"]["grad_norm"]["marks"] == list(range(NAN_FROM, STEPS))
    assert state["charts"]["loss"]["marks"] == list(range(NAN_FROM, STEPS))
    label = page.locator("[data-testid=compare-loss] canvas").get_attribute("aria-label") or ""
    assert f"last NaN (step {STEPS - 1}); NaN/Inf at {STEPS - NAN_FROM} steps" in label, label
    norm = page.locator("[data-testid=compare-grad_norm]").inner_text()
    assert "ticks at the top: a NaN/Inf norm" in norm, norm


def test_graph_canvas_is_exposed_and_says_the_node_selected(page: Any, srv: ServerProc) -> None:
    """F2, F18: the canvas is an application with its label; n says the node in a live region;
    the slider's value is the step, its buttons are named in words."""
    open_session(page, srv.url, "nan50", "?view=graph")
    graph_settled(page)
    canvas = page.locator(".view-graph canvas[tabindex='0']").first
    assert canvas.get_attribute("role") == "application"
    assert page.get_by_role("application", name="computation graph").count() == 1
    announce = page.locator("[data-testid=graph-announce]")
    assert announce.get_attribute("role") == "status" and announce.get_attribute("aria-live") == "polite"
    canvas.focus()

    def select(key: str) -> str:
        """The live region's words once ``key`` selected another node."""
        before = announce.text_content()
        page.keyboard.press(key)
        graph_settled(page)
        page.wait_for_function("(b) => document.querySelector('[data-testid=graph-announce]').textContent !== b", arg=before)
        return announce.text_content() or ""

    # a collapsed module first, then (expanded) its first op: the details panel's head in one line
    said = select("n")
    assert said == f"{page.locator('.details-title').inner_text()}, module group, forward", said
    page.keyboard.press("Enter")
    said = select("n")
    kind = page.locator("[data-testid=details-kind]").inner_text()
    assert said == f"{page.locator('.details-title').inner_text()}, {kind}, fc0, [2, 3]", said
    slider = page.locator("[data-testid=step-range]")
    assert slider.get_attribute("aria-valuetext") == "step 0"
    assert page.get_by_role("button", name="previous captured step").count() == 1
    assert page.get_by_role("button", name="next captured step").count() == 1


def test_heat_map_walks_with_the_keyboard(page: Any, srv: ServerProc) -> None:
    """F4: the heat map takes the focus, the arrows move a cell cursor said in a live region,
    Enter opens the cell's graph as a click does; the label no longer says "hover" alone."""
    gradients(page, srv)
    heat = page.locator("[data-testid=heatmap]")
    assert heat.get_attribute("tabindex") == "0"
    label = heat.get_attribute("aria-label") or ""
    assert "Keyboard: arrow keys move over the cells, Enter opens its step's graph." in label, label
    out = page.locator("[data-testid=heat-hover]")
    assert out.get_attribute("role") == "status" and out.get_attribute("aria-live") == "polite"
    heat.focus()
    page.keyboard.press("End")  # the first key shows where the cursor starts: the last step, the first module
    assert out.inner_text().startswith(f"fc0 · step {STEPS - 1} · ‖grad‖ NaN/Inf"), out.inner_text()
    page.keyboard.press("Home")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowDown")
    assert out.inner_text().startswith("fc1 · step 1 · ‖grad‖ "), out.inner_text()
    page.keyboard.press("Enter")
    page.wait_for_function("new URLSearchParams(location.search).get('view') === 'graph'")


def test_focus_lands_and_tabs_rove(page: Any, srv: ServerProc) -> None:
    """F3, F9, F16: an activation row's focus is the 2 px outline; one Tab stop for the tabs,
    each controlling its view, the Doctor's named with its count; a finding followed with Enter
    puts the focus on the opened view's note; the theme toggle says whether it is on."""
    gradients(page, srv)
    tabs = page.locator("[role=tab]")
    assert [tabs.nth(i).get_attribute("tabindex") for i in range(tabs.count())].count("0") == 1
    selected = page.locator("[role=tab][aria-selected=true]")
    assert selected.get_attribute("tabindex") == "0" and selected.get_attribute("aria-controls") == "view-gradients"
    assert page.locator("#view-gradients[role=tabpanel]").count() == 1
    page.wait_for_function("document.getElementById('finding-count').textContent === '1'")
    assert page.get_by_role("tab", name="Doctor, 1 finding", exact=True).count() == 1
    # the rows' class, focused from the keyboard: the same outline as a button's
    page.keyboard.press("Shift")
    outline = page.evaluate("""() => { const r = document.createElement('div'); r.className = 'act-row act-link'; r.tabIndex = 0;
      document.querySelector('[data-testid=loss]').append(r); r.focus(); const cs = getComputedStyle(r);
      const out = [cs.outlineStyle, cs.outlineWidth]; r.remove(); return out; }""")
    assert outline == ["solid", "2px"], outline
    theme = page.locator("#theme")
    before = theme.get_attribute("aria-pressed")
    assert before in ("true", "false") and theme.get_attribute("aria-label") == "dark theme"
    theme.click()
    assert theme.get_attribute("aria-pressed") == {"true": "false", "false": "true"}[before]
    page.locator("[role=tab][data-view=diagnostics]").click()
    finding = page.locator("button.finding[data-code=P4]")
    finding.focus()
    page.keyboard.press("Enter")
    page.wait_for_function("new URLSearchParams(location.search).get('view') === 'gradients'")
    page.wait_for_function("document.activeElement?.dataset?.testid === 'gradients-finding'")


def test_sessions_page_names_its_server_and_each_rows_run(page: Any, srv: ServerProc) -> None:
    """F5, F10: a row's controls say its run; an empty list on a port other than 6150 says
    the watch() call that reaches this server."""
    page.goto(srv.url + "/")
    row = page.locator("tr[data-id=nan50]")
    row.wait_for()
    # (described by the run's name, their names kept: the other tests find them by those)
    for verb in ("Rename", "Tag", "Download", "Delete"):
        expect(row.get_by_role("button", name=verb, exact=True)).to_have_accessible_description("nanrun")
    expect(row.get_by_role("checkbox", name="compare", exact=True)).to_have_accessible_description("nanrun")
    # the same page with no session on its server
    page.route("**/api/sessions", lambda route: route.fulfill(json=[]))
    page.reload()
    empty = page.locator("#empty")
    empty.wait_for()
    assert f'torchscope.watch(model, server="{srv.url}")' in empty.inner_text(), empty.inner_text()
    assert f"TORCHSCOPE_SERVER={srv.url}" in empty.inner_text()


def test_a_gradient_norm_spanning_decades_is_drawn_on_a_log_axis(page: Any, srv: ServerProc) -> None:
    """F8: a parameter's ‖grad‖ falling 1000x (a deep model's first layer) was drawn on a linear
    axis, its later steps on the 0.00 line, read as a gradient that stopped.  Two decades of the
    chosen lines' bulk make the axis log, as the loss chart's; a run within one stays linear."""
    for sid, log in (("dec50", True), ("ok50", False)):
        gradients(page, srv, sid=sid)
        page.select_option("[data-testid=param-pick]", ["0"])
        page.wait_for_function(f"{GRADS}.lines.series.length === 1 && {GRADS}.lines.series[0].name === 'fc0.weight'")
        got = page.evaluate(f"({{ log: {GRADS}.lines.opts.log, title: {GRADS}.lines.title.textContent }})")
        assert got["log"] is log, (sid, got)
        assert ("log scale" in got["title"]) is log, (sid, got)


def test_the_graph_keeps_room_at_200_percent_zoom(page: Any, srv: ServerProc) -> None:
    """F20: at 640 x 400 css px (a 1280 x 800 laptop at 200 % zoom) the details panel kept 300 px
    and the minimap covered most of what was left of the graph; both give way now."""
    page.set_viewport_size({"width": 640, "height": 400})
    open_session(page, srv.url, "nan50", "?view=graph")
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")
    r = page.evaluate("""() => {
      const box = (s) => { const e = document.querySelector(s); return e && e.getBoundingClientRect(); };
      const map = document.querySelector('.minimap');
      return { stage: box('.stage').width, panel: box('aside.details').width, map: map ? getComputedStyle(map).display : 'none' };
    }""")
    assert r["panel"] <= 240 and r["stage"] >= 400 and r["map"] == "none", r


def test_the_details_panel_fits_at_800_px(page: Any, srv: ServerProc) -> None:
    """F19: at 800 x 600 an attention op's details ran 40 px past the 300 px panel (the inputs
    table's storage column cut) and its name broke mid-word; now the table takes the panel's
    width and the name breaks after its underscores."""
    page.set_viewport_size({"width": 800, "height": 600})
    open_session(page, srv.url, "nan50", "?view=graph&node=o4")
    page.wait_for_function("(() => { const t = document.querySelector('aside.details .details-title'); return t && /flash/.test(t.textContent); })()")
    r = page.evaluate("""() => { const a = document.querySelector('aside.details');
      return { client: a.clientWidth, scroll: a.scrollWidth, breaks: a.querySelectorAll('.details-title wbr').length }; }""")
    assert r["scroll"] <= r["client"] and r["breaks"] >= 5, r
