"""The doctor reads the lines the capture cannot see (P7's ``history.append(loss)``, an
evaluation's ``val_loss += ...``) from the script's text recorded in the session file (format
1.14, ``LogEvent.source``): on a colleague's machine, once the script moved or changed, and on a
server the file was imported into -- where, before, those findings fell back to general wording
(``doctor/source.py`` read the script from the disk only, on the run's own host, unchanged)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProc, run_script

import torchscope
from torchscope.doctor import diagnose
from torchscope.server.fileinfo import summarize
from torchscope.sessionfile import iter_events

SCRIPT = '''
import sys

import torch
import torch.nn.functional as F
from torch import nn

import torchscope

variant, mode, record = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
history = []
val = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(4)]
with torchscope.watch(model, opt, server=None, record=record, mode=mode):
    for epoch in range(3):
        model.train()
        for _ in range(8):
            x, y = torch.randn(16, 8), torch.randn(16, 1)
            opt.zero_grad()
            out = model(x)  # FORWARD
            loss = F.mse_loss(out, y)
            loss.backward()  # BACKWARD
            if variant == "history":
                history.append(loss)  # KEEPS LOSSES
            opt.step()
        if variant == "val":
            model.eval()
            val_loss = 0.0
            for x, y in val:
                val_loss += F.mse_loss(model(x), y)  # VALIDATION SUM
            print(f"epoch {epoch}: {float(val_loss) / len(val):.3f}")
'''


def _line(marker: str) -> str:
    return "train.py:" + str(next(i for i, text in enumerate(SCRIPT.splitlines(), 1) if f"# {marker}" in text))


def _run(tmp_path: Path, variant: str, mode: str, env: dict[str, str] | None = None) -> tuple[Path, Path]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    record = tmp_path / f"{variant}_{mode}.tscope"
    run_script(script, variant, mode, str(record), env=env, timeout=240, cwd=tmp_path)
    return script, record


def _p7(record: Path) -> dict[str, Any]:
    (p7,) = [dict(f) for f in diagnose(iter_events(record)) if f["code"] == "P7"]
    return p7


def _precise_holder(p7: dict[str, Any]) -> None:
    keeps = _line("KEEPS LOSSES")
    assert p7["src"] == keeps, p7
    assert f"held by 'history' (a list), filled at {keeps}:" in p7["message"], p7["message"]


def _general_holder(p7: dict[str, Any]) -> None:
    made = _line("BACKWARD")
    assert p7["src"] == made and "filled at" not in p7["message"], p7
    assert f"The line that puts them there is not recorded (no torch call), so the source shown, {made}, is" \
        in p7["message"], p7["message"]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_p7_holder_line_kept_where_the_script_is_not(tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``history.append(loss)``: the line that keeps the losses is no torch call; the doctor read
    it from the script on the run's host only.  Now from the file: the script moved away, the
    file read on another host, the script edited since (lines added above: the run's numbers)."""
    script, record = _run(tmp_path, "history", mode)
    _precise_holder(_p7(record))  # the script where it ran
    # a colleague's machine: the session's host is not this one (the script's path means nothing here)
    monkeypatch.setattr(socket, "gethostname", lambda: "colleagues-laptop")
    _precise_holder(_p7(record))
    monkeypatch.undo()
    # the script moved away after the run
    script.rename(tmp_path / "train_v1.py")
    _precise_holder(_p7(record))
    # ... or edited: lines added at its top shift every line; the recorded text is the run's
    script.write_text("# a new experiment\n" * 5 + SCRIPT)
    _precise_holder(_p7(record))


def test_an_evaluation_running_sum_is_named_where_the_script_is_not(tmp_path: Path) -> None:
    """``val_loss += F.mse_loss(model(x), y)`` keeps the evaluation's graph: its name comes from
    the recorded line's text, which the file now holds."""
    script, record = _run(tmp_path, "val", "default")
    script.unlink()
    p7 = _p7(record)
    line = _line("VALIDATION SUM")
    assert p7["src"] == line, p7
    assert "`val_loss`, summed at" in p7["message"] and "`val_loss += criterion(...).item()`" in p7["fix"], p7


def test_without_the_recorded_text_the_disk_is_read_as_before(tmp_path: Path) -> None:
    """``TORCHSCOPE_SAVE_CODE=0``: no text in the file; the script where it ran, unchanged, still
    answers; moved away, the finding says what it knows without the line (none made up)."""
    script, record = _run(tmp_path, "history", "default", env={"TORCHSCOPE_SAVE_CODE": "0"})
    assert torchscope.load(record).source is None
    _precise_holder(_p7(record))
    script.rename(tmp_path / "elsewhere.py")
    _general_holder(_p7(record))


def test_a_file_imported_into_a_server_keeps_its_script(tmp_path: Path) -> None:
    """``torchscope open FILE`` of a colleague's file (the script not on this machine): the
    server's doctor names the holder line, ``torchscope info`` says the text is there, the
    sessions list does not carry it, and the export (a download) holds it again."""
    script, record = _run(tmp_path, "history", "default")
    script.unlink()
    mailed = tmp_path / "mailed"
    mailed.mkdir()
    shutil.move(record, mailed / "run.tscope")
    record = mailed / "run.tscope"
    info = summarize(record)
    size = len(SCRIPT.encode())
    assert size >= 1024 and info["source"] == f"train.py ({size / 1024:.1f} KiB recorded)", info
    cli = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "info", str(record)], capture_output=True,
                         text=True, timeout=60)
    assert "source:" in cli.stdout and "train.py (" in cli.stdout and "recorded)" in cli.stdout, cli.stdout

    srv = ServerProc(tmp_path / "data").start()
    try:
        res = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "open", str(record), "--port",
                              str(srv.port), "--no-browser"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        sid = torchscope.load(record).session_id
        findings = srv.get(f"/api/sessions/{sid}/diagnostics")
        assert isinstance(findings, list)
        (p7,) = [f for f in findings if f["code"] == "P7"]
        _precise_holder(p7)
        with urllib.request.urlopen(f"{srv.url}/api/sessions", timeout=30) as resp:
            listed = resp.read()
        assert sid in listed.decode() and b"history.append" not in listed and len(listed) < 20_000
        with urllib.request.urlopen(f"{srv.url}/api/sessions/{sid}", timeout=30) as resp:
            detail = json.loads(resp.read())
        assert "history.append" not in json.dumps(detail)
        with urllib.request.urlopen(f"{srv.url}/api/sessions/{sid}/export", timeout=30) as resp:
            exported = resp.read()
    finally:
        srv.stop()
    assert exported == record.read_bytes()  # the stored frames, the text among them
    (tmp_path / "download.tscope").write_bytes(exported)
    src = torchscope.load(tmp_path / "download.tscope").source
    assert src is not None and src["text"] == SCRIPT
