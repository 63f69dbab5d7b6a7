"""What the dashboard says about a run's state, found wrong by QA (twenty-first session) and
checked in a real headless Chromium against a real `torchscope serve`, with runs recorded by a
real training script:

- a run killed while its page is open turns from "running" to "ended unexpectedly" on that
  page, without a reload, and its empty state stops promising live updates;
- an empty graph view says why: a light-mode run captures no graph, and its dead controls
  (step scrubber, colour, "Expand all", which threw a TypeError) are not shown; so does the
  memory view's op-by-op timeline (an empty step list over "No data yet");
- a step without a captured graph (from a chart, a finding, a URL) says which step is shown
  instead of silently showing another one;
- the sessions page keeps what an import did (with a link to the new session) while a live
  run refreshes the list, and says why a rename was refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import forkrun
import pytest
from browser_page import (
    DASHBOARD_TRAIN,
    checked_page,
    finish,
    killed_and_swept,
    open_session,
    session_id,
    train,
)
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")



@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("states-server")) as s:
        yield s


REFUSED = "x" * 300  # a name over the server's limit
ANSWER = {"rename": REFUSED}  # what the rename prompt is answered


@pytest.fixture
def page(srv: ServerProc) -> Iterator[Any]:
    with checked_page() as pg:
        pg.on("dialog", lambda d: d.accept(ANSWER["rename"]))  # the rename prompt
        yield pg
    ANSWER["rename"] = REFUSED


def test_a_killed_run_turns_ended_on_its_open_page(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    p = train(srv, tmp_path, "killed", "--steps", "0", "--hold", "120")
    try:
        sid = session_id(srv, "killed", "running")
        open_session(page, srv.url, sid)
        assert page.locator("#session-status").inner_text().split(" · ")[0] == "running"  # (· last step N s ago, later)
        assert "fills in live" in page.locator("#empty-note").inner_text()
        assert "appears when the first captured step ends" in page.evaluate("window.__torchscope.state().graph.status")
        killed_and_swept(page, p, srv.data, sid)
    finally:
        if p.poll() is None:
            p.kill()
    note = page.locator("#empty-note").inner_text()
    assert "recorded no steps (ended unexpectedly)" in note and "live" not in note
    assert "No graph was captured" in page.evaluate("window.__torchscope.state().graph.status")


def test_a_light_run_says_it_has_no_graph_and_expand_all_is_harmless(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    finish(train(srv, tmp_path, "light-run", "--steps", "3", "--mode", "light"))
    open_session(page, srv.url, session_id(srv, "light-run", "finished"))
    g = page.evaluate("window.__torchscope.state().graph")
    assert g["captured"] == [] and 'mode="light"' in g["status"]
    assert page.locator("#empty-note").count() == 0  # it has steps: only the graph is empty
    # no step to scrub, nothing to colour or expand: the graph's toolbar is not shown
    assert not page.locator("[data-testid=expand-all]").is_visible() and not page.locator("[data-testid=overlay]").is_visible()
    page.evaluate("window.__torchscope.expandAll()")  # threw a TypeError
    page.evaluate("window.__torchscope.app.views.graph.obj.collapseAll()")
    page.wait_for_timeout(200)  # an error would reach the page's error list


def test_the_memory_view_of_a_light_run_says_why_it_has_no_op_timeline(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """Its "Inside a step" part was an empty step list over a chart saying "No data yet" (found by
    QA): a light run captures no graph, so that never fills in; a running default-mode run's
    first captured step still does, and its Doctor's "no pitfall" is "so far"."""
    finish(train(srv, tmp_path, "light-memory", "--steps", "3", "--mode", "light"))
    open_session(page, srv.url, session_id(srv, "light-memory", "finished"), "?view=memory")
    page.wait_for_function("window.__torchscope.state().memory?.steps === 3")
    note = page.locator("[data-testid=timeline-note]")
    assert note.is_visible() and 'mode="light"' in note.inner_text() and "op-by-op timeline" in note.inner_text()
    assert not page.locator("[data-testid=memory-step]").is_visible()
    p = train(srv, tmp_path, "default-memory", "--steps", "1", "--hold", "60")
    try:
        open_session(page, srv.url, session_id(srv, "default-memory", "running"), "?view=memory")
        page.wait_for_function("window.__torchscope.state().memory?.timeline > 0", timeout=30_000)
        assert not note.is_visible() and page.locator("[data-testid=memory-step]").is_visible()
        # nor is the Doctor's "nothing found" of a live run an all-clear (it said "in this session")
        page.click("button[data-view=diagnostics]")
        assert "so far" in page.locator("[data-testid=no-findings]").inner_text()
        # killed with that page open: the note says the recording is incomplete, and "so far"
        # goes (the two contradicted each other until a reload; found by QA)
        killed_and_swept(page, p, srv.data, session_id(srv, "default-memory", "running"))
        page.wait_for_function("document.querySelector('[data-testid=no-findings]').textContent"
                               " === 'No pitfall found in this session.'")
        note = page.locator("[data-testid=doctor-note]").inner_text()
        assert "This recording is incomplete" in note and "imported while its run was still writing it" in note, note
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_a_step_without_a_graph_says_which_step_is_shown(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    finish(train(srv, tmp_path, "sampled", "--steps", "4"))  # sample_every=2: steps 1 and 3 have no graph
    sid = session_id(srv, "sampled", "finished")
    captured = [g["step"] for g in srv.get(f"/api/sessions/{sid}/graphs")]  # type: ignore[union-attr]
    assert 1 not in captured and 0 in captured
    open_session(page, srv.url, sid, "?step=1")
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")
    g = page.evaluate("window.__torchscope.state().graph")
    assert g["step"] == 0
    assert "Step 1 has no captured graph" in g["status"] and "showing step 0" in g["status"]
    # a captured step chosen on the scrubber is no such case: the note goes
    page.evaluate(f"window.__torchscope.showStep({captured[1]})")
    assert "no captured graph" not in page.evaluate("window.__torchscope.state().graph.status")
    # a heat-map cell of step 1 opens the graph at the nearest captured step and says so (it
    # kept showing the step it was on, silently; found by QA)
    page.click("button[data-view=gradients]")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps >= 4; })()")
    geom = page.evaluate("window.__torchscope.state().gradients.geom")
    page.locator("[data-testid=heatmap]").click(position={"x": geom["L"] + 2 + geom["cellW"], "y": 6})
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph;"
                           " return g && (g.status || '').includes('Step 1 has no captured graph'); })()")
    assert page.evaluate("window.__torchscope.state().graph.step") in captured
    # the Memory view asked for step 1 (a P7 finding's step): its op-by-op timeline is a captured
    # step's, which it says, and the URL keeps the step asked for (it became step=0, silently)
    open_session(page, srv.url, sid, "?view=memory&step=1")
    note = page.locator("[data-testid=memory-step-note]")
    note.wait_for()
    assert note.inner_text().startswith("Step 1 has no captured graph: the op-by-op timeline below is step ")
    assert "step=1" in page.url


