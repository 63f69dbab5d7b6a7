"""QA 52a's dashboard findings, in headless Chromium against a real `torchscope serve`:

- the sessions list rebuilt every row at each refresh of a live run (~2.6 a second), so a row's
  buttons were replaced under the pointer and the focus, and Playwright's click on a live row's
  Delete timed out ("element was detached"); rows are now updated in place;
- the Compare page named the runs left out past eight by their ids, and compared a run named
  twice with itself without a word;
- an ill-formed id in a Compare address showed the API's 422 JSON (a regex), where an unknown id
  gets a sentence."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked_page, finish, session_id, train
from conftest import ServerProc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from test_server_qa32 import finished_file, upload  # noqa: E402 - the server tests' file builder and import

playwright_sync = pytest.importorskip("playwright.sync_api")

LOADED = "window.__torchscope && window.__torchscope.ready"


def test_a_live_runs_row_keeps_its_buttons_while_it_streams(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv, checked_page() as page:
        finish(train(srv, tmp_path, "done", "--steps", "2"))
        run = train(srv, tmp_path, "live-row", "--steps", "3000", "--sleep", "0.02", "--mode", "light", "--hold", "600")
        try:
            sid = session_id(srv, "live-row", "running")
            page.goto(srv.url + "/")
            page.wait_for_function(LOADED)
            row = page.locator(f"tr[data-id='{sid}']")
            row.wait_for()
            delete = row.locator("button.danger").element_handle()
            tag = row.locator("button", has_text="Tag").element_handle()
            box = row.locator("input[data-testid=compare-pick]").element_handle()
            link = row.locator("a.session-link").element_handle()
            tag.focus()
            steps = row.locator("td").nth(3)
            seen = [steps.inner_text()]
            deadline = time.monotonic() + 90
            while len(set(seen)) < 5 and time.monotonic() < deadline:  # several live refreshes of the row
                page.wait_for_timeout(200)
                seen.append(steps.inner_text())
            assert len(set(seen)) >= 5, seen
            assert [int(s) for s in dict.fromkeys(seen)] == sorted(int(s) for s in set(seen)), seen
            # the same elements, still in the page: the row was updated in place
            assert [e.evaluate("(e) => e.isConnected") for e in (delete, tag, box, link)] == [True] * 4
            assert page.evaluate("(e) => document.activeElement === e", tag)  # the focus stayed on it
            assert delete.evaluate("(e) => e.closest('tr').dataset.id") == sid
            # a plain click on it works while the run streams on (it timed out: "element was detached")
            said: list[str] = []
            page.once("dialog", lambda d: (said.append(d.message), d.dismiss()))
            delete.click(timeout=10_000)
            assert said == ['Delete session "live-row"? This cannot be undone.'], said
            box.click(timeout=10_000)
            assert box.is_checked() and page.locator("#compare").inner_text() == "Compare runs (tick 1 more)"
            # a later refresh keeps the tick (the row is the same row) and still counts the steps
            before = steps.inner_text()
            page.wait_for_function(f"document.querySelector(\"tr[data-id='{sid}']\").cells[3].textContent !== '{before}'",
                                   timeout=60_000)
            assert box.is_checked() and box.evaluate("(e) => e.isConnected")
            assert page.locator("#sessions tr[data-id]").count() == 2  # nothing duplicated, nothing lost
        finally:
            run.kill()
            run.wait(10)


def test_compare_names_the_runs_left_out_and_says_a_repeated_one(tmp_path: Path) -> None:
    names = [f"lr sweep {k}" for k in range(8)] + ["twin", "twin"]
    ids = [f"cmp-{k:02d}" for k in range(len(names))]
    with ServerProc(tmp_path / "data") as srv, checked_page() as page:
        for sid, name in zip(ids, names, strict=True):
            assert upload(srv, finished_file(tmp_path / f"{sid}.tscope", sid, steps=3, name=name))[0] == 200
        page.goto(f"{srv.url}/compare?runs={','.join(ids)},no-such")
        page.wait_for_function(LOADED)
        page.evaluate("window.__torchscope.ready")
        assert page.evaluate("window.__torchscope.state().ids") == ids[:8]
        note = page.locator("[data-testid=compare-left-out]").inner_text()
        assert note == ('This page compares at most 8 runs: the first 8 named are shown; left out: "twin" [cmp-08], '
                        '"twin" [cmp-09], "no-such" (no such session). Compare those 3'), note
        assert page.locator("[data-testid=compare-repeated]").count() == 0
        # one run named twice: compared once, and said (a run against itself, as A and B, before)
        page.goto(f"{srv.url}/compare?runs={ids[0]},{ids[1]},{ids[0]}")
        page.wait_for_function(LOADED)
        page.evaluate("window.__torchscope.ready")
        assert page.evaluate("window.__torchscope.state().ids") == ids[:2]
        assert page.evaluate("window.__torchscope.state().legend")[0].startswith("A: lr sweep 0")
        assert page.locator("[data-testid=compare-repeated]").inner_text() == (
            '"lr sweep 0" was named more than once in the address: compared once.')
        # only one run once each is left: no comparison, and the sentence says why
        page.goto(f"{srv.url}/compare?a={ids[0]}&b={ids[0]}")
        page.wait_for_function(LOADED)
        page.evaluate("window.__torchscope.ready")
        fatal = page.locator("#fatal").inner_text()
        assert fatal.startswith("Pick two sessions to compare") and "\n" not in fatal, fatal
        assert f'"{ids[0]}" is named more than once: a run is compared with another, not with itself.' in fatal, fatal


def test_an_ill_formed_id_on_compare_is_a_sentence(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv, checked_page() as page:
        assert upload(srv, finished_file(tmp_path / "ok.tscope", "ok-run", steps=3))[0] == 200
        res: Any = page.goto(f"{srv.url}/compare?runs=ok-run,bad/id%20x")
        assert res.status == 422
        said = page.locator("#fatal").inner_text()
        assert said == ('No session "bad/id x" on this server: that is not a session id (an id is 1 to 200 letters, '
                        "digits and . _ : @ + = -, never a space or a /). All sessions"), said
        assert "pattern" not in page.content()
        page.click("#fatal a")  # the way back
        page.wait_for_url(srv.url + "/")
