"""The sessions page after QA 51c, in headless Chromium against a real `torchscope serve`:

- the file picker given several files, a gzip'd one among them, imports the others and says
  what it imported and what it refused, and why (it stopped at the bad file and said only that);
- a running run the doctor has not looked at reads "not checked yet", not "none so far" (which
  read as checked and clean while the run had gone NaN); once looked at, "none so far"."""

from __future__ import annotations

import gzip
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked_page, shot
from conftest import ServerProc, wait_for

from torchscope.sessionfile import encode_frame, file_header

playwright_sync = pytest.importorskip("playwright.sync_api")


def _frames(sid: str, steps: int, end: bool = True) -> list[bytes]:
    """A run the doctor finds clean, framed as the capture frames it: its session event, then
    frames of 3 steps (every parameter gets a steady gradient), then its end (``end``)."""
    session = {"kind": "session", "schema": [1, 0], "session_id": sid, "name": sid, "rank": 0, "world_size": 1,
               "model": "MLP", "started_at": time.time(), "params": [{"name": "fc.weight", "module": "fc"}]}
    batches: list[list[dict[str, Any]]] = [[session]]
    for s in range(0, steps, 3):
        batches.append([{"kind": "step", "step": k, "rank": 0, "t": 1000.0 + k, "duration_us": 1000, "loss": 1.0 / (k + 1),
                         "grads": {"norm": [0.5], "nan": [0], "inf": [0], "none": []}}
                        for k in range(s, min(s + 3, steps))])
    if end:
        batches.append([{"kind": "end", "t": time.time(), "status": "finished", "steps": steps}])
    return [encode_frame(i, b) for i, b in enumerate(batches)]


def _file(path: Path, frames: list[bytes]) -> Path:
    path.write_bytes(file_header() + b"".join(frames))
    return path


# Python imports sitecustomize in every process it starts: the doctor's child alone waits, so the
# server never finishes a diagnosis (as tests/browser/test_dashboard_undiagnosed.py holds it)
HOLD_DOCTOR = """import sys, time
if "torchscope.server.diagnostics" in sys.orig_argv:
    time.sleep(3600)
"""


def _cell(page: Any, sid: str) -> str:
    row = page.locator(f"tr[data-id='{sid}']")
    row.wait_for()
    return str(row.locator("[data-testid=doctor-cell]").inner_text())


def test_picking_several_files_imports_the_good_ones_and_says_each_refused_one(tmp_path: Path) -> None:
    a = _file(tmp_path / "a.tscope", _frames("qa51-a", steps=3))
    c = _file(tmp_path / "c.tscope", _frames("qa51-c", steps=4))
    gz = tmp_path / "gz_as.tscope"  # gzip bytes under a .tscope name, as a mail client leaves them
    gz.write_bytes(gzip.compress(a.read_bytes()))
    notes = tmp_path / "notes.txt"
    notes.write_text("not a run\n")
    with ServerProc(tmp_path / "data") as srv, checked_page() as page:
        page.goto(srv.url + "/")
        page.wait_for_function("window.__torchscope && window.__torchscope.ready")
        page.set_input_files("[data-testid=file-input]", [str(a), str(gz), str(c), str(notes)])
        page.wait_for_function("document.querySelectorAll('#note a.imported').length === 2 "
                               "&& document.querySelectorAll('#note .refused').length === 2")
        note = page.locator("#note")
        said = note.inner_text()
        assert said.splitlines() == [
            "Imported 2 of 4 files: open a.tscope, open c.tscope",
            "Could not import gz_as.tscope: gz_as.tscope is gzip-compressed, not a torchscope session file itself: "
            "gunzip it first (gzip -dc gz_as.tscope > run.tscope)",
            "Could not import notes.txt: notes.txt is not a torchscope session file (.tscope)"], said
        assert "error" in str(note.get_attribute("class"))  # something was refused: said as an error
        assert {str(s["id"]) for s in srv.get("/api/sessions")} == {"qa51-a", "qa51-c"}  # type: ignore[union-attr, index]
        page.locator("tr[data-id='qa51-c']").wait_for()
        shot(page, "qa51-import-some-refused")
        # every file refused: each said, nothing imported
        page.set_input_files("[data-testid=file-input]", [str(gz), str(notes)])
        page.wait_for_function("document.querySelectorAll('#note .refused').length === 2 "
                               "&& !document.querySelector('#note a.imported')")
        assert [line.split(":")[0] for line in note.inner_text().splitlines()] == [
            "Could not import gz_as.tscope", "Could not import notes.txt"]


def _post(srv: ServerProc, sid: str, frames: list[bytes]) -> None:
    req = urllib.request.Request(f"{srv.url}/api/ingest/{sid}/0", data=b"".join(frames), method="POST",
                                 headers={"Content-Type": "application/x-tscope-frames"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def test_a_running_run_not_yet_diagnosed_says_not_checked_yet(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(HOLD_DOCTOR)
    data = tmp_path / "data"
    frames = _frames("qa51-live", steps=30, end=False)  # no end event: a run going on
    monkeypatch.setenv("PYTHONPATH", str(hold))
    with ServerProc(data) as srv, checked_page() as page:
        _post(srv, "qa51-live", frames[:4])
        row = srv.get("/api/sessions/qa51-live")
        assert row["status"] == "running" and row["diagnosed"] is False, row  # type: ignore[index]
        page.goto(srv.url + "/")
        cell = page.locator("tr[data-id='qa51-live'] [data-testid=doctor-cell] span")
        assert _cell(page, "qa51-live") == "not checked yet"
        assert "has not looked at this run" in str(cell.get_attribute("title"))
        shot(page, "qa51-not-checked-yet")
    monkeypatch.delenv("PYTHONPATH")
    with ServerProc(data) as srv, checked_page() as page:
        _post(srv, "qa51-live", frames[4:8])  # (it streams on: still running)
        # what the session's Doctor tab asks: the doctor looks at the run so far
        assert srv.get("/api/sessions/qa51-live/diagnostics") == []
        assert wait_for(lambda: srv.get("/api/sessions/qa51-live")["diagnosed"] is True)  # type: ignore[index]
        assert srv.get("/api/sessions/qa51-live")["status"] == "running"  # type: ignore[index]
        page.goto(srv.url + "/")
        assert _cell(page, "qa51-live") == "none so far"
