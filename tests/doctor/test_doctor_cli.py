"""`torchscope.doctor.cli.run` on real session files: human output, --json, exit codes, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import forkrun
import pytest
from doctor_events import clean_run, grads, session, step

from torchscope.doctor.cli import run
from torchscope.sessionfile import FRAME_HEADER_SIZE, HEADER_SIZE, SessionFileWriter


def write(path: Path, events: list[dict[str, Any]]) -> Path:
    writer = SessionFileWriter(path)
    writer.append([e for e in events if e["kind"] != "graph"])
    writer.close()
    return path


def missing_zero_grad() -> list[dict[str, Any]]:
    return [session(), step(0, zero_grad=0),
            *[step(i, zero_grad=0, grads=grads(pre_nonzero=[0, 2])) for i in range(1, 5)]]


def test_human_output_and_exit_1_on_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "bad.tscope", missing_zero_grad())
    assert run(str(path)) == 1
    out = capsys.readouterr().out
    assert "ERROR P5" in out and "since step 1, every step" in out
    assert "param=enc.weight module=enc" in out and "fix: Call optimizer.zero_grad()" in out


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "bad.tscope", missing_zero_grad())
    assert run(str(path), as_json=True) == 1
    findings = json.loads(capsys.readouterr().out)
    assert [(f["code"], f["steps"], f["params"]) for f in findings] == [("P5", [1, 2, 3, 4], ["enc.weight", "head.weight"])]


def test_json_output_is_strict_json_for_a_diverging_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A NaN loss is in the P4 finding's data: written as the string "NaN" (as the server's API
    writes it), so jq and JSON.parse read the output -- no bare NaN literal."""
    import math

    path = write(tmp_path / "nan.tscope", [session(), step(0), step(1, loss=math.nan, losses=[math.nan]), step(2)])
    assert run(str(path), as_json=True) == 1
    out = capsys.readouterr().out

    def refuse(literal: str) -> None:
        raise AssertionError(f"bare {literal} in --json output")

    findings = json.loads(out, parse_constant=refuse)
    p4 = next(f for f in findings if f["code"] == "P4")
    assert p4["data"]["loss"][1] == "NaN" and p4["data"]["loss"][0] == step(0)["loss"]


def test_clean_file_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "ok.tscope", clean_run())
    assert run(str(path)) == 0
    assert "no problems found (8 steps)" in capsys.readouterr().out


def test_warnings_only_exit_0_and_overrides_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = [session(), *[step(i, grads=grads(norm=n)) for i, n in enumerate([1.0, 1.0, 1.0, 1.0, 200.0])]]
    path = write(tmp_path / "warn.tscope", events)
    assert run(str(path), as_json=True) == 0 and json.loads(capsys.readouterr().out) == []
    assert run(str(path), as_json=True, overrides={"explode_factor": "100"}) == 0
    assert [f["code"] for f in json.loads(capsys.readouterr().out)] == ["P3"]


@pytest.mark.parametrize("content", [None, b"", b"not a session file at all", b"TSCOPE\x00\x00" + b"\x01" * 40])
def test_bad_file_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None) -> None:
    path = tmp_path / "x.tscope"
    if content is not None:
        path.write_bytes(content)
    assert run(str(path)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("torchscope doctor:") and "\n" not in err


def test_bad_setting_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "ok.tscope", clean_run())
    assert run(str(path), overrides={"nope": "1"}) == 2
    assert "unknown doctor setting 'nope'" in capsys.readouterr().err


def test_module_entry_point_no_traceback(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "torchscope.doctor.cli", str(tmp_path / "missing.tscope")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr and res.stderr.count("\n") == 1


@pytest.mark.parametrize(("setting", "value", "says"), [
    ("min_steps", "-5", "'min_steps' must be at least 1, got -5"),  # crashed P3 with a traceback
    ("min_steps", "0", "at least 1"),  # reported a P7 twice
    ("explode_factor", "0", "'explode_factor' must be more than 1"),  # "over 0x its usual level"
    ("dead_zero_frac", "1.5", "more than 0 and at most 1"),
    ("vanish_factor", "nan", "got nan"),
    ("min_steps", "inf", "'min_steps' needs a whole number, got 'inf'"),  # an OverflowError's traceback
    ("min_steps", "1e400", "needs a whole number"),
    ("min_steps", "3.5", "needs a whole number, got '3.5'"),  # silently ran as 3
])
def test_a_setting_out_of_its_range_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], setting: str,
                                            value: str, says: str) -> None:
    path = write(tmp_path / "ok.tscope", clean_run())
    assert run(str(path), overrides={setting: value}) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err


