"""The browser's Back and Forward on a session's page (QA 42b): a tab, a finding's link or a
chart's click-through to another view is an entry of the history, so Back returns to the view
the user came from, as it was (the Doctor list, its finding's step); a view's own changes (a
step, a selection) keep to one entry, not one per click.  Every change used to replace the one
entry: Back left the dashboard for the sessions list, then for ``about:blank``.  And landing
on a step that has no captured graph: a finding's link opens the first of the finding's own
steps that has one (P10's "steps 1-8" targets step 1, which default mode did not capture: its
link showed step 0, from before the bug, not the captured step 2 that shows the graph chained
across steps); elsewhere the nearest captured step, with a note that sits above the graph, not
over it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from browser_page import checked, module_browser, open_session, recorded  # noqa: F401 - fixtures
from conftest import EXAMPLES, ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("history-server")) as s:
        yield s


@pytest.fixture(scope="module")
def sid(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("history-runs")
    return recorded(srv, out / "p10.tscope", EXAMPLES / "pitfalls" / "p10_backward_twice.py")


@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


def state(page: Any) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlparse(page.url).query).items()}


def shown(page: Any) -> str:
    return str(page.evaluate("document.querySelector('[role=tab][aria-selected=true]').dataset.view"))


def test_back_returns_to_the_view_and_finding_the_user_came_from(srv: ServerProc, sid: str, page: Any) -> None:
    open_session(page, srv.url, sid, "?view=diagnostics")
    page.wait_for_selector("[data-testid=findings] button.finding")
    start = page.evaluate("history.length")
    page.click("[role=tab][data-view=memory]")
    page.wait_for_function("document.querySelector('[role=tab][data-view=memory]').getAttribute('aria-selected') === 'true'")
    page.click("[role=tab][data-view=diagnostics]")
    page.wait_for_selector("[data-testid=findings] button.finding")
    page.click("[data-testid=findings] button.finding[data-code=P10]")  # to the finding's step in another view
    page.wait_for_function("new URLSearchParams(location.search).get('step') === '2'")
    target = state(page)
    assert page.evaluate("history.length") == start + 3, target
    # a view's own changes keep to its entry
    assert target["step"] == "2", target  # (P10's first step with a graph: see the last test)
    page.evaluate("window.__torchscope.app.setState({ step: 0 })")
    assert page.evaluate("history.length") == start + 3

    page.go_back()
    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    assert state(page)["view"] == "diagnostics" and shown(page) == "diagnostics"
    page.wait_for_selector("[data-testid=findings] button.finding[data-code=P10]")
    page.go_back()
    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    assert state(page)["view"] == "memory" and shown(page) == "memory"
    page.go_back()
    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    assert state(page)["view"] == "diagnostics" and urlparse(page.url).path == f"/sessions/{sid}"
    # and Forward goes the other way, to the finding's view as it was left
    for _ in range(3):
        page.go_forward()
        page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    assert state(page) == {**target, "step": "0"} and shown(page) == target["view"]


NOTE_AND_TOP = """() => { const v = window.__torchscope.app.views.graph.obj, c = v.canvas;
  const top = Math.min(...v.scene.items.map((it) => it.box[1]));
  return { note: v.status.textContent, noteBottom: v.status.offsetTop + v.status.offsetHeight, graphTop: c.ty + top * c.scale }; }"""


def test_a_step_without_a_graph_says_so_above_the_graph_not_over_it(srv: ServerProc, sid: str, page: Any) -> None:
    """A finding's or a chart's step that has no captured graph shows the nearest captured one,
    with a note over the canvas's top; the graph already shown (and fitted) moves down from under
    it (QA 42b: the note covered the graph's first row)."""
    open_session(page, srv.url, sid, "?view=graph")
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")
    before = page.evaluate(NOTE_AND_TOP)
    assert before["note"] == ""
    page.evaluate("window.__torchscope.app.openTargets(1, [])")  # (step 1: not captured in default mode)
    page.wait_for_function("window.__torchscope.app.views.graph.obj.status.textContent.startsWith('Step 1 has no captured graph')")
    after = page.evaluate(NOTE_AND_TOP)
    assert after["graphTop"] >= after["noteBottom"], after
    assert after["graphTop"] > before["graphTop"], (before, after)


SHOWN = """() => { const v = window.__torchscope.app.views.graph.obj; return { step: v.step, note: v.status.textContent }; }"""


def test_a_findings_link_opens_the_first_of_its_steps_with_a_graph(srv: ServerProc, sid: str, page: Any) -> None:
    captured = sorted({g["step"] for g in srv.get(f"/api/sessions/{sid}/graphs")})  # type: ignore[union-attr]
    p10 = next(f for f in srv.get(f"/api/sessions/{sid}/diagnostics") if f["code"] == "P10")  # type: ignore[union-attr]
    target = p10["targets"][0]["step"]
    first = next(s for s in p10["steps"] if s in captured)
    assert target not in captured and first > target, (captured, p10["steps"], target)  # the case QA met
    open_session(page, srv.url, sid, "?view=diagnostics")
    page.click("[data-testid=findings] button.finding[data-code=P10]")
    page.wait_for_function(f"window.__torchscope.app.views.graph?.obj.step === {first}")
    shown = page.evaluate(SHOWN)
    assert shown == {"step": first, "note": ""}, shown  # its own step, nothing to excuse
    # a step with no graph among the steps asked: the nearest captured one, said
    page.evaluate(f"window.__torchscope.app.openTargets({target}, [], [{target}])")
    page.wait_for_function(f"window.__torchscope.app.views.graph.obj.step !== {first}")
    shown = page.evaluate(SHOWN)
    assert shown["step"] == max(s for s in captured if s < target) and shown["note"].startswith(f"Step {target} has no captured graph"), shown
