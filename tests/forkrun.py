"""Runs the tests' training scripts in processes forked from one that has already imported torch.

A fresh interpreter spends ~4.5 s of CPU before a training script's first step: ~2 s importing
torch and ~2.4 s more in the first optimizer's constructor, which imports torch._dynamo.  The
tests run a few hundred scripts on a two-core machine, so that import was a large part of CI.
Here a *zygote* process imports torch (and torch._dynamo) once and forks a child per script; the
child is a real process running the real script as ``__main__`` (its own pid, stdin, stdout and
stderr files, working directory, environment and argv) and ends through the interpreter's own
shutdown (threads joined, atexit run, an uncaught exception through sys.excepthook), so what it
records and prints is what a fresh ``python script.py`` would.

Environment variables read at interpreter or torch start-up (``PYTHON*``, ``OMP_*``, ``TORCH*``...)
are the zygote's own: a request goes to a zygote started with the same ones (one more is started
for other values).  ``TORCHSCOPE_TEST_FORK=0`` runs every script fresh.

The zygote's protocol: a JSON request per line on its stdin (``{"id", "argv", "env", "cwd",
"out", "err"}``); on its stdout it answers ``<id> <pid>`` once it forked, and ``exit <pid>
<status>`` when that child ended (``subprocess``'s returncode: negative for a signal).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

# read once at start-up by the interpreter, libgomp or torch: a fork inherits the zygote's
STARTUP_PREFIXES = ("PYTHON", "OMP_", "KMP_", "MKL_", "GOMP_", "TORCH", "CUDA", "LD_", "MALLOC_")


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES)}


# ---------------------------------------------------------------- the zygote (python forkrun.py)

def _child(req: dict[str, Any]) -> int:
    """In the forked child: become the script's process and run it as __main__."""
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    err = out if req["err"] == req["out"] else os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    # a fresh interpreter seeds numpy's global generator from the OS: forked children would
    # otherwise share the zygote's sequence (`random` reseeds itself after a fork)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    script = os.path.abspath(req["argv"][0])
    sys.argv = list(req["argv"])
    sys.path[0] = os.path.dirname(script)
    import runpy

    # an exception leaves through the interpreter's top level, as in `python script.py`: sys.excepthook, exit 1
    runpy.run_path(script, run_name="__main__")
    return 0


def _zygote() -> int:
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (torch.optim's first optimizer imports it: ~2.4 s)
    import torch.optim  # noqa: F401

    answers = os.dup(1)  # kept off fd 1, which each child points at its own stdout file
    pending = b""
    children = 0
    while True:
        # no threads here (a fork copies only the calling one): poll for ended children instead
        if select.select([0], [], [], 0.02 if children else None)[0]:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return 0
            pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            req = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.close(answers)
                return _child(req)
            children += 1
            os.write(answers, f"{req['id']} {pid}\n".encode())
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children -= 1
            os.write(answers, f"exit {pid} {os.waitstatus_to_exitcode(status)}\n".encode())


# ---------------------------------------------------------------- the client (imported by conftest)

class Forked:
    """A forked script, with the part of ``subprocess.Popen``'s interface the tests use; its
    stdout (and stderr, or stderr merged into stdout) go to files, read by ``communicate``."""

    def __init__(self, argv: list[str], out: Path, err: Path | None, tmp: str) -> None:
        self.args = [sys.executable, *argv]
        self.pid = 0
        self.returncode: int | None = None
        self._out, self._err, self._tmp = out, err, tmp
        self._started = threading.Event()
        self._ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def output(self) -> tuple[str, str | None]:
        out = self._out.read_text(errors="replace")
        err = self._err.read_text(errors="replace") if self._err is not None else None
        return out, err

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            out, err = self.output()
            raise subprocess.TimeoutExpired(self.args, timeout or 0, out, err) from None
        res = self.output()
        shutil.rmtree(self._tmp, ignore_errors=True)
        return res


class _Zygote:
    def __init__(self, env: dict[str, str]) -> None:
        self.key = _startup_env(env)
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, start_new_session=True)
        self.lock = threading.Lock()
        self.ids = itertools.count()
        self.starting: dict[int, Forked] = {}
        self.running: dict[int, Forked] = {}
        self.alive = True
        threading.Thread(target=self._read, daemon=True, name="forkrun").start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            a, b, *rest = raw.decode().split()
            with self.lock:
                if a == "exit":
                    child = self.running.pop(int(b))
                    child.returncode = int(rest[0])
                    child._ended.set()
                else:
                    child = self.starting.pop(int(a))
                    child.pid = int(b)
                    self.running[child.pid] = child
                    child._started.set()
        with self.lock:  # the zygote ended: nothing more will be answered
            self.alive = False
            for child in [*self.starting.values(), *self.running.values()]:
                child.returncode = -signal.SIGKILL
                child._started.set()
                child._ended.set()

    def start(self, argv: list[str], env: dict[str, str], cwd: str, merge: bool) -> Forked:
        assert self.proc.stdin is not None
        tmp = tempfile.mkdtemp(prefix="forkrun-")
        _tmpdirs.append(tmp)
        out = Path(tmp, "out")
        child = Forked(argv, out, None if merge else Path(tmp, "err"), tmp)
        with self.lock:
            if not self.alive:
                raise OSError("the zygote died")
            rid = next(self.ids)
            self.starting[rid] = child
            req = {"id": rid, "argv": argv, "env": env, "cwd": cwd, "out": str(out),
                   "err": str(out if merge else Path(tmp, "err"))}
            self.proc.stdin.write(json.dumps(req).encode() + b"\n")
            self.proc.stdin.flush()
        if not child._started.wait(180) or not child.pid:
            raise OSError("the zygote did not fork")
        return child

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


_zygotes: list[_Zygote] = []
_tmpdirs: list[str] = []  # output folders of children a test killed or left running, removed at exit
_lock = threading.Lock()


def spawn(argv: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None,
          merge_stderr: bool = True) -> Forked | subprocess.Popen[str]:
    """``subprocess.Popen([sys.executable, *argv], stdout=PIPE, stderr=STDOUT (or PIPE), text=True)``
    forked from a zygote with ``env``'s start-up environment, to be ended with ``communicate``."""
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}  # as run_script always did
    cwd = str(cwd) if cwd is not None else os.getcwd()
    if os.environ.get("TORCHSCOPE_TEST_FORK") == "0" or not argv[0].endswith(".py"):
        return subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, text=True,
                                env=env, cwd=cwd)
    with _lock:
        zygote = next((z for z in _zygotes if z.key == _startup_env(env) and z.alive), None)
        if zygote is None:
            zygote = _Zygote(env)
            _zygotes.append(zygote)
    return zygote.start(argv, env, cwd, merge_stderr)


def run(argv: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None,
        timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, *argv], capture_output=True, text=True, ...)``, forked
    from a zygote (see ``spawn``); the child is killed past ``timeout``."""
    child = spawn(argv, env, cwd, merge_stderr=False)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        raise
    assert child.returncode is not None
    return subprocess.CompletedProcess(child.args, child.returncode, out, err or "")


@atexit.register
def close_all() -> None:
    with _lock:
        while _zygotes:
            _zygotes.pop().close()
        while _tmpdirs:
            shutil.rmtree(_tmpdirs.pop(), ignore_errors=True)


if __name__ == "__main__":
    sys.exit(_zygote())
