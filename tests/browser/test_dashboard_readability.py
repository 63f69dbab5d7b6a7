"""What the dashboard shows, as QA found it in the twenty-seventh session, in a real headless
Chromium against a real `torchscope serve`, with runs recorded by real training scripts (and,
where the test needs exact numbers, sessions sent by the real capture transport):

- a colour scale's ends ran into its bar ("‖grad‖ 0.09901▇▇0.6167", "2.12036.57"): apart now,
  with three significant digits;
- the graph's legend floated over the canvas and hid the nodes at its bottom left: it is a
  bar under the canvas;
- an expanded frame's title was cut at its start as one string and lost the module's own name
  ("…(TransformerEncoder) · forward"): the phase goes first, the name and type stay;
- an unknown session's page showed a second 404 box and empty charts on each tab: one
  sentence with a link to the sessions, the tabs disabled;
- the Doctor of a killed run (no end event) said only "No pitfall found": it says the
  recording is incomplete, as `torchscope doctor` does;
- polish: the search box's placeholder was cut, an import's refusal began "400:", an axis read
  "0 µs / 50.0 ms", the charts marked a "step 0" nobody picked, the diff offered the step shown,
  edges had no arrowheads, and with the server gone an open graph said nothing of it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import forkrun
import pytest
from browser_page import checked_page, killed_and_swept, open_session, session_id, shot
from conftest import EXAMPLES, ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

TRAIN = Path(__file__).resolve().parent / "dashboard_train.py"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("readability-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Session ids: the test network (5 steps, graphs of steps 0, 2, 4) and the example
    transformer (its `blocks` is an nn.TransformerEncoder), trained side by side."""
    d = tmp_path_factory.mktemp("readability-runs")
    cmds = {"net": [str(TRAIN), "--steps", "5", "--name", "net"], "transformer": [str(EXAMPLES / "transformer.py"), "--steps", "2"]}
    procs = {n: forkrun.spawn([*c, "--server", srv.url, "--record", str(d / f"{n}.tscope")]) for n, c in cmds.items()}
    for n, p in procs.items():
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0, f"{n}: {out[-3000:]}"
    return {n: session_id(srv, n, "finished") for n in cmds}


@pytest.fixture
def page() -> Iterator[Any]:
    with checked_page() as pg:
        yield pg


def open_graph(page: Any, srv: ServerProc, sid: str, query: str = "") -> dict[str, Any]:
    open_session(page, srv.url, sid, f"?view=graph{query}")
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")
    return page.evaluate("window.__torchscope.state().graph")  # type: ignore[no-any-return]


# A colour scale's bar and its neighbours as laid out: the text before it (ending in the low
# end), after it (starting with the high end), and the gaps (px) on either side of the bar.
RAMP_PARTS = """(sel) => {
  const bar = document.querySelector(sel + " .ramp"), lo = bar.previousElementSibling, hi = bar.nextElementSibling;
  const [a, b, c] = [lo, bar, hi].map((e) => e.getBoundingClientRect());
  return { before: lo.parentElement.textContent.split(hi.textContent)[0].trim(), lo: lo.textContent.trim().split(/\\s+/).at(-1),
           hi: hi.textContent.trim().split(/\\s+/)[0], gaps: [b.left - a.right, c.left - b.right] };
}"""


def significant_digits(number: str) -> int:
    """3 in "2.12", "36.6", "0.0990" (the zero kept: a fourth), 2 in "0.099", 4 in "0.6167"."""
    mantissa = number.split("e")[0].lstrip("-").replace(".", "")
    return len(mantissa.lstrip("0")) or 1


def check_ramp(r: dict[str, Any]) -> None:
    assert r["before"].startswith("‖grad‖"), r
    assert min(r["gaps"]) >= 4, r  # the numbers touched the bar: "0.09901▇▇0.6167"
    assert significant_digits(r["lo"]) <= 3 and significant_digits(r["hi"]) <= 3, r  # not "2.120", "0.6167"