def test_sessions_page_keeps_what_an_import_and_a_rename_did(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    finish(forkrun.spawn([str(DASHBOARD_TRAIN), "--record", str(tmp_path / "file.tscope"), "--steps", "2",
                          "--name", "from-a-file"]))
    streaming = train(srv, tmp_path, "streaming", "--steps", "400", "--sleep", "0.02")
    try:
        session_id(srv, "streaming", "running")
        page.goto(srv.url + "/")
        page.wait_for_function("window.__torchscope && window.__torchscope.ready")
        page.set_input_files("[data-testid=file-input]", str(tmp_path / "file.tscope"))
        page.wait_for_selector("a.session-link:text-is('from-a-file')")
        page.wait_for_timeout(1500)  # the streaming run refreshes the list several times meanwhile
        assert "Imported file.tscope" in page.locator("#note").inner_text()
        link = page.locator("#note a.imported")
        sid = session_id(srv, "from-a-file")
        assert link.get_attribute("href") == f"/sessions/{sid}"
        # a name over the server's limit: refused with a 422, and the page says why
        page.locator(f"tr[data-id='{sid}'] button[title=rename]").click()
        page.wait_for_selector("#note.error")
        page.wait_for_timeout(1000)
        said = page.locator("#note.error").inner_text()
        assert said.startswith('Could not rename "from-a-file": name:') and "at most 200 characters" in said, said
        assert session_id(srv, "from-a-file") == sid  # not renamed
        link_gone = page.locator("#note a.imported").count() == 0
        assert link_gone  # the newer message replaced the older one
        # a name of spaces: refused too (QA 48d: accepted, the run a blank link)
        ANSWER["rename"] = "   "
        page.locator(f"tr[data-id='{sid}'] button[title=rename]").click()
        page.wait_for_function("document.querySelector('#note.error')?.innerText.includes('not a space')")
        # a rename that works: the refusal's note goes (it stayed up over it)
        ANSWER["rename"] = "renamed"
        page.locator(f"tr[data-id='{sid}'] button[title=rename]").click()
        page.wait_for_selector("a.session-link:text-is('renamed')")
        page.wait_for_function("document.querySelector('#note').hidden")
    finally:
        streaming.kill()
        streaming.wait(10)


def test_the_node_that_made_a_backward_nan_says_so(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """P4's finding on a NaN born in the backward points at its grad_fn node; opened from the
    finding, the node's details say it made the NaN/Inf."""
    finish(train(srv, tmp_path, "backward-nan", "--steps", "3", "--backward-nan"))
    sid = session_id(srv, "backward-nan", "finished")
    (p4,) = [f for f in srv.get(f"/api/sessions/{sid}/diagnostics") if f["code"] == "P4"]  # type: ignore[attr-defined]
    node = p4["targets"][0]["node"]
    assert "SqrtBackward0" in p4["message"]
    open_session(page, srv.url, sid, f"?view=graph&step={p4['targets'][0]['step']}&node=n{node}")
    details = page.locator("[data-testid=details]")
    details.locator("h3").wait_for()
    assert details.locator("h3").inner_text() == "SqrtBackward0"
    assert "made here: a finite gradient came in, NaN or ±Inf went out" in details.inner_text()
