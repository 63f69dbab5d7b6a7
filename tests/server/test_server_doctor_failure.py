"""A doctor that cannot run says so: never an empty list the dashboard shows as "No pitfall found".

A real `torchscope serve` whose Python cannot import ``torchscope.doctor`` (as a partial install
had it), and the doctor's own safety net for a check that raises."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ServerProc
from server_helpers import run_frames, write_file

from torchscope.doctor import cli as doctor_cli
from torchscope.doctor import diagnose, engine
from torchscope.doctor.rules import RULES
from torchscope.sessionfile import decode_frame

# Run by every Python the server starts (the server and its doctor child): the import of
# torchscope.doctor fails the way it does where the package was left out of an install.
NO_DOCTOR = '''
import sys


class NoDoctor:
    def find_spec(self, name, path=None, target=None):
        if name == "torchscope.doctor" or name.startswith("torchscope.doctor."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoDoctor())
'''


def test_a_server_without_its_doctor_says_the_run_was_not_diagnosed(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_DOCTOR)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    path = write_file(tmp_path / "run.tscope", run_frames("no-doctor", steps=4))
    srv = ServerProc(tmp_path / "data", env=env).start()
    try:
        res = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "open", str(path), "--port",
                              str(srv.port), "--no-browser"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        findings = srv.get("/api/sessions/no-doctor/diagnostics")
    finally:
        srv.stop()
    assert isinstance(findings, list) and len(findings) == 1, findings
    (f,) = findings
    assert (f["code"], f["severity"], f["rank"]) == ("doctor", "warning", 0)
    assert "could not diagnose this run" in f["message"] and "not installed" in f["message"], f["message"]
    assert "torchscope.doctor" in f["message"]


def diagnose_unbroken(frames: list[bytes]) -> list[dict[str, object]]:
    return [dict(f) for f in diagnose(e for frame in frames for e in decode_frame(frame)[1])]


def _broken_rule(run: object, settings: object) -> list[object]:
    return [{}][3]  # an IndexError, as a rule bug on data it did not expect would raise


def test_a_check_that_raises_is_a_finding_not_silence(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    events = run_frames("broken-rule", steps=3)
    unbroken = [f["code"] for f in diagnose_unbroken(events)]
    monkeypatch.setattr(engine, "RULES", [*RULES, ("P7", _broken_rule)])
    found = diagnose_unbroken(events)
    assert [f["code"] for f in found] == [*unbroken, "doctor"], found
    (f,) = [f for f in found if f["code"] == "doctor"]
    assert f["severity"] == "warning" and f["title"] == "The doctor could not check P7"
    assert "The P7 check failed on this run (IndexError: list index out of range in" in f["message"]
    assert "test_server_doctor_failure.py" in f["message"] and "P7 was not checked" in f["message"]

    # the CLI prints it among the findings, with no traceback; its exit status is the other findings'
    path = write_file(tmp_path / "run.tscope", events)
    logging.getLogger("torchscope.doctor").handlers.clear()
    assert doctor_cli.run(str(path)) == (1 if any(f["severity"] == "error" for f in found) else 0)
    out, err = capsys.readouterr()
    assert "no problems found" not in out and "The doctor could not check P7" in out, out
    assert "Traceback" not in out + err, err