def test_colour_scale_ends_stand_apart_from_the_bar_with_three_digits(page: Any, srv: ServerProc, runs: dict[str, str]) -> None:
    open_session(page, srv.url, runs["net"], "?view=gradients")
    page.wait_for_function("window.__torchscope.state().gradients?.steps >= 5")
    heat = page.evaluate(RAMP_PARTS, "[data-view=gradients]")
    shot(page, "readability-heat-legend")
    check_ramp(heat)
    open_graph(page, srv, runs["net"], "&overlay=grad")
    page.wait_for_selector("[data-testid=legend] .ramp")
    graph = page.evaluate(RAMP_PARTS, "[data-testid=legend]")
    shot(page, "readability-graph-legend")
    check_ramp(graph)


@pytest.mark.parametrize("width", [1024, 1280])
def test_the_graph_legend_covers_no_part_of_the_canvas(srv: ServerProc, runs: dict[str, str], width: int) -> None:
    with checked_page(width=width, height=700) as page:
        open_graph(page, srv, runs["net"])
        page.evaluate("window.__torchscope.expandAll()")
        page.wait_for_timeout(300)
        r = page.evaluate("""() => {
          const v = window.__torchscope.app.views.graph.obj;
          const c = v.canvasEl.getBoundingClientRect(), l = v.legend.getBoundingClientRect();
          return { canvasBottom: c.bottom, legendTop: l.top, legendHeight: l.height, legendLeft: l.left, canvasLeft: c.left };
        }""")
        shot(page, f"readability-graph-legend-{width}")
        # under the canvas (it hid the bottom-left nodes of every graph taller than the canvas)
        assert r["legendHeight"] > 0 and r["legendTop"] >= r["canvasBottom"] - 0.5, r


def test_an_expanded_frame_keeps_its_own_name_and_type(page: Any, srv: ServerProc, runs: dict[str, str]) -> None:
    open_graph(page, srv, runs["transformer"])
    page.evaluate("window.__torchscope.expand('blocks', 'forward')")
    page.wait_for_function("window.__torchscope.state().graph.frames.some((t) => t.startsWith('blocks '))")
    page.wait_for_timeout(300)  # drawn: the titles are fitted as they are drawn
    r = page.evaluate("""() => window.__torchscope.app.views.graph.obj.scene.frames
      .filter((f) => f.key.endsWith(":blocks")).map((f) => ({ title: f.title, fit: f.fitTitle, width: f.box[2] }))""")
    shot(page, "readability-frame-title")
    assert len(r) == 2, r  # its forward and its backward frame
    for f in r:
        # "blocks (TransformerEncoder) · forward" is wider than the frame; cut as one string it
        # read "…(TransformerEncoder) · forward"
        assert f["fit"] and "blocks (TransformerEncoder)" in f["fit"], r


def test_heat_map_rows_of_long_module_names_stay_told_apart(page: Any, srv: ServerProc, runs: dict[str, str]) -> None:
    """Modules whose long names differ only in the middle (blocks 0, 1, 2 of a long-named stack
    with a long leaf name): their heat-map labels, cut to the label column, keep the part that
    differs (they all read "encoder_s…_purposes"; found by QA), and short names stay whole."""
    open_session(page, srv.url, runs["transformer"], "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps > 0; })()")
    names = [f"encoder_stack_with_a_long_name.{i}.a_really_long_suffix_for_testing_purposes" for i in range(3)]
    labels = page.evaluate("""async (names) => {
      const [{ distinctLabels }, { fit }] = await Promise.all([import('/static/gradients.js'), import('/static/graph/render.js')]);
      const col = document.querySelector('.heat-label'), ctx = document.createElement('canvas').getContext('2d');
      ctx.font = getComputedStyle(col).font;
      const room = Math.min(col.parentElement.clientWidth - 12, 168); // (the column's least width: names cut)
      return [room, distinctLabels([...names, 'head'], (t, head) => fit(ctx, t, room, head)),
              names.map((n) => fit(ctx, n, room))];
    }""", names)
    room, shown, plain = labels
    assert room > 40 and len(set(plain)) == 1  # cut as they were: one label for three rows
    assert len(set(shown[:3])) == 3 and all(f".{i}." in shown[i] or shown[i].startswith(f"….{i}") for i in range(3)), shown
    assert shown[3] == "head", shown


