"""A live full-mode run captures a graph every step: the Graph view rebuilt its "diff vs step"
menu with one option per captured step at each new graph, and a 12,000-step run's page stopped
answering for minutes (QA 51a).  The menu now lists the captured steps nearest the one shown
(and says how many others there are), and follows the live run at most twice a second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from browser_page import checked_page, finish, open_session, session_id, train
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")


def test_a_live_full_runs_diff_menu_stays_short(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv, checked_page() as page:
        run = train(srv, tmp_path, "full-live", "--steps", "400", "--sleep", "0.005", "--mode", "full")
        try:
            sid = session_id(srv, "full-live", "running")
            open_session(page, srv.url, sid, "?view=graph")
            finish(run)
            want = json.dumps([g["step"] for g in srv.get(f"/api/sessions/{sid}/graphs")], separators=(",", ":"))
            assert len(json.loads(want)) == 400  # a graph every step
            # every graph reached the scrubber, live (and on the reconnect's catch-up)
            page.wait_for_function(f"JSON.stringify(window.__torchscope.state().graph.captured) === '{want}'",
                                   timeout=60_000)
            page.locator("[data-testid=overlay]").select_option("diff")
            page.wait_for_timeout(700)  # (the menu follows within half a second)
            texts = page.locator("[aria-label='diff against step']").locator("option").all_inner_texts()
            steps = [t for t in texts if t.startswith("diff vs step ")]
            assert 20 <= len(steps) <= 40, texts
            assert texts[-1] == f"… {400 - 1 - len(steps)} later captured steps (scrub to one)", texts
            assert steps[0] == "diff vs step 1"  # the step shown is the first: its neighbours after it
        finally:
            run.kill()
