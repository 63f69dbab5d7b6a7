"""SIGKILL a real training process at random moments: the session file still opens, holds
every step that completed at least one second before the kill, and says "ended unexpectedly";
a run that ends normally says "finished"."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from torchscope.series import grad_series, memory_series
from torchscope.session import load

SCRIPT = Path(__file__).with_name("train_files_kill.py")
MODES = ["transport", "watch"]


class _Reader(threading.Thread):
    """Collects (monotonic arrival time, step) of each STEP line the script prints."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        super().__init__(daemon=True)
        self.proc = proc
        self.seen: list[tuple[float, int]] = []
        self.first = threading.Event()

    def run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("STEP "):
                self.seen.append((time.monotonic(), int(line.split()[1])))
                self.first.set()


def _start(record: Path, mode: str, steps: int = 1_000_000) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, str(SCRIPT), str(record), mode, str(steps)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_after_first_step(proc: subprocess.Popen[str], reader: _Reader, delay: float) -> float:
    """SIGKILL the run ``delay`` seconds after it printed its first step; when it was killed."""
    try:
        assert reader.first.wait(60), proc.stderr.read() if proc.stderr else ""
        time.sleep(delay)
        kill_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return kill_at


@pytest.mark.parametrize("mode", MODES)
def test_files_sigkill_keeps_steps_older_than_one_second(tmp_path: Path, mode: str) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    for attempt in range(2 if mode == "watch" else 1):
        record = tmp_path / f"killed{attempt}.tscope"
        proc = _start(record, mode)
        reader = _Reader(proc)
        reader.start()
        kill_at = _kill_after_first_step(proc, reader, rng.uniform(1.2, 3.0))  # at least a second into training
        reader.join(5)
        must_have = [s for t, s in reader.seen if t <= kill_at - 1.0]
        assert must_have, "the run should have completed steps more than a second before the kill"

        session = load(record)
        recorded = {s["step"] for s in session.steps}
        missing = sorted(set(must_have) - recorded)
        assert not missing, f"attempt {attempt}: steps lost although completed >= 1 s before the kill: {missing[:10]}"
        # nothing invented: every recorded step really ran
        assert recorded <= {s for _, s in reader.seen} | {max(recorded)}
        assert session.status == "ended unexpectedly"
        assert session.end is None
        # whole-run series: from series frames where the writer got to them, else the steps
        assert session.memory() == memory_series(session.steps)
        assert session.grads() == grad_series(session.steps, session.meta["params"])
        assert session.session_id and session.meta["kind"] == "session"


def test_files_normal_end_is_finished(tmp_path: Path) -> None:
    """(The transport-only path's normal end is covered by test_files_transport.py.)"""
    record = tmp_path / "done.tscope"
    proc = _start(record, "watch", steps=40)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "DONE" in out
    session = load(record)
    assert session.status == "finished"
    assert [s["step"] for s in session.steps] == list(range(40))
    assert session.end is not None and session.end.get("shed_ops", 0) == 0
    losses = [s["loss"] for s in session.steps]
    assert all(isinstance(v, float) for v in losses) and losses[-1] < losses[0]


def test_files_a_run_killed_in_its_first_tenth_of_a_second_keeps_its_start(tmp_path: Path) -> None:
    """The writer writes the run's first events (its session, step 0) as they come instead of
    after its first flush interval (0.25 s): killed 0.1 s after step 0, the file had only its
    16-byte header and read as "truncated or corrupt"."""
    record = tmp_path / "early.tscope"
    proc = _start(record, "watch")
    reader = _Reader(proc)
    reader.start()
    _kill_after_first_step(proc, reader, 0.1)
    session = load(record)
    assert session.meta["name"] == "kill-test" and session.status == "ended unexpectedly"
    assert 0 in {s["step"] for s in session.steps}
