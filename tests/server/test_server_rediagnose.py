"""The doctor's queue survives a server restart: ranks left undiagnosed (or diagnosed on fewer
frames than they hold) by a server stopped before its queue drained are diagnosed by the next
start, and their counts appear in the sessions list without anyone opening them."""

from __future__ import annotations

import sqlite3
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import ServerProc
from server_helpers import run_frames, write_file

# Python imports sitecustomize in every process it starts: on this path, the doctor's child
# process (and only it) never gets to diagnose, so the server's doctor queue cannot drain.
HANG = """import sys, time
if "torchscope.server.diagnostics" in sys.orig_argv:
    time.sleep(3600)
"""


def import_file(srv: ServerProc, path: Path) -> dict[str, object]:
    import json

    boundary = uuid.uuid4().hex
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{path.name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode() + path.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(srv.url + "/api/sessions/import", data=body, method="POST",
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        result: dict[str, object] = json.loads(resp.read())
    return result


def diagnosed(db: Path) -> dict[str, tuple[int, int]]:
    """Per session: (frames the doctor saw, frames the rank holds)."""
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT r.session_id, d.frames, r.next_seq FROM ranks r "
                         "LEFT JOIN diagnostics d ON d.session_id = r.session_id AND d.rank = r.rank").fetchall()
    return {sid: (seen, held) for sid, seen, held in rows}


def test_restart_diagnoses_what_the_last_server_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    db = data / "torchscope.db"
    n = 20  # more than one batch of the doctor's child
    files = [write_file(tmp_path / f"run{i}.tscope", run_frames(f"bulk{i}", steps=6)) for i in range(n)]
    # one session diagnosed on its first frames, then given the rest (its end too) by a
    # second import: its findings are stale when the server stops
    grown = run_frames("grown", steps=30, graph_steps=(0, 10))
    part = write_file(tmp_path / "part.tscope", grown[:4])
    whole = write_file(tmp_path / "whole.tscope", grown)

    with ServerProc(data) as srv:  # a doctor that works: the prefix is diagnosed
        import_file(srv, part)
        deadline = time.monotonic() + 60
        while diagnosed(db).get("grown") != (4, 4) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert diagnosed(db)["grown"] == (4, 4)

    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "sitecustomize.py").write_text(HANG)
    monkeypatch.setenv("PYTHONPATH", str(hang))
    with ServerProc(data) as srv:  # a doctor that never finishes: the queue cannot drain
        assert import_file(srv, whole)["new_frames"] == len(grown) - 4
        for f in files:
            import_file(srv, f)
        time.sleep(1.0)  # the doctor child is running (and stuck) when the server stops
        # not diagnosed yet: 0 errors and 0 warnings are no verdict, and the list says so
        listed = {s["id"]: s for s in srv.get("/api/sessions")}  # type: ignore[union-attr]
        assert [listed[f"bulk{i}"]["diagnosed"] for i in range(n)] == [False] * n
        assert listed["grown"]["diagnosed"] is True  # its first frames were
        assert srv.get("/api/sessions/bulk0")["diagnosed"] is False  # type: ignore[index]
    monkeypatch.delenv("PYTHONPATH")
    left = diagnosed(db)
    assert left["grown"] == (4, len(grown))  # stale: the doctor saw 4 of its frames
    # none diagnosed, not even with the empty findings of a doctor the stop killed
    assert all(left[f"bulk{i}"][0] is None for i in range(n))

    with ServerProc(data) as srv:  # a plain restart: nobody asks for any diagnostics
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            counts = {s["id"]: s["errors"] + s["warnings"] for s in srv.get("/api/sessions")}  # type: ignore[union-attr]
            if all(counts.values()) and all(seen == held for seen, held in diagnosed(db).values()):
                break
            time.sleep(0.5)
        assert len(counts) == n + 1
        assert all(s["diagnosed"] for s in srv.get("/api/sessions"))  # type: ignore[union-attr]
        assert all(counts.values()), f"sessions without findings after the restart: {[k for k, v in counts.items() if not v]}"
        assert all(seen == held for seen, held in diagnosed(db).values()), diagnosed(db)
