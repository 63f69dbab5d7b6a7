"""What the dashboard says when the server is there but refuses the page, found wrong by QA and
checked in a real headless Chromium against a real `torchscope serve`:

- a server restarted with another token (or one bound beyond loopback, which makes a new one
  up at each start) answers the open pages' requests and live channel with 401: the pages said
  "The torchscope server is unreachable ... reconnects by itself", which is false on both
  counts (the browser gives up on an EventSource answered with an error); they now say the
  token was refused and which URL to open, and hear the server again once it takes their token.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from browser_page import checked_context, chromium, open_session
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")


def send_run(srv: ServerProc, token: str, tmp: Path, steps: int = 3) -> str:
    """A small finished session, sent by the real transport with the server's token."""
    from torchscope.transport import Transport

    sid = f"tok-{int(time.time() * 1000)}"
    t = Transport(str(tmp / "r.tscope"), sid, rank=0, server=srv.url, token=token)
    t.emit({"kind": "session", "schema": [1, 0], "session_id": sid, "name": "tokened", "started_at": time.time(),
            "rank": 0, "world_size": 1, "model": "Net", "modules": [], "params": []})
    for step in range(steps):
        t.emit({"kind": "step", "step": step, "rank": 0, "t": time.time(), "duration_us": 1000,
                "memory": {"live": 1000, "peak": 2000}})
    t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": steps})
    return sid


def test_a_refused_token_is_said_as_such_not_as_a_server_down(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "data", extra=["--token", "first-token"]).start()
    try:
        sid = send_run(srv, "first-token", tmp_path)
        with chromium() as b, checked_context(b) as dash:
            listing = dash.context.new_page()
            open_session(dash, srv.url, sid, "?view=memory&token=first-token")
            dash.wait_for_function("window.__torchscope.state().memory?.steps === 3")
            listing.goto(srv.url + "/?token=first-token")
            listing.wait_for_selector(f"tr[data-id='{sid}']")
            srv.extra = ["--token", "second-token"]
            srv.restart()
            for pg in (dash, listing):
                pg.wait_for_selector("#conn:text-is('○ token refused')", timeout=20_000)
                assert "ending in ?token=" in pg.get_attribute("#conn", "title")  # type: ignore[operator]
            banner = dash.locator("#offline").inner_text()
            assert "refused this page's token" in banner and "URL torchscope printed" in banner
            assert "unreachable" not in banner and "reconnects by itself" not in banner
            dash.click("button[data-view=gradients]")  # a view loaded now: the same words, once, at the top
            dash.wait_for_timeout(500)
            assert dash.locator(".view-gradients").count() == 0 and dash.locator(".notice.error").count() == 1
            note = listing.locator("#note").inner_text()
            assert "refused this page's token" in note and "unreachable" not in note and "401" not in note
            srv.extra = ["--token", "first-token"]  # the token of the pages again: heard again
            srv.restart()
            for pg in (dash, listing):
                pg.wait_for_selector("#conn.ok", timeout=20_000)
            dash.wait_for_selector("#offline", state="detached")
            dash.wait_for_selector(".view-gradients")
            listing.wait_for_selector("#note", state="hidden")
    finally:
        srv.stop()
