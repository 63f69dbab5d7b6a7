"""The run's script recorded in its session file (format 1.14, ``LogEvent.source``): real scripts
run in subprocesses, their files read back.  The doctor reads the lines the capture cannot see
from it on any host (tests/doctor/test_doctor_source_recorded.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from conftest import run_script

import torchscope
from torchscope.sessionfile import NO_STEP, index, iter_events
from torchscope.validate import validate_event

# a non-ASCII comment, a form feed and a CRLF line: the text comes back as the file holds it
SCRIPT = '''# -*- coding: utf-8 -*-
import os
import sys
import time

import torch
from torch import nn

import torchscope

variant, record = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))  # Schrödinger's net
opt = torch.optim.SGD(model.parameters(), lr=0.1)
\x0c
if variant == "deleted":
    os.remove(__file__)  # the script gone before watch(): nothing recorded, nothing said
if variant == "edited":
    later = time.time() + 60
    os.utime(__file__, (later, later))  # modified after the process started: not the text that runs
kwargs = {"save_code": False} if variant == "off" else {}
with torchscope.watch(model, opt, server=None, record=record, **kwargs):\r
    for i in range(4):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
'''


def _run(tmp_path: Path, variant: str, env: dict[str, str] | None = None) -> tuple[Path, Path, str]:
    script = tmp_path / "train.py"
    script.write_bytes(SCRIPT.encode())
    record = tmp_path / f"{variant}.tscope"
    res = run_script(script, variant, str(record), env=env, cwd=tmp_path)
    return script, record, res.stderr


def test_the_script_is_recorded_as_it_is(tmp_path: Path) -> None:
    """Default settings: the exact text, once, in a frame of its own right after the session
    event's (no step: ``step(n)`` never decodes it), with its path, size and sha256."""
    script, record, _ = _run(tmp_path, "plain")
    data = script.read_bytes()
    run = torchscope.load(record)
    src = run.source
    assert src is not None
    assert src["text"] == data.decode() == SCRIPT, "the text is the file's, byte for byte"
    assert src["path"] == str(script.resolve()) and src["bytes"] == len(data)
    assert src["sha256"] == hashlib.sha256(data).hexdigest()
    assert run.meta["settings"]["save_code"] is True and run.version >= (1, 14)
    # once, as a log event of its own frame, frame 1 (after the session's)
    events = list(iter_events(record))
    sources = [e for e in events if "source" in e]
    assert len(sources) == 1 and sources[0]["kind"] == "log" and sources[0]["level"] == "info"
    validate_event(sources[0])
    assert "train.py" in sources[0]["message"] and "save_code=False" in sources[0]["message"]
    _, frames = index(record)
    assert frames[1].n_events == 1 and frames[1].step_lo == NO_STEP and frames[1].flags == 0
    assert next(iter_events(record))["kind"] == "session"
    # the steps and the doctor read the file as before
    assert [s["step"] for s in run.steps] == [0, 1, 2, 3] and run.status == "finished"
    assert all("source" not in str(s) for s in run.steps)


def test_save_code_false_and_the_env_record_none(tmp_path: Path) -> None:
    """``watch(..., save_code=False)`` and ``TORCHSCOPE_SAVE_CODE=0`` leave the text out (and the
    session's settings say so)."""
    for variant, env in (("off", None), ("env", {"TORCHSCOPE_SAVE_CODE": "0"})):
        _, record, _ = _run(tmp_path, variant, env)
        run = torchscope.load(record)
        assert run.source is None, variant
        assert run.meta["settings"]["save_code"] is False
        assert not any("source" in e for e in iter_events(record)), variant
        assert len(run.steps) == 4


def test_a_script_gone_or_modified_before_watch_is_left_out_silently(tmp_path: Path) -> None:
    """A script removed before ``watch()`` cannot be read; one modified after the process started
    is not the text Python runs: neither is recorded, nothing is said, the run is recorded."""
    for variant in ("deleted", "edited"):
        _, record, stderr = _run(tmp_path, variant)
        run = torchscope.load(record)
        assert run.source is None, variant
        assert len(run.steps) == 4 and run.status == "finished"
        assert "save_code" not in stderr and "SAVE_CODE" not in stderr and "Traceback" not in stderr, stderr
        # the doctor reads the file as before
        assert isinstance(run.diagnostics(), list)


def _fresh(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


LOOP = '''
import sys
import torch
from torch import nn
import torchscope
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with torchscope.watch(model, opt, server=None, record=sys.argv[-1]):
    for i in range(3):
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
'''


def test_python_c_and_a_module_run(tmp_path: Path) -> None:
    """``python -c``: no file, nothing recorded, no error.  ``python -m pkg.train``: the module's
    file, which the recorded lines name; ``python -m cProfile loop.py``: the script, not cProfile.py.
    A script over 2 MiB (a data table pasted in): left out."""
    _fresh(["-c", LOOP, str(tmp_path / "c.tscope")], tmp_path)
    assert torchscope.load(tmp_path / "c.tscope").source is None
    assert len(torchscope.load(tmp_path / "c.tscope").steps) == 3

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(LOOP)
    _fresh(["-m", "pkg.train", str(tmp_path / "m.tscope")], tmp_path)
    src = torchscope.load(tmp_path / "m.tscope").source
    assert src is not None and src["path"] == str((tmp_path / "pkg" / "train.py").resolve()) and src["text"] == LOOP

    # a tool running the script as its own __main__ (cProfile.py's): the script, from sys.argv[0]
    (tmp_path / "loop.py").write_text(LOOP)
    _fresh(["-m", "cProfile", "-o", str(tmp_path / "prof.out"), "loop.py", str(tmp_path / "p.tscope")], tmp_path)
    src = torchscope.load(tmp_path / "p.tscope").source
    assert src is not None and src["path"] == str((tmp_path / "loop.py").resolve()) and src["text"] == LOOP

    big = tmp_path / "big.py"
    big.write_text(LOOP + "# " + "x" * (2 << 20) + "\n")
    _fresh([str(big), str(tmp_path / "big.tscope")], tmp_path)
    run = torchscope.load(tmp_path / "big.tscope")
    assert run.source is None and len(run.steps) == 3


IDENTICAL = '''
import sys
sys.path.insert(0, sys.argv[1])
import torch
from capture_models import train
import torchscope

for kind in ("mlp", "cnn"):
    for mode in ("light", "default"):
        record = f"{sys.argv[2]}/{kind}-{mode}.tscope"
        plain = train(kind, 4)
        watched = train(kind, 4, {"server": None, "record": record, "mode": mode, "sample_every": 2})
        assert plain["losses"] == watched["losses"], (kind, mode)
        assert all(torch.equal(a, b) for a, b in zip(plain["params"], watched["params"], strict=True))
        for ga, gb in zip(plain["grads"], watched["grads"], strict=True):
            assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(ga, gb, strict=True))
        assert torch.equal(plain["rng"], watched["rng"])
        src = torchscope.load(record).source
        assert src is not None and src["text"] == open(__file__).read(), (kind, mode)
print("identical")
'''


def test_training_stays_bit_identical_with_the_script_recorded(tmp_path: Path) -> None:
    """The bit-identical check of test_capture_never_disturbs (capture_models.train), from a real
    script whose text the watch records: losses, gradients, parameters and the RNG as a plain run's."""
    script = tmp_path / "identical.py"
    script.write_text(IDENTICAL)
    res = run_script(script, str(Path(__file__).parent), str(tmp_path), cwd=tmp_path, timeout=240)
    assert "identical" in res.stdout
