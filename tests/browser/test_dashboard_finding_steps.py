"""A finding's link to a step that has no captured graph (QA 42b): P10's "backward() through a
freed graph, steps 1-8" targets step 1, which default mode did not capture; its link showed
step 0, from before the bug, where the captured step 2 among the finding's own steps shows the
graph chained across steps.  The first of a finding's steps that has a graph is shown; a step
none of whose finding's steps has one still opens the nearest captured step, and says so."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from browser_page import checked, module_browser, open_session, recorded  # noqa: F401 - fixtures
from conftest import EXAMPLES, ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("finding-steps-server")) as s:
        yield s


@pytest.fixture(scope="module")
def sid(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("finding-steps-runs")
    return recorded(srv, out / "p10.tscope", EXAMPLES / "pitfalls" / "p10_backward_twice.py")


@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


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
