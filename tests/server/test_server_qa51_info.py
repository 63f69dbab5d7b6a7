"""`torchscope info` of a run whose writer shed graphs under back-pressure (a disk or server
slower than the capture) said "graphs captured: 205" and nothing of the 195 shed (QA 51a); the
end event's ``shed_ops`` is said beside the count."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from server_helpers import run_frames, write_file

from torchscope.sessionfile import encode_frame


@pytest.mark.parametrize("shed", [0, 12_345])
def test_info_says_graphs_shed_under_back_pressure(tmp_path: Path, shed: int) -> None:
    frames = run_frames("shed-run", steps=20, graph_steps=(0, 10), end=False)
    end = {"kind": "end", "t": time.time(), "status": "finished", "steps": 20, "shed_ops": shed}
    path = write_file(tmp_path / "shed.tscope", [*frames, encode_frame(len(frames), [end])])
    res = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "info", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("graphs captured:")]
    if shed:
        assert line.split(":", 1)[1].strip() == "2 (more were captured, 12,345 ops of them shed: the writer could not keep up)"
    else:
        assert line.split(":", 1)[1].strip() == "2"
