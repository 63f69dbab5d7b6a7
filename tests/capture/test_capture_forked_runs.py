"""The tests' fork runner (tests/forkrun.py) runs a script as a fresh interpreter would: what the
other tests learn from forked training runs is what `python script.py` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import forkrun
from conftest import EXAMPLES

from torchscope.sessionfile import iter_events

PROBE = """
import os, random, signal, sys
import numpy
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("FORKRUN_PROBE"), "name", __name__)
print("path0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
print("random", random.random(), numpy.random.random())
print("stdin", repr(sys.stdin.read()))
print("to stderr", file=sys.stderr)
how = sys.argv[1]
if how == "exit":
    sys.exit(3)
if how == "raise":
    raise KeyError("boom")
if how == "signal":
    os.kill(os.getpid(), signal.SIGTERM)
"""


def _losses(path: Path) -> list[object]:
    return [e["loss"] for e in iter_events(path) if e["kind"] == "step"]


def test_a_forked_training_run_records_what_a_fresh_one_records(tmp_path: Path) -> None:
    args = ["--steps", "3", "--server", "none", "--mode", "full"]
    fresh = subprocess.run([sys.executable, str(EXAMPLES / "mlp.py"), *args, "--record", str(tmp_path / "a.tscope")],
                           capture_output=True, text=True, timeout=240)
    forked = forkrun.run([str(EXAMPLES / "mlp.py"), *args, "--record", str(tmp_path / "b.tscope")], timeout=240)
    assert fresh.returncode == forked.returncode == 0, forked.stderr
    a, b = list(iter_events(tmp_path / "a.tscope")), list(iter_events(tmp_path / "b.tscope"))
    assert [e["kind"] for e in a] == [e["kind"] for e in b]
    assert _losses(tmp_path / "a.tscope") == _losses(tmp_path / "b.tscope") and len(_losses(tmp_path / "a.tscope")) == 3
    graphs = [[(n["name"], n.get("module")) for n in e["nodes"]] for run in (a, b) for e in run if e["kind"] == "graph"]
    assert graphs[: len(graphs) // 2] == graphs[len(graphs) // 2:] and graphs
    assert fresh.stdout.replace("a.tscope", "") == forked.stdout.replace("b.tscope", "")
    assert fresh.stderr.replace("a.tscope", "") == forked.stderr.replace("b.tscope", "")


def test_a_forked_script_has_its_own_argv_cwd_env_streams_and_exit(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "FORKRUN_PROBE": "yes"}
    runs = {how: forkrun.run([str(probe), how], env=env, cwd=tmp_path, timeout=60)
            for how in ("ok", "ok2", "exit", "raise", "signal")}
    ok = runs["ok"]
    assert f"argv ['ok'] cwd {tmp_path} env yes name __main__" in ok.stdout and "path0 True" in ok.stdout
    assert "stdin ''" in ok.stdout and ok.stderr == "to stderr\n" and ok.returncode == 0
    # each child seeds `random` and numpy's generator from the OS, as a fresh interpreter does
    draws = [next(line.split()[1:] for line in r.stdout.splitlines() if line.startswith("random"))
             for r in (ok, runs["ok2"])]
    assert draws[0][0] != draws[1][0] and draws[0][1] != draws[1][1], draws
    assert runs["exit"].returncode == 3
    assert runs["raise"].returncode == 1 and runs["raise"].stderr.rstrip().endswith("KeyError: 'boom'")
    assert "Traceback (most recent call last)" in runs["raise"].stderr
    assert runs["signal"].returncode == -15


def test_a_forked_script_past_its_timeout_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "slow.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    child = forkrun.spawn([str(script)])
    try:
        forkrun.run([str(script)], timeout=10)  # the script sleeps 120 s: far past it
    except subprocess.TimeoutExpired as exc:
        assert "started" in str(exc.stdout)
    else:
        raise AssertionError("no timeout")
    assert child.poll() is None
    child.kill()
    assert child.wait(10) == -9
