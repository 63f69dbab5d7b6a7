"""The sessions list before the doctor has looked at a run: "checking…", not "no errors or
warnings" (a run with an error read as clean for the second between its import and its
diagnosis; QA 34b).  A real `torchscope serve` whose doctor child never finishes (a
sitecustomize that holds it) keeps a real run undiagnosed; restarted with a working doctor, the
same list says what the doctor found."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from browser_page import DASHBOARD_TRAIN, checked_page, recorded, shot
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

# Python imports sitecustomize in every process it starts: the doctor's child alone waits
HOLD_DOCTOR = """import sys, time
if "torchscope.server.diagnostics" in sys.orig_argv:
    time.sleep(3600)
"""


def _cell(page: Any, sid: str) -> str:
    page.goto(page.url)
    row = page.locator(f"tr[data-id='{sid}']")
    row.wait_for()
    return str(row.locator("[data-testid=doctor-cell]").inner_text())


def test_a_run_not_yet_diagnosed_says_checking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(HOLD_DOCTOR)
    monkeypatch.setenv("PYTHONPATH", str(hold))
    data = tmp_path / "data"
    with ServerProc(data) as srv, checked_page() as page:
        sid = recorded(srv, tmp_path / "run.tscope", DASHBOARD_TRAIN, "--steps", "2", "--name", "unchecked")
        listed = {s["id"]: s for s in srv.get("/api/sessions")}  # type: ignore[union-attr]
        assert listed[sid]["status"] == "finished" and listed[sid]["diagnosed"] is False
        page.goto(srv.url + "/")
        assert _cell(page, sid) == "checking…"
        shot(page, "sessions-checking")
    monkeypatch.delenv("PYTHONPATH")
    with ServerProc(data) as srv, checked_page() as page:  # the restart's sweep diagnoses it
        deadline = time.monotonic() + 60
        while not (row := {s["id"]: s for s in srv.get("/api/sessions")}[sid])["diagnosed"]:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "never diagnosed after the restart"
            time.sleep(0.2)
        page.goto(srv.url + "/")
        cell = _cell(page, sid)
        if row["errors"] or row["warnings"]:
            assert "error" in cell or "warning" in cell, cell
        else:
            assert cell == "no errors or warnings"