def test_an_incomplete_file_is_said_to_be(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file cut short (a killed writer, a partial copy): its findings come with a note that
    they cover only the steps it holds; a whole file gets none."""
    whole = write(tmp_path / "whole.tscope", [*clean_run(), {"kind": "end", "t": 0.0, "status": "finished", "steps": 8}])
    assert run(str(whole)) == 0 and "incomplete" not in capsys.readouterr().err
    data = whole.read_bytes()
    cut = tmp_path / "cut.tscope"
    cut.write_bytes(data[: len(data) - 5])  # the last frame (with the end event) torn
    assert run(str(cut)) == 0
    out, err = capsys.readouterr()
    assert "nothing to diagnose" in out  # its one frame, every step in it, was the one torn
    assert "is incomplete" in err and "bytes after its last whole frame were dropped" in err
    assert run(str(cut), as_json=True) == 0
    assert json.loads(capsys.readouterr().out) == []  # --json stays the findings alone


def test_a_file_damaged_in_the_middle_is_diagnosed_up_to_the_damage(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """One flipped byte inside a frame before the last: the frames before it are diagnosed,
    and the note says where the damage is and what was dropped -- not that the run was killed."""
    events = [e for e in [*clean_run(), {"kind": "end", "t": 0.0, "status": "finished", "steps": 8}] if e["kind"] != "graph"]
    whole = tmp_path / "whole.tscope"
    writer = SessionFileWriter(whole)
    half = len(events) // 2
    writer.append(events[:half])  # two frames: the damage is in the first, not a torn tail
    writer.append(events[half:])
    writer.close()
    data = bytearray(whole.read_bytes())
    data[(HEADER_SIZE + FRAME_HEADER_SIZE) + 4] ^= 0xFF  # inside the first frame's payload
    damaged = tmp_path / "damaged.tscope"
    damaged.write_bytes(bytes(data))
    assert run(str(damaged)) == 0
    err = capsys.readouterr().err
    assert "damaged.tscope is damaged at byte" in err and "were dropped" in err and "killed" not in err, err
    assert "findings cover the" in err


def test_a_finding_with_many_targets_says_how_many_it_leaves_out() -> None:
    from torchscope.doctor.cli import format_finding
    from torchscope.doctor.finding import make
    from torchscope.schema import FindingTarget

    targets = [FindingTarget(step=0, param=f"layer{i}.weight") for i in range(7)]
    text = format_finding(make("P5", "error", "m", "f", [0], targets=targets), 0)
    where = next(line for line in text.splitlines() if line.strip().startswith("where:"))
    assert where.count("param=") == 6 and where.endswith("; and 1 more (--json lists them)")
    six = format_finding(make("P5", "error", "m", "f", [0], targets=targets[:6]), 0)
    assert "more" not in six


def test_a_file_its_run_is_still_writing_is_not_called_killed(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The doctor (and ``torchscope info``) on the file of a run still training -- here, this
    process's, and a copy taken mid-write with half a frame at its end: no end event yet is a
    run going on, not one killed, and the half frame is no loss."""
    import torch

    import torchscope
    from torchscope.server.fileinfo import summarize

    path = tmp_path / "live.tscope"
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
        torchscope.load(path)  # brings the file up to date (the writer's flush)
        copy = tmp_path / "copy.tscope"
        copy.write_bytes(path.read_bytes() + b"FRM1" + bytes(20))  # a frame its writer has begun
        for f in (path, copy):
            assert run(str(f)) == 0
            err = capsys.readouterr().err
            assert "is still being written (its run is going on)" in err and "3 steps it holds so far" in err, err
            assert "killed" not in err and "dropped" not in err
            info = summarize(f)
            assert info["status"] == "running" and "killed" not in info.get("note", ""), info
    assert run(str(path)) == 0
    err = capsys.readouterr().err  # ended: nothing to say but what a light run could not check
    assert err.count("\n") == 1 and err.startswith("torchscope doctor: note: a light run records no graph"), err


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_light_runs_report_says_what_it_could_not_check(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           mode: str) -> None:
    """Light's "no problems found" reads as the other modes' (QA 46a: a silent ``.data`` write,
    a softmax before NLLLoss and an attached advantage were all "no problems" there): a note
    names the checks that need a captured graph."""
    import torch

    import torchscope

    path = tmp_path / f"{mode}.tscope"
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
    capsys.readouterr()  # (watch()'s own lines)
    assert run(str(path)) == 0
    out, err = capsys.readouterr()
    assert "no problems found (3 steps)" in out
    if mode == "light":
        assert "a light run records no graph" in err and "(P8)" in err and "(P16)" in err and "mode='default'" in err
    else:
        assert err == ""


def test_a_file_without_steps_is_not_said_to_have_no_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run of which no step was recorded (ended before its first, or a loop torchscope could
    not see end one) has nothing to diagnose: said so, not "no problems found (0 steps)"."""
    path = write(tmp_path / "empty.tscope", [session(), {"kind": "end", "t": 0.0, "status": "finished", "steps": 0}])
    assert run(str(path)) == 0
    out = capsys.readouterr().out
    assert "no step recorded, nothing to diagnose" in out and "no problems found" not in out


CRASHING = """
import sys
import torch
import torch.nn.functional as F
import torchscope
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Sigmoid())
opt = torch.optim.Adam(model.parameters())
torchscope.watch(model, opt, server=None, record=sys.argv[1])
for i in range(5):
    opt.zero_grad()
    out = model(torch.randn(16, 4))
    if i == 2:
        out = out - 1.5  # a bug: out of [0, 1], which binary_cross_entropy refuses
    F.binary_cross_entropy(out, torch.rand(16, 8)).backward()
    opt.step()
"""


def test_a_run_that_crashed_in_its_loss_is_said_so_and_its_forward_is_no_unused_graph(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The script raised in its loss at step 2, before that step's backward: its forward is the
    crash, not "a graph built but never used" with advice to wrap evaluations in no_grad (P6,
    found by QA), and the doctor says how the run stopped."""
    script, path = tmp_path / "crash.py", tmp_path / "crash.tscope"
    script.write_text(CRASHING)
    res = forkrun.run([str(script), str(path)], timeout=120)
    assert res.returncode != 0 and "between 0 and 1" in res.stderr
    assert run(str(path)) == 0
    out, err = capsys.readouterr()
    assert "no problems found (2 steps)" in out and "P6" not in out, out
    assert "note: the run stopped with an error after 2 steps: RuntimeError: all elements of input should be between 0 and 1" in err
