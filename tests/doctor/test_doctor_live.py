"""The doctor beyond the file: a real reproducer streaming to a real `torchscope serve`, the server's
diagnostics endpoint and `torchscope.load(path).diagnostics()` agree with the offline CLI."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from conftest import ServerProc, http_json, run_script
from doctor_runs import reproducer

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def summary(findings: list[Any]) -> list[tuple[str, list[int]]]:
    return sorted((f["code"], f["steps"]) for f in findings)


def test_server_and_load_report_what_the_file_says(server: ServerProc, tmp_path: Path) -> None:
    path = tmp_path / "p5.tscope"
    run_script(reproducer("P5"), "--server", server.url, "--record", str(path), "--steps", "5", timeout=240)
    offline = diagnose(iter_events(path))
    assert [f["code"] for f in offline] == ["P5"]

    assert summary(torchscope.load(str(path)).diagnostics()) == summary(offline)

    deadline = time.monotonic() + 90
    online: Any = []
    while time.monotonic() < deadline:
        sessions = server.get("/api/sessions")
        assert isinstance(sessions, list)
        if sessions and sessions[0].get("steps") == 5:
            # The first call may run the doctor (in a child process that imports torchscope): be patient.
            online = http_json(f"{server.url}/api/sessions/{sessions[0]['id']}/diagnostics", timeout=60)
            if online:
                break
        time.sleep(0.5)
    assert summary(online) == summary(offline)
    assert online[0]["params"] == offline[0]["params"] and online[0]["targets"] == offline[0]["targets"]
