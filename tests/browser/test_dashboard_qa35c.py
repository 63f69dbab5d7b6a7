"""What the thirty-fifth session's QA (35a) found in the dashboard, the third part (findings 16
to 18), checked in a real headless Chromium against a real `torchscope serve`, with real runs
of the dashboard's training script recorded in `light` and `default` mode:

- F16: the sessions list could not tell runs apart by capture mode: a "mode" column now, from
  the `mode` `GET /api/sessions` carries (sortable, and the filter finds it);
- F16: a single-process run's only step-time chart sat in a tab named "Ranks", where a
  single-GPU user does not look: the tab is "Step time & ranks", its heading and charts say
  "step time" (no "per rank" for one rank) and what a step's time spans;
- F17: an AccumulateGrad's details gave no shape or dtype for its parameter, and its two
  key/value tables (the node's and its `.grad`'s) had different key columns, so the values
  did not line up;
- F18: the "Chosen parameters" list box showed the top of a seventh row in its bottom edge.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import DASHBOARD_TRAIN, checked_context, chromium, open_session, recorded, shot
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("qa35c-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qa35c-runs")


@pytest.fixture(scope="module")
def default(srv: ServerProc, runs_dir: Path) -> str:
    """Three steps in default mode: step 0 captured (AccumulateGrad nodes with their .grad)."""
    return recorded(srv, runs_dir / "default.tscope", DASHBOARD_TRAIN, "--steps", "3", "--name", "same-script")


@pytest.fixture(scope="module")
def light(srv: ServerProc, runs_dir: Path) -> str:
    """The same script and name in light mode: in the list, only the mode tells the two apart."""
    return recorded(srv, runs_dir / "light.tscope", DASHBOARD_TRAIN, "--steps", "3", "--mode", "light",
                    "--name", "same-script")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    with checked_context(browser) as pg:
        yield pg


# ----------------------------------------------------------------------------- F16a
def row_text(page: Any, sid: str) -> dict[str, str]:
    """A session's row in the list, its cells by their header's text."""
    return page.evaluate("""(sid) => {
      const heads = Array.from(document.querySelectorAll('table.list thead th'), (th) => th.textContent.trim());
      const cells = Array.from(document.querySelector(`tr[data-id="${sid}"]`).cells, (td) => td.textContent.trim());
      return Object.fromEntries(heads.map((k, i) => [k || `#${i}`, cells[i]]));
    }""", sid)


def test_the_sessions_list_has_a_mode_column(page: Any, srv: ServerProc, default: str, light: str) -> None:
    listed = {s["id"]: s for s in srv.get("/api/sessions")}  # type: ignore[union-attr]
    assert listed[default]["mode"] == "default" and listed[light]["mode"] == "light"  # the server says it
    page.goto(srv.url + "/")
    page.locator(f"tr[data-id='{light}']").wait_for()
    heads = page.evaluate("Array.from(document.querySelectorAll('table.list thead th'), (th) => th.textContent.trim())")
    # after the doctor's column: the columns before keep their places
    assert heads[:8] == ["name", "status", "started", "steps", "ranks", "doctor", "mode", "tags"], heads
    rows = {sid: row_text(page, sid) for sid in (default, light)}
    # same name, model, status, steps, ranks: the mode alone tells them apart
    assert rows[default]["mode"] == "default" and rows[light]["mode"] == "light", rows
    assert rows[default]["name"] == rows[light]["name"] and rows[default]["steps"] == rows[light]["steps"], rows
    # its tooltip says what the mode records
    title = page.locator(f"tr[data-id='{light}'] [data-testid=mode-cell]").get_attribute("title")
    assert title and "no graph" in title, title
    # every row has as many cells as the header (the column is no stray cell)
    assert page.evaluate("Array.from(document.querySelectorAll('tbody tr'), (tr) => tr.cells.length)") == [len(heads)] * 2
    # the filter finds a run by its mode, as by its status
    page.locator("[data-testid=filter]").fill("light")
    page.wait_for_function("document.querySelectorAll('tbody tr[data-id]').length === 1")
    assert page.locator(f"tr[data-id='{light}']").count() == 1
    page.locator("[data-testid=filter]").fill("")
    page.wait_for_function("document.querySelectorAll('tbody tr[data-id]').length === 2")
    # and the column sorts: light before default before full, then reversed
    page.locator("th[data-sort=mode]").click()
    page.wait_for_function("location.search.includes('sort=mode')")
    order = page.evaluate("Array.from(document.querySelectorAll('tbody tr[data-id]'), (tr) => tr.dataset.id)")
    assert order == [light, default], order
    page.locator("th[data-sort=mode]").click()
    page.wait_for_function("location.search.includes('dir=desc')")
    order = page.evaluate("Array.from(document.querySelectorAll('tbody tr[data-id]'), (tr) => tr.dataset.id)")
    assert order == [default, light], order
    shot(page, "qa35c-sessions-mode")


# ----------------------------------------------------------------------------- F16b
def test_the_step_time_of_a_single_process_run_is_named_as_such(page: Any, srv: ServerProc, default: str) -> None:
    open_session(page, srv.url, default, "?view=gradients")
    tab = page.locator("button[data-view=ranks]")
    assert tab.inner_text() == "Step time & ranks"  # a single-GPU user looks for "step time"
    tab.click()
    page.wait_for_selector(".view-ranks .chart-legend span:text-is('rank 0')")
    view = page.locator(".view-ranks")
    assert view.locator("h2").first.inner_text() == "Step time and memory"
    titles = view.locator(".chart-title").all_inner_texts()
    assert titles == ["step time, and where it went", "peak live bytes"], titles  # one rank: no "per rank"
    info = view.locator("[data-testid=ranks-info]").inner_text()
    assert "single rank" in info and "optimizer.step()" in info, info
    steps = srv.get(f"/api/sessions/{default}/steps")
    durations = [s["duration_us"] for s in steps]  # type: ignore[union-attr]
    assert len(durations) == 3 and all(d > 0 for d in durations), durations
    # the chart holds those durations, a point a step
    assert page.evaluate("window.__torchscope.app.views.ranks.obj.time.series[0].y") == durations
    # the URL keeps its name: an old link to ?view=ranks still opens it
    assert "view=ranks" in page.url
    shot(page, "qa35c-step-time")


# ----------------------------------------------------------------------------- F17
KV_TABLES = """() => Array.from(document.querySelectorAll('[data-testid=details] table.kv'), (t) => ({
  rows: Object.fromEntries(Array.from(t.rows, (r) => [r.cells[0].textContent, r.cells[1].textContent])),
  keyWidth: t.rows[0].cells[0].getBoundingClientRect().width,
  valueLeft: Array.from(t.rows, (r) => Math.round(r.cells[1].getBoundingClientRect().left)),
  keyLines: Array.from(t.rows, (r) => {  // the lines a key's text takes
    const range = document.createRange(); range.selectNodeContents(r.cells[0]);
    return new Set(Array.from(range.getClientRects(), (q) => Math.round(q.top))).size;
  }),
}))"""


def test_an_accumulategrad_shows_its_parameters_shape_and_dtype(page: Any, srv: ServerProc, default: str) -> None:
    graph = srv.get(f"/api/sessions/{default}/graph?step=0")
    params = {p["name"]: p for p in srv.get(f"/api/sessions/{default}")["meta"]["params"]}  # type: ignore[index]
    for width in (1280, 1024):  # a 400 px panel, and the 300 px one of a narrow window
        page.set_viewport_size({"width": width, "height": 800})
        for name in ("head.weight", "blocks.0.norm.bias"):
            node = next(n for n in graph["nodes"] if n.get("param") == name)  # type: ignore[index]
            open_session(page, srv.url, default, f"?view=graph&step=0&node=n{node['id']}")
            page.wait_for_function("document.querySelectorAll('[data-testid=details] table.kv').length === 2")
            node_kv, grad_kv = page.evaluate(KV_TABLES)
            assert node_kv["rows"]["parameter"] == name
            want = "[" + ", ".join(map(str, params[name]["shape"])) + "]"
            assert (node_kv["rows"]["shape"], node_kv["rows"]["dtype"]) == (want, params[name]["dtype"]), node_kv
            assert want in ("[1, 16]", "[16]") and params[name]["dtype"] == "float32"
            assert "‖grad‖" in grad_kv["rows"] and "share of zeros" in grad_kv["rows"], grad_kv  # (QA 45c: not the keys)
            # one key column for both tables: every value starts at the same x
            assert node_kv["keyWidth"] == grad_kv["keyWidth"], (node_kv, grad_kv)
            assert len(set(node_kv["valueLeft"] + grad_kv["valueLeft"])) == 1, (node_kv, grad_kv)
            # and each key ("backward order" the longest) on one line
            assert set(node_kv["keyLines"] + grad_kv["keyLines"]) == {1}, (node_kv, grad_kv)
    shot(page, "qa35c-accumulategrad-1024")


# ----------------------------------------------------------------------------- F18
PICK_BOX = """() => {
  const s = document.querySelector('[data-testid=param-pick]');
  s.scrollTop = 0;
  const box = s.getBoundingClientRect(), inner = box.top + s.clientTop;
  const tops = Array.from(s.options, (o) => o.getBoundingClientRect().top - inner);
  return { size: s.size, options: s.options.length, clientHeight: s.clientHeight, row: s.options[0].getBoundingClientRect().height, tops };
}"""


def test_the_parameter_list_box_is_whole_rows_high(page: Any, srv: ServerProc, default: str) -> None:
    open_session(page, srv.url, default, "?view=gradients")
    page.wait_for_function("document.querySelector('[data-testid=param-pick]').options.length > 6")
    page.locator("[data-testid=param-pick]").scroll_into_view_if_needed()
    b = page.evaluate(PICK_BOX)
    assert b["options"] > b["size"] == 6, b  # more parameters than rows: the list scrolls
    # six whole rows and nothing of a seventh: the first at the top edge, the seventh below
    # the inner bottom edge (it peeked into the bottom padding)
    assert b["clientHeight"] == pytest.approx(b["size"] * b["row"], abs=1), b
    assert abs(b["tops"][0]) <= 1 and b["tops"][6] >= b["clientHeight"] - 0.5, b
    shot(page, "qa35c-param-pick")
