"""A memory-view finding followed from the Doctor shows its evidence there (QA 43).  P6 ("graph
built but never used": an evaluation without torch.no_grad()) opened ``?view=memory&step=0``
and that view showed nothing of it: the saved activations flat, the finding's 40 KiB nowhere,
its steps unmarked, and only the chart of earlier steps' graphs still alive, spiking at steps
2/4/6 where the finding says 0/2/4/6.  Now the view says the finding (its title, steps, bytes
and source line), marks its steps on the per-step chart, lists the forwards no backward()
used from the step events that hold them, and the alive chart's caption says what it counts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from browser_page import checked, fmt_bytes, module_browser, open_session, recorded  # noqa: F401 - fixtures
from conftest import EXAMPLES, ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("qa43-server")) as s:
        yield s


@pytest.fixture(scope="module")
def sid(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("qa43-runs")
    return recorded(srv, out / "p6.tscope", EXAMPLES / "pitfalls" / "p06_eval_without_no_grad.py")


@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


@pytest.fixture
def p6(srv: ServerProc, sid: str) -> dict[str, Any]:
    """The Doctor's P6 finding of the run, as the server gives it to the page."""
    found = [f for f in srv.get(f"/api/sessions/{sid}/diagnostics") if f["code"] == "P6"]
    assert len(found) == 1, found
    f = found[0]
    # the run the QA report describes: 4 evaluations, after steps 0, 2, 4 and 6, each 40 KiB
    assert f["view"] == "memory" and f["steps"] == [0, 2, 4, 6] and f["data"]["forwards"] == 4, f
    assert f["data"]["saved_bytes"] == 40960 and f["src"] == "p06_eval_without_no_grad.py:32", f
    return f


def follow(page: Any, srv: ServerProc, sid: str) -> Any:
    """The Doctor's P6 clicked: the memory view it opens, once its note is shown."""
    open_session(page, srv.url, sid, "?view=diagnostics")
    page.click("[data-testid=findings] button.finding[data-code=P6]")
    page.wait_for_function("new URLSearchParams(location.search).get('view') === 'memory'")
    note = page.locator("[data-testid=memory-finding]")
    note.wait_for(state="visible")
    return note


def test_p6_finding_shows_its_evidence_in_the_memory_view(srv: ServerProc, sid: str, page: Any,
                                                          p6: dict[str, Any]) -> None:
    note = follow(page, srv, sid)
    text = note.inner_text()
    held = fmt_bytes(p6["data"]["saved_bytes"])
    assert held == "40.0 KiB"
    # the finding named, with its steps, its bytes as the Doctor formats them, and its source line
    assert p6["title"] in text and "P6" in text, text
    assert page.locator("[data-testid=memory-finding-steps]").inner_text() == "steps 0, 2, 4, 6"
    assert held in text, text
    assert page.locator("[data-testid=memory-finding-src]").inner_text() == "at p06_eval_without_no_grad.py:32"
    # the forwards themselves, one a row, from the step events that hold them: each evaluation
    # ran after step N's optimizer.step() and is recorded with step N+1
    table = page.locator("[data-testid=memory-finding-forwards]")
    table.wait_for(state="visible")
    rows = [r.split("\t") for r in table.inner_text().strip().split("\n")[1:]]
    assert rows == [[f"after step {n}'s optimizer.step() (recorded with step {n + 1})", "p06_eval_without_no_grad.py:32",
                     "eval", held] for n in (0, 2, 4, 6)], rows
    # the finding's steps marked on the per-step chart
    marks = page.evaluate("window.__torchscope.app.views.memory.obj.perStep.markers.map((m) => m.x)")
    assert marks == [0, 2, 4, 6]
    assert page.evaluate("new URLSearchParams(location.search).get('finding')") == "P6"
    # the evaluations' 40 KiB, held at the next step's end by `val_loss`, in the "kept" line there
    kept = page.evaluate("window.__torchscope.app.views.memory.obj.perStep.series.find((s) => s.name.startsWith('saved by earlier'))?.y")
    assert kept is not None and [kept[s] for s in (2, 4, 6)] == [p6["data"]["saved_bytes"]] * 3, kept
    # the alive chart's caption says what it counts, so its spikes at 2/4/6 do not contradict 0/2/4/6
    caption = page.locator("[data-testid=graphs-alive] .chart-title").inner_text()
    assert "built before the previous step's optimizer.step()" in caption, caption
    assert re.search(r"after step N's optimizer\.step\(\).*from step N\+2", caption), caption


def test_p6_note_survives_a_reload_and_closes(srv: ServerProc, sid: str, page: Any, p6: dict[str, Any]) -> None:
    follow(page, srv, sid)
    page.reload()  # (as Back and Forward do: the page is loaded again from its URL)
    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    note = page.locator("[data-testid=memory-finding]")
    note.wait_for(state="visible")
    assert "steps 0, 2, 4, 6" in note.inner_text() and "40.0 KiB" in note.inner_text()
    note.locator("button[aria-label*=close]").click()
    assert note.is_hidden()
    assert page.evaluate("new URLSearchParams(location.search).get('finding')") is None
    assert page.evaluate("window.__torchscope.app.views.memory.obj.perStep.markers.length") == 0
    follow(page, srv, sid)
    page.click("[role=tab][data-view=graph]")  # another view: the finding stays the memory view's
    page.wait_for_function("new URLSearchParams(location.search).get('view') === 'graph'")
    assert page.evaluate("new URLSearchParams(location.search).get('finding')") is None
