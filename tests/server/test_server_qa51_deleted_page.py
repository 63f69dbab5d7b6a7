"""The page of a live session deleted in another tab says so and stops (QA 51c, F1).

It showed "This session was deleted." and, above it, a header still counting "running · 216
steps" (the run streamed on, and each step refetched the header).  The page now stops at the
deletion: its header reads "deleted", and a live step or the quiet-run timer changes nothing.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

from conftest import ServerProc
from test_server_qa51_deleted import listed, start_run, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "browser"))  # the browser tests' Chromium recipe
from browser_page import checked_page, open_session  # noqa: E402


def test_a_deleted_live_sessions_page_stops_updating(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv, checked_page() as page:
        proc, _, stop = start_run(tmp_path, srv, "page-del")
        try:
            sid = wait_for(lambda: (s := listed(srv, "page-del")) and s["steps"] >= 5 and s["id"])
            open_session(page, srv.url, sid)
            page.wait_for_function("/\\d+ steps/.test(document.getElementById('session-sub').textContent)")
            urllib.request.urlopen(urllib.request.Request(f"{srv.url}/api/sessions/{sid}", method="DELETE"), timeout=30)
            page.wait_for_function("document.getElementById('fatal')?.textContent.includes('This session was deleted.')",
                                   timeout=30_000)
            status = page.locator("#session-status")
            assert status.text_content() == "deleted"
            sub = page.locator("#session-sub").text_content()
            # a step event already on its way, and a run silent for a minute: nothing changes
            # (before, the first refetched the header -- a 404 now -- and the second read
            # "running · last step 60 s ago")
            page.evaluate(f"""() => {{ const app = window.__torchscope.app;
                app.onLive({{ session: {sid!r}, rank: 0, kind: "step", step: 10000 }});
                app.lastStepAt = Date.now() - 60000; app.showQuiet(); }}""")
            page.wait_for_timeout(1500)
            assert status.text_content() == "deleted"
            assert page.locator("#session-sub").text_content() == sub
            assert page.locator("#fatal").count() == 1
        finally:
            stop.touch()
            proc.communicate(timeout=120)
