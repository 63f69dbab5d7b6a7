"""Live runs as a new user meets them, checked in a real headless Chromium against a real
`torchscope serve` with real training scripts in subprocesses (QA pass on many sessions,
concurrent live runs and server restarts):

- two runs streaming into one server at once, among finished ones: the list names each with
  its state, and each session page shows its own run's data while both are live;
- a page that hears the server again after a gap (a server restart under a live run) missed
  what was published meanwhile: it showed "running" and the step count of before the gap for
  good, for a run that had finished meanwhile. It now refetches the header, its views and the
  captured steps once it is connected again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked_page, finish, open_session, session_id, train
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")


def header(page: Any) -> tuple[str, str, str]:
    return (page.locator("#session-title").inner_text(), page.locator("#session-status").inner_text(),
            page.locator("#session-sub").inner_text())


def test_two_live_runs_each_page_shows_its_own(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv, checked_page() as page:
        for p in [train(srv, tmp_path, f"done-{i}", "--steps", "2") for i in range(3)]:
            finish(p)
        # two at once: a graph-capturing one and a light one, each held open at its end
        runs = {"live-a": train(srv, tmp_path, "live-a", "--steps", "40", "--sleep", "0.05", "--hold", "600"),
                "live-b": train(srv, tmp_path, "live-b", "--steps", "400", "--sleep", "0.01", "--mode", "light", "--hold", "600")}
        try:
            ids = {name: session_id(srv, name, "running") for name in runs}
            page.goto(srv.url + "/")
            page.wait_for_function("document.querySelectorAll('#sessions tr[data-id]').length === 5")
            listed = {r.get_attribute("data-id"): r.locator("td").nth(1).inner_text() for r in page.locator("#sessions tr[data-id]").all()}
            assert [listed[ids[n]] for n in runs] == ["running", "running"]
            assert sorted(listed.values()) == ["finished"] * 3 + ["running"] * 2
            for name, n_steps in (("live-a", 40), ("live-b", 400), ("live-a", 40)):  # there and back, while live
                page.goto(srv.url + "/")
                page.click(f"tr[data-id='{ids[name]}'] a.session-link")
                page.wait_for_function("window.__torchscope && window.__torchscope.ready")
                page.evaluate("window.__torchscope.ready")
                page.wait_for_function(f"document.getElementById('session-sub').textContent.includes('{n_steps} steps')", timeout=60_000)
                title, status, _ = header(page)
                assert title == name and status.split(" · ")[0] == "running", status
                page.click("button[data-view=memory]")
                page.wait_for_function(f"window.__torchscope.state().memory?.steps === {n_steps}", timeout=30_000)
                if name == "live-a":  # every graph the server has, those published while the page loaded too
                    want = json.dumps([g["step"] for g in srv.get(f"/api/sessions/{ids[name]}/graphs")], separators=(",", ":"))
                    page.wait_for_function(f"JSON.stringify(window.__torchscope.state().graph.captured) === '{want}'",
                                           timeout=10_000)
                else:
                    graph = page.evaluate("window.__torchscope.state().graph")
                    assert graph["captured"] == [] and "mode=\"light\"" in graph["status"]
            # live-a holds after its last step, its process alive: "running" says since when nothing
            # came (QA 37d: a killed run read "running" for 30 s with nothing said)
            page.wait_for_function("/^running · last step \\d+ s ago$/.test(document.getElementById('session-status').textContent)",
                                   timeout=30_000)
            assert "ended unexpectedly" in page.locator("#session-status").get_attribute("title")
        finally:
            for p in runs.values():
                p.kill()
                p.wait(10)


def test_a_page_catches_up_with_what_it_missed_while_not_hearing_the_server(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "data").start()
    run = train(srv, tmp_path, "restarted", "--steps", "200", "--sleep", "0.02")
    try:
        with checked_page() as page:
            sid = session_id(srv, "restarted", "running")
            open_session(page, srv.url, sid)
            page.click("button[data-view=memory]")
            page.wait_for_function("window.__torchscope.state().memory?.steps > 0")
            srv.stop()  # under the live run: training goes on, into its file
            page.wait_for_selector("#offline")
            # the page hears the server again only after the run's last events were published
            # (what a browser retrying every few seconds meets when the run ends meanwhile)
            page.route("**/api/live*", lambda route: route.abort())
            srv.start()
            said = finish(run)
            assert "training continues" in said and "reachable again; the run streams to it" in said, said
            summary: Any = None
            for _ in range(100):
                summary = srv.get(f"/api/sessions/{sid}")
                if summary["status"] == "finished":  # type: ignore[index]
                    break
                page.wait_for_timeout(200)
            assert summary["status"] == "finished" and summary["steps"] == 200, summary
            page.unroute("**/api/live*")
            page.wait_for_selector("#offline", state="detached", timeout=20_000)
            page.wait_for_function("document.getElementById('session-status').textContent === 'finished'", timeout=10_000)
            assert header(page)[2].endswith("200 steps")
            page.wait_for_function("window.__torchscope.state().memory.steps === 200", timeout=10_000)
            graphs = [g["step"] for g in srv.get(f"/api/sessions/{sid}/graphs")]  # type: ignore[union-attr]
            page.wait_for_function(f"window.__torchscope.state().graph.captured.length === {len(graphs)}", timeout=10_000)
            assert page.evaluate("window.__torchscope.state().graph.captured") == graphs
    finally:
        run.kill()
        srv.stop()