def test_heat_map_names_take_the_room_its_cells_leave(page: Any, srv: ServerProc, runs: dict[str, str]) -> None:
    """QA 42b: the transformer's 20 steps of cells took 480 of ~1060 px and its names were cut
    ("….0.self_attn (MultiheadAtt…"): the names' column is as wide as its longest name where the
    cells leave the room, so each reads whole, its type too."""
    open_session(page, srv.url, runs["transformer"], "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps > 0; })()")
    page.wait_for_selector("[data-testid=heat-labels] .heat-label[title]")
    rows = page.evaluate("""() => [...document.querySelectorAll('[data-testid=heat-labels] .heat-label[title]')]
      .map((e) => [e.title, e.textContent, e.scrollWidth <= e.clientWidth])""")
    assert len(rows) > 8 and any(len(name) > 30 for name, _, _ in rows), rows
    assert all(text == name and whole for name, text, whole in rows), [r for r in rows if r[0] != r[1] or not r[2]]
    wrap = page.evaluate("""() => { const w = document.querySelector('.heat-wrap'), s = document.querySelector('.heat-scroll');
      return { wrap: w.getBoundingClientRect().right, scroll: s.getBoundingClientRect().right, canvas: s.querySelector('canvas').getBoundingClientRect().right }; }""")
    assert wrap["canvas"] <= wrap["scroll"] + 1, wrap  # the cells still whole beside them, no scrolling


def test_an_unknown_session_says_so_once_with_the_way_back(page: Any, srv: ServerProc) -> None:
    open_session(page, srv.url, "deadbeef00000000", "?view=ranks")
    page.wait_for_selector("#fatal")
    assert "No session deadbeef00000000 on this server" in page.locator("#fatal").inner_text()
    assert page.locator("#fatal a").get_attribute("href") == "/"
    tabs = page.locator("nav#tabs button")
    assert tabs.count() == 5 and all(tabs.nth(i).is_disabled() for i in range(5))
    assert page.locator("nav#tabs").is_hidden()  # (QA 45c: greyed tabs above the sentence said nothing)
    for view in ("memory", "ranks", "diagnostics"):  # clicked anyway, by script: nothing opens
        page.evaluate(f"document.querySelector('nav#tabs button[data-view={view}]').click()")
    page.wait_for_timeout(500)
    shot(page, "readability-unknown-session")
    # one sentence: no "404: no session …" box of a view, no empty chart saying "No data yet"
    assert page.locator(".notice.error").count() == 1 and page.locator("canvas").count() == 0
    page.locator("#fatal a").click()
    page.wait_for_url(srv.url + "/")


