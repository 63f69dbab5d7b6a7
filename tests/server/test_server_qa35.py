"""QA 35a, server side (finding 16): the sessions list could not tell runs of one script apart
by capture mode.  `GET /api/sessions` (and `GET /api/sessions/{id}`) carry the session event's
`mode` now: real runs of examples/mlp.py, streamed live to a real `torchscope serve` and recorded
to a file imported into it, in `light`, `default` and `full` mode; a session whose event names no
mode (a file of a writer before the field) lists `null`, not a guess."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
from conftest import EXAMPLES, ServerProc, run_script, wait_for
from server_helpers import run_frames, session_event, write_file


def upload(server: ServerProc, path: Path) -> tuple[int, Any]:
    with open(path, "rb") as f:
        res = httpx.post(server.url + "/api/sessions/import", files={"file": (path.name, f)}, timeout=120)
    return res.status_code, res.json()


def listed(server: ServerProc) -> dict[str, dict[str, object]]:
    return {str(s["id"]): s for s in server.get("/api/sessions")}  # type: ignore[union-attr]


def test_the_sessions_list_carries_each_runs_capture_mode(server: ServerProc, tmp_path: Path) -> None:
    ids: dict[str, str] = {}
    # light: streamed live to the server, as `torchscope.watch(..., server=URL)` does
    run_script(EXAMPLES / "mlp.py", "--steps", "3", "--mode", "light", "--server", server.url,
               "--record", str(tmp_path / "light.tscope"))
    # default and full: recorded to a file only, then imported (a colleague's `torchscope open`)
    for mode in ("default", "full"):
        path = tmp_path / f"{mode}.tscope"
        run_script(EXAMPLES / "mlp.py", "--steps", "3", "--mode", mode, "--server", "none", "--record", str(path))
        status, res = upload(server, path)
        assert status == 200, res
        ids[mode] = res["id"]
    assert wait_for(lambda: len(listed(server)) == 3 and all(s["status"] == "finished" for s in listed(server).values()))
    ids["light"] = next(sid for sid in listed(server) if sid not in ids.values())
    sessions = listed(server)
    for mode, sid in ids.items():
        meta = server.get(f"/api/sessions/{sid}")["meta"]  # type: ignore[index]
        assert meta["mode"] == mode, (mode, meta.get("mode"))  # what the run said of itself
        assert sessions[sid]["mode"] == mode, (mode, sessions[sid])
        assert server.get(f"/api/sessions/{sid}")["mode"] == mode  # type: ignore[index]


def test_a_session_event_without_a_mode_lists_null(server: ServerProc, tmp_path: Path) -> None:
    sid = uuid.uuid4().hex[:16]
    path = write_file(tmp_path / "old.tscope", run_frames(sid, steps=2))  # its session event has no "mode"
    status, res = upload(server, path)
    assert status == 200, res
    assert "mode" not in session_event(sid) and listed(server)[sid]["mode"] is None
    assert server.get(f"/api/sessions/{sid}")["mode"] is None  # type: ignore[index]
