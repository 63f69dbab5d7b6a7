"""Fixtures shared by every test tier: free ports, a real `torchscope serve`, real scripts."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import forkrun
import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
ARTIFACTS = REPO / "test-artifacts"  # screenshots and logs the test run leaves for people


# A script that dies on its first NaN loss in full mode (recording to argv[1]): its step 3 divides
# by zero, and the loop raises before that step's backward (P4 of a failed step).
NAN_CRASH = """
import sys, torch, torchscope
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters())
torchscope.watch(model, opt, server=None, record=sys.argv[1], mode="full")
for step in range(10):
    opt.zero_grad()
    out = model(torch.randn(16, 8))
    if step == 3:
        out = out / torch.zeros_like(out)  # 0/0 and x/0: NaN and Inf
    loss = out.mean()
    if not torch.isfinite(loss):
        raise FloatingPointError(f"non-finite loss at step {step}")
    loss.backward()
    opt.step()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_runs(out: Path, stem: str, steps: int) -> Iterator[tuple[dict[str, Any], Any]]:
    """Each rank's (facts JSON, loaded session) of a 2-rank run whose script wrote
    ``rank<r>.json`` and recorded ``<stem>.tscope`` (rank 1: ``<stem>.rank1.tscope``) into
    ``out``, after what every such run must show: the watched run's parameters equal the plain
    run's, the rank and world size, a finished session, every step."""
    from torchscope.session import load

    for rank, name in ((0, f"{stem}.tscope"), (1, f"{stem}.rank1.tscope")):
        facts = json.loads((out / f"rank{rank}.json").read_text())
        assert facts["same"], "the watched run's parameters differ from the plain run's"
        s = load(out / name)
        assert s.rank == rank and s.world_size == 2 and s.status == "finished"
        assert [e["step"] for e in s.steps] == list(range(steps))
        yield facts, s


def run_two_ranks(script: Path, *args: str) -> None:
    """Runs ``script`` on 2 ranks under torchrun (gloo on the CPU) and checks both ranks
    printed ``RANK <r> DONE`` and the job exited 0."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "--master_port", str(free_port()), str(script), *args]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "RANK 0 DONE" in res.stdout and "RANK 1 DONE" in res.stdout


def wait_for(cond: Callable[[], object], timeout: float = 30.0, every: float = 0.1) -> bool:
    """Whether ``cond()`` came true within ``timeout`` (a server not answering yet is not yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return True
        except OSError:
            pass
        time.sleep(every)
    return False


def http_json(url: str, timeout: float = 30.0) -> object:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


class ServerProc:
    """A real `torchscope serve` in a subprocess on a free port, restartable on the same data dir."""

    def __init__(self, data: Path, port: int | None = None, extra: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.data = data
        self.port = port or free_port()
        self.extra = extra or []
        self.env = env
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data / f"server-{self.port}.log"

    def start(self, timeout: float = 30.0) -> ServerProc:
        cmd = [sys.executable, "-m", "torchscope.server.cli", "serve", "--port", str(self.port),
               "--data", str(self.data), "--quiet", *self.extra]
        self.data.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early: {self.log.read_text()[-2000:]}")
            try:
                http_json(self.url + "/api/health", timeout=1.0)
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"server did not answer in {timeout}s: {self.log.read_text()[-2000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def restart(self) -> ServerProc:
        self.stop()
        return self.start()

    def __enter__(self) -> ServerProc:  # `with ServerProc(data) as srv:` started, then stopped
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def get(self, path: str) -> object:
        return http_json(self.url + path)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProc]:
    srv = ServerProc(tmp_path / "server-data").start()
    try:
        yield srv
    finally:
        srv.stop()


def run_script(script: Path | str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 180.0, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a real training script in a subprocess; raise with its output if it fails."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    res = forkrun.run([str(script), *args], full_env, str(cwd) if cwd is not None else None, timeout)
    if res.returncode != 0:
        raise AssertionError(f"{script} exited {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


def one_line_error(read: Callable[[Path], object], path: Path) -> str:
    """The message of the ``SessionFileError`` that ``read(path)`` raises, checked to be one
    short line (what the CLI and the dashboard show)."""
    from torchscope.sessionfile import SessionFileError

    with pytest.raises(SessionFileError) as info:
        read(path)
    msg = str(info.value)
    assert msg and "\n" not in msg and len(msg) < 300
    return msg


@contextlib.contextmanager
def tiny_disk(where: Path, size: str = "16m") -> Iterator[Path]:
    """A small tmpfs mounted at ``where`` (root only), unmounted on exit."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where.mkdir(parents=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte with one file; removing it frees the space."""
    filler = disk / "filler"
    block = b"\0" * (1 << 16)
    with open(filler, "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(block)
        with contextlib.suppress(OSError):  # the last partial block
            while True:
                f.write(b"\0" * 512)
    with pytest.raises(OSError) as full:
        (disk / "probe").write_bytes(b"x" * 8192)
    assert full.value.errno == errno.ENOSPC
    return filler


def alive_after_each_op(ev: dict[str, Any]) -> list[tuple[int, dict[int, int]]]:
    """The reference for OpRecord.freed (format 1.9): after each op of a graph event, by id, the
    storages made in the step and still alive (storage id -> bytes).  An op's new storages are
    its outputs' that no input shares and none alive has, as many as its ``alloc`` counted;
    its ``freed`` ones go first.  Each freed storage was alive, and each op's new storages'
    bytes are its ``alloc`` (asserted: a free or an allocation the ledger miscounted fails)."""
    tensors = {t["id"]: t for t in ev["tensors"]}
    alive: dict[int, int] = {}
    empty: set[int] = set()  # storages of no bytes (batch norm's saved statistics in eval): freed, never counted
    out = []
    for op in sorted(ev["ops"], key=lambda o: o["id"]):
        for sid in op.get("freed", []):
            assert sid in alive or sid in empty, (op["id"], op["name"], sid)
            alive.pop(sid, None)
            empty.discard(sid)
        shared = {tensors[i].get("storage") for i in op["inputs"] if i in tensors}
        made = 0
        for i in op["outputs"]:
            t = tensors.get(i, {})
            sid = t.get("storage")
            if sid is None or sid in alive or sid in shared:
                continue
            if t.get("nbytes") == 0:
                empty.add(sid)
            elif op["alloc"] > made:
                alive[sid] = t["nbytes"]
                made += t["nbytes"]
        assert made == op["alloc"], (op["id"], op["name"], made, op["alloc"])
        out.append((op["id"], dict(alive)))
    return out


def untracked_frees(ev: dict[str, Any]) -> list[tuple[int, int]]:
    """(op id, bytes) for each op of a graph event, by id: what it freed beyond the step's own
    allocations it ended (``alive_after_each_op``'s) -- bytes of the step's baseline, such as the
    ``.grad`` tensors ``zero_grad()`` dropped between the forward and the backward."""
    alive = dict(alive_after_each_op(ev))
    out: list[tuple[int, int]] = []
    before: dict[int, int] = {}
    for op in sorted(ev["ops"], key=lambda o: o["id"]):
        ended = sum(n for sid, n in before.items() if sid in op.get("freed", []))
        out.append((op["id"], op["free"] - ended))
        before = alive[op["id"]]
    return out