def test_the_doctor_of_a_killed_run_says_its_recording_is_incomplete(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    p = forkrun.spawn([str(TRAIN), "--server", srv.url, "--record", str(tmp_path / "killed.tscope"),
                       "--name", "killed-doctor", "--steps", "3", "--hold", "120"])
    try:
        sid = session_id(srv, "killed-doctor", "running")
        deadline = time.monotonic() + 60
        while srv.get(f"/api/sessions/{sid}")["steps"] < 3 and time.monotonic() < deadline:  # type: ignore[index]
            time.sleep(0.2)
        open_session(page, srv.url, sid, "?view=doctor")
        page.wait_for_selector("[data-testid=findings] p")
        assert not page.locator("[data-testid=doctor-note]").is_visible()  # running: nothing is missing yet
        killed_and_swept(page, p, srv.data, sid)
    finally:
        if p.poll() is None:
            p.kill()
    note = page.locator("[data-testid=doctor-note]")
    note.wait_for()
    assert "incomplete" in note.inner_text() and "no end event" in note.inner_text() and "the 3 steps it holds" in note.inner_text()
    # and so it says on a page opened afterwards
    open_session(page, srv.url, sid, "?view=doctor")
    page.wait_for_selector("[data-testid=doctor-note]")
    shot(page, "readability-doctor-incomplete")
    assert "No pitfall found" in page.locator("[data-testid=findings]").inner_text()


def test_the_search_placeholder_fits_its_box(page: Any, srv: ServerProc, runs: dict[str, str]) -> None:
    open_graph(page, srv, runs["net"])
    r = page.evaluate("""() => {
      const s = document.querySelector("[data-testid=search]"), cs = getComputedStyle(s);
      const ctx = document.createElement("canvas").getContext("2d");
      ctx.font = cs.font;
      return { text: ctx.measureText(s.placeholder).width, room: s.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight) };
    }""")
    assert r["text"] <= r["room"], r  # "Search name, module, sha" was cut


def test_a_refused_import_says_why_in_words(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a session file\n")
    page.goto(srv.url + "/")
    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    page.set_input_files("[data-testid=file-input]", str(notes))
    page.wait_for_selector("#note.error")
    said = page.locator("#note").inner_text()
    assert said.startswith("Could not import notes.txt: ") and not re.search(r"\b4\d\d:", said), said


def test_an_axis_labels_every_tick_in_one_unit(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """Step times from 1 ms to 100 ms: "0 µs" beside "50.0 ms" was the axis."""
    from torchscope.transport import Transport

    sid = f"units-{int(time.time() * 1000)}"
    t = Transport(str(tmp_path / "units.tscope"), sid, rank=0, server=srv.url)
    t.emit({"kind": "session", "schema": [1, 0], "session_id": sid, "name": "units", "started_at": time.time(),
            "rank": 0, "world_size": 1, "model": "Net", "modules": [], "params": []})
    for step, (us, peak) in enumerate([(1_000, 3_000), (50_000, 900_000), (100_000, 2_500_000), (20_000, 40_000)]):
        t.emit({"kind": "step", "step": step, "rank": 0, "t": time.time(), "duration_us": us, "memory": {"live": peak // 2, "peak": peak}})
    t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": 4})
    session_id(srv, "units", "finished")
    open_session(page, srv.url, sid, "?view=ranks")
    page.wait_for_function("window.__torchscope.app.views.ranks?.obj.time.axis?.labels.length > 2")
    shot(page, "readability-ranks-units")
    for chart in ("time", "mem"):
        labels = page.evaluate(f"window.__torchscope.app.views.ranks.obj.{chart}.axis.labels")
        units = {label.split(" ")[-1] for label in labels}
        assert len(units) == 1, labels
    assert page.evaluate("window.__torchscope.app.views.ranks.obj.time.axis.labels")[:2] == ["0 ms", "50 ms"]


def test_charts_mark_only_a_step_the_user_picked(page: Any, srv: ServerProc, runs: dict[str, str]) -> None:
    open_graph(page, srv, runs["net"])  # shows step 0, which nobody picked
    assert "step=" not in page.url
    page.locator("nav#tabs button[data-view=gradients]").click()
    page.wait_for_function("window.__torchscope.state().gradients?.steps >= 5")
    assert page.evaluate("window.__torchscope.state().gradients.focus") is None
    page.locator("nav#tabs button[data-view=memory]").click()
    page.wait_for_function("window.__torchscope.state().memory?.timeline > 0")
    assert page.evaluate("window.__torchscope.app.views.memory.obj.focus") is None
    # a step chosen on the graph's scrubber is one the user picked: marked
    page.locator("nav#tabs button[data-view=graph]").click()
    page.evaluate("window.__torchscope.showStep(2)")
    page.locator("nav#tabs button[data-view=gradients]").click()
    page.wait_for_function("window.__torchscope.state().gradients.focus === 2")


def test_the_diff_offers_no_step_against_itself(page: Any, srv: ServerProc, runs: dict[str, str]) -> None:
    open_graph(page, srv, runs["net"])
    options = "Array.from(document.querySelector('[aria-label=\"diff against step\"]').options).map((o) => o.textContent)"
    assert page.evaluate(options) == ["diff vs step 2", "diff vs step 4"]
    page.select_option("[data-testid=overlay]", "diff")
    page.wait_for_function("document.querySelector('[data-testid=legend]').innerText.includes('vs step 2')")
    page.evaluate("window.__torchscope.showStep(2)")
    assert page.evaluate(options) == ["diff vs step 0", "diff vs step 4"]
    # the step compared with became the one shown: the step before it now
    page.wait_for_function("document.querySelector('[data-testid=legend]').innerText.includes('vs step 0')")


# Points around each edge's end, a few pixels back along it and to its side: on an arrowhead's
# strokes, and off the edge's own line (drawn 1 px wide).
ARROWHEADS = """() => {
  const sc = window.__torchscope.app.views.graph.obj.scene;
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.lineWidth = 1;
  const paths = sc.edgePaths.flatMap((ep) => [ep.path, ep.heads].filter(Boolean));
  const ends = sc.base.segs.map((e) => e.seg).filter((s) => s[3] !== s[1]).slice(0, 20);
  const headed = ends.filter(([, ay, bx, by]) => {
    const back = by > ay ? -1 : 1;
    for (let d = 1.5; d <= 4; d += 0.5) for (const side of [-1, 1]) {
      if (paths.some((p) => ctx.isPointInStroke(p, bx + side * d * 0.7, by + back * d))) return true;
    }
    return false;
  });
  return { ends: ends.length, headed: headed.length };
}"""


def test_edges_end_in_arrowheads(page: Any, srv: ServerProc, runs: dict[str, str]) -> None:
    open_graph(page, srv, runs["net"])
    page.evaluate("window.__torchscope.expandAll()")
    page.wait_for_timeout(300)
    page.evaluate("(() => { const c = window.__torchscope.app.views.graph.obj.canvas; c.show({ scale: 1.5, tx: 20, ty: 20 }); })()")
    shot(page, "readability-arrowheads")
    r = page.evaluate(ARROWHEADS)
    assert r["ends"] >= 10 and r["headed"] == r["ends"], r


def test_with_the_server_gone_the_open_graph_says_so(page: Any, tmp_path: Path) -> None:
    from torchscope.transport import Transport

    s = ServerProc(tmp_path / "down").start()
    try:
        sid = f"down-{int(time.time() * 1000)}"
        t = Transport(str(tmp_path / "down.tscope"), sid, rank=0, server=s.url)
        t.emit({"kind": "session", "schema": [1, 0], "session_id": sid, "name": "down", "started_at": time.time(),
                "rank": 0, "world_size": 1, "model": "Net", "modules": [], "params": []})
        t.emit({"kind": "step", "step": 0, "rank": 0, "t": time.time(), "duration_us": 1000, "memory": {"live": 1000, "peak": 2000}})
        t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": 1})
        open_session(page, s.url, sid)
        page.wait_for_selector("#conn.ok")
        assert page.locator("#offline").count() == 0
        s.stop()
        page.wait_for_selector("#offline")
        shot(page, "readability-server-down")
        assert "server is unreachable" in page.locator("#offline").inner_text()
        # a view opened meanwhile adds no error of its own, and loads once the server is back
        page.locator("nav#tabs button[data-view=memory]").click()
        page.wait_for_timeout(500)
        assert page.locator(".notice.error").count() == 1
        s.start()
        page.wait_for_selector("#conn.ok", timeout=30_000)
        page.wait_for_function("window.__torchscope.state().memory?.steps === 1", timeout=10_000)
        assert page.locator("#offline").count() == 0
    finally:
        s.stop()
