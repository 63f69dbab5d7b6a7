"""The dashboard on the forty-fifth session's new-user pass (QA 45c), in a real Chromium.

- The Doctor's list was rebuilt at every live refresh, dropping the keyboard focus to the page.
- Stepping through nodes (``n``) centred each one, pushing the backward column off-screen on a
  graph that fits whole.
- The tabs, marked ``role=tablist``, did not answer the arrow keys.
- An unknown session showed five greyed tabs; a mistyped address the API's ``{"detail": ...}``.
- ``?step=999`` on an 80-step run read "Step 999 has no captured graph".
- The details panel broke names mid-word ("conv2.weig ht") and showed the gradient's raw keys.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from browser_page import checked, graph_settled, module_browser, open_session, recorded  # noqa: F401 - fixtures
from conftest import EXAMPLES, ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("qa45-server")) as s:
        yield s


@pytest.fixture(scope="module")
def cnn(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("qa45-runs") / "cnn.tscope"
    return recorded(srv, path, EXAMPLES / "cnn.py", "--steps", "3", "--server", "none")


@pytest.fixture(scope="module")
def buggy(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("qa45-runs") / "p05.tscope"
    return recorded(srv, path, EXAMPLES / "pitfalls" / "p05_missing_zero_grad.py", "--steps", "6")


@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


def test_a_refreshed_doctor_list_keeps_the_focus(page: Any, srv: ServerProc, buggy: str) -> None:
    open_session(page, srv.url, buggy, "?view=diagnostics")
    first = page.locator("button.finding").first
    first.wait_for()
    first.focus()
    key = page.evaluate("document.activeElement.dataset.key")
    assert key and key.startswith("P5|"), key
    # the same findings again (a live refresh): the list is left as it is, its button still focused
    page.evaluate("window.__torchscope.app.views.diagnostics.obj.load()")
    assert page.evaluate("document.activeElement.dataset.key") == key
    # a changed list is rebuilt with the focus on the same finding
    page.evaluate("(async () => { const v = window.__torchscope.app.views.diagnostics.obj; v.shown = ''; await v.load(); })()")
    page.wait_for_function(f"document.activeElement && document.activeElement.dataset.key === {key!r}")


COLUMNS = """(() => {
  const v = window.__torchscope.app.views.graph.obj, c = v.canvas;
  const xs = v.scene.items.map((it) => [it.box[0] * c.scale + c.tx, (it.box[0] + it.box[2]) * c.scale + c.tx]);
  return { left: Math.min(...xs.map((x) => x[0])), right: Math.max(...xs.map((x) => x[1])), width: c.w,
           view: [c.scale, c.tx, c.ty] };
})()"""


def test_stepping_through_nodes_keeps_both_columns_in_view(page: Any, srv: ServerProc, cnn: str) -> None:
    open_session(page, srv.url, cnn, "?view=graph")
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")
    graph_settled(page)
    page.locator("canvas[aria-label^='computation graph']").focus()
    page.keyboard.press("n")
    page.wait_for_function("window.__torchscope.state().graph.selected !== null")
    graph_settled(page)
    at = page.evaluate(COLUMNS)
    assert at["left"] >= 0 and at["right"] <= at["width"], at  # the forward and the backward column
    for _ in range(3):  # the next nodes are in view: the view does not move
        before = page.evaluate("window.__torchscope.state().graph.selected")
        page.keyboard.press("n")
        page.wait_for_function(f"window.__torchscope.state().graph.selected !== {before!r}")  # "n" handled
        graph_settled(page)
        assert page.evaluate(COLUMNS)["view"] == at["view"]


def test_the_tabs_answer_the_arrow_keys(page: Any, srv: ServerProc, cnn: str) -> None:
    open_session(page, srv.url, cnn, "?view=graph")
    page.locator("#tabs button[data-view=graph]").focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function("new URLSearchParams(location.search).get('view') === 'memory'")
    assert page.evaluate("document.activeElement.dataset.view") == "memory"
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")  # from the first tab round to the last
    page.wait_for_function("new URLSearchParams(location.search).get('view') === 'diagnostics'")


def test_unknown_places_say_so_plainly(page: Any, srv: ServerProc, cnn: str) -> None:
    open_session(page, srv.url, "doesnotexist", "")
    page.wait_for_selector("#fatal")
    assert page.locator("#tabs").is_hidden()
    page.goto(srv.url + "/nope")
    assert "No page /nope on this torchscope server" in page.locator("body").inner_text()
    assert page.locator("a", has_text="All sessions").get_attribute("href") == "/"
    # the API keeps its JSON
    req = urllib.request.Request(srv.url + "/api/nope", headers={"Accept": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req)
    assert err.value.code == 404 and err.value.read() == b'{"detail":"Not Found"}'
    # a step past the run's end
    open_session(page, srv.url, cnn, "?view=graph&step=999")
    status = page.locator(".graph-status")
    status.wait_for(state="visible")
    assert "This run has 3 steps (0–2), no step 999; showing step" in status.inner_text()


def test_the_details_panel_wraps_names_at_their_dots(page: Any, srv: ServerProc, cnn: str) -> None:
    graph = srv.get(f"/api/sessions/{cnn}/graph?step=0")
    op = next(o for o in graph["ops"] if o["name"] == "aten::convolution")  # type: ignore[index]
    open_session(page, srv.url, cnn, f"?view=graph&step=0&node=o{op['id']}")
    cell = page.locator("[data-testid=details] td.storage .param").first
    cell.wait_for()
    assert cell.inner_text().startswith("parameter 0.") and cell.locator("wbr").count() >= 1


def test_a_light_runs_peak_is_explained_without_a_ledger(page: Any, srv: ServerProc, tmp_path: Any) -> None:
    sid = recorded(srv, tmp_path / "light.tscope", EXAMPLES / "mlp.py", "--steps", "3", "--mode", "light", "--server", "none")
    open_session(page, srv.url, sid, "?view=memory")
    note = page.locator("[data-testid=step-peak-note]")
    page.wait_for_function("document.querySelector('[data-testid=step-peak-note]')?.innerText.includes('light')")
    assert "ledger's highest point" not in note.inner_text() and "records no op" in note.inner_text()


def test_a_finding_followed_into_the_gradients_view_is_said_there(page: Any, srv: ServerProc, buggy: str) -> None:
    """P5's link opened the gradient charts with a step line alone: the finding, and where its
    parameters are drawn (two screens down), are said on top now, as the memory view does."""
    open_session(page, srv.url, buggy, "?view=diagnostics")
    page.locator("button.finding[data-code=P5]").first.click()
    note = page.locator("[data-testid=gradients-finding]")
    note.wait_for(state="visible")
    text = note.inner_text()
    assert "P5" in text and "drawn under \"Chosen parameters\" below" in text, text
    page.locator("[data-testid=gradients-finding-chart]").click()
    page.wait_for_function("(() => { const r = document.querySelector('[data-testid=param-lines]').getBoundingClientRect();"
                           " return r.top >= 0 && r.top < window.innerHeight; })()")
    page.locator("[data-testid=gradients-finding] button[aria-label^=close]").click()
    note.wait_for(state="hidden")
