"""The doctor, run over stored events and cached by the frame count it saw.

The doctor runs in a child process (``python -m torchscope.server.diagnostics DB``) reading the
SQLite file read-only: its CPU time on a long run must not hold the server's GIL while the
dashboard is being served.  The child reads one ``[session, rank]`` JSON line at a time on its
stdin and answers each with one ``[session, rank, findings]`` line: starting Python and
importing the doctor (0.3-1 s) costs more than diagnosing a small run (~25 ms), so the
background queue keeps one child for as long as it has ranks to diagnose, and a bulk import
does not pay the start-up per session.  ``torchscope.doctor`` is imported there, guarded: a
missing or failing doctor gives one ``doctor`` finding that says so (and is logged), never a 500,
and never an empty list the dashboard would show as "no pitfall found".

``DoctorQueue`` is the server's background diagnosis: ranks that ended, were imported, went
silent, or were left undiagnosed by a server that stopped (the store's ``undiagnosed``) are
queued, and the findings of each are stored and announced as soon as they exist.  A running
rank is queued too (``diagnose_live``): at once when its steps turn NaN/Inf, else now and then.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from torchscope.sessionfile import decode_frame

from .store import DiskFull, Store

log = logging.getLogger("torchscope.server")
DOCTOR_TIMEOUT_S = 600  # per rank
STALE_WAIT_S = 10.0  # an ended rank's request waits this long for another rank's doctor
# A running rank is diagnosed in the background every LIVE_EVERY_S at most, the first time once
# it has streamed that long (a run of a few seconds gets its one diagnosis at its end, as
# before), and never sooner than LIVE_SHARE times its last doctor's time after that doctor: the
# doctor reads every frame again, tens of seconds on a long full-mode run (QA 49b), so a live
# run's doctor takes at most ~1/LIVE_SHARE of a (niced) core beside the training.  A step with
# a NaN/Inf loss or gradient gets the rank diagnosed at once, once per rank, so the sessions
# list shows the error within seconds (QA 51c: "none so far" until the run ended).
LIVE_EVERY_S = 30.0
LIVE_SHARE = 10.0
Key = tuple[str, int]  # (session id, rank)
Findings = list[dict[str, Any]]
_children: set[subprocess.Popen[bytes]] = set()
_children_lock = threading.Lock()
# One doctor at a time: on 2 cores, parallel doctors would starve the API they serve.
_doctor_lock = threading.Lock()
# requests blocked on _doctor_lock: the background queue lets them go before its next rank
_waiting: list[None] = []  # append and pop are atomic under the GIL


def undiagnosed(rank: int, why: str) -> Findings:
    """The one finding of a rank the doctor could not diagnose (``why``: one line)."""
    return [{"code": "doctor", "severity": "warning", "title": "Not diagnosed",
             "message": f"The doctor could not diagnose this run: {why}. Its pitfalls were not checked.",
             "fix": "Run `torchscope doctor FILE` on the session file to diagnose it; if the doctor fails "
                    "there too, please report it with the error.",
             "steps": [], "since": 0, "rank": rank, "targets": [], "modules": [], "params": [],
             "view": "graph", "data": {"error": why}}]


def _diagnose(events: Iterator[dict[str, Any]], rank: int) -> Findings:
    try:
        from torchscope.doctor import diagnose
    except Exception as exc:  # the doctor is optional to the server
        log.warning("torchscope: doctor unavailable (%s); this run is not diagnosed", exc)
        return undiagnosed(rank, f"the doctor is not installed in the server's Python ({exc})")
    try:
        return [dict(f) for f in diagnose(events)]
    except Exception as exc:  # a doctor bug on odd data is logged, never a 500 for the dashboard
        log.exception("torchscope: the doctor failed on this session")
        return undiagnosed(rank, f"{type(exc).__name__}: {exc}"[:200])


def stored_events(store: Store, session_id: str, rank: int) -> Iterator[dict[str, Any]]:
    for raw in store.frames(session_id, rank):
        yield from decode_frame(raw)[1]


def stop_children() -> None:
    """Server shutdown: a doctor still running must not keep the server process alive."""
    with _children_lock:
        for proc in _children:
            proc.kill()


class DoctorStopped(Exception):
    """The child was killed by a signal not ours: the server stopping (``stop_children``, or a
    Ctrl-C or SIGTERM to its process group), or the OOM killer.  No verdict: the rank keeps no
    findings, so a later sweep or the next start diagnoses it (the empty findings of a doctor
    that failed would count as a diagnosis)."""


class DoctorChild:
    """One doctor child process, asked about one rank at a time."""

    def __init__(self, db: Path) -> None:
        # stderr to a file: a chatty child never blocks on a full pipe (closed by close())
        self._err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self._proc = subprocess.Popen([sys.executable, "-m", "torchscope.server.diagnostics", str(db)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err)
        with _children_lock:
            _children.add(self._proc)

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def diagnose(self, session_id: str, rank: int) -> Findings:
        """The findings of one rank.  A child that fails or takes over DOCTOR_TIMEOUT_S gives
        the ``undiagnosed`` finding (logged) and is done with (``alive`` is false); ``DoctorStopped`` when it was
        killed from outside."""
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        why: list[str] = []  # why we killed it, if we did

        def expire() -> None:
            why.append(f"took over {DOCTOR_TIMEOUT_S}s")
            proc.kill()

        watchdog = threading.Timer(DOCTOR_TIMEOUT_S, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            proc.stdin.write(json.dumps([session_id, rank]).encode() + b"\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except (BrokenPipeError, ValueError):  # dead already (ValueError: its pipe closed)
            line = b""
        finally:
            watchdog.cancel()
        try:
            sid, r, findings = json.loads(line)
            if (sid, r) == (session_id, rank) and isinstance(findings, list):
                return findings
            why.append(f"answered {line[:100]!r}")
        except (ValueError, TypeError):
            if line:
                why.append(f"answered {line[:100]!r}")
        self.close(kill=True)
        if not why and proc.returncode < 0:
            raise DoctorStopped(f"the doctor process was stopped (signal {-proc.returncode})")
        self._err.seek(0)
        tail = self._err.read()[-500:].decode(errors="replace")
        what = why[0] if why else f"process ended with {proc.returncode}"
        log.warning("torchscope: the doctor %s on %s: %s", what, session_id, tail)
        return undiagnosed(rank, f"the doctor {what}")

    def close(self, kill: bool = False) -> None:
        """End the child: its stdin closed, it exits; ``kill`` when it may not."""
        proc = self._proc
        if kill and proc.poll() is None:
            proc.kill()
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):  # BrokenPipeError flushing the stdin of a dead child
                pipe.close()  # type: ignore[union-attr]
        try:
            proc.wait(DOCTOR_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with _children_lock:
            _children.discard(proc)
        self._err.close()


def _stale(store: Store, key: Key) -> int | None:
    """Under the doctor lock: the rank's frame count when its cached findings are missing or
    of fewer frames (the doctor is due), else None."""
    frames = store.frame_count(*key)
    cached = store.diagnostics(*key)
    return frames if cached is None or cached[0] != frames else None


def _diagnose_into(store: Store, child: DoctorChild, key: Key, frames: int) -> Findings:
    """Under the doctor lock: diagnose and store (with the frame count seen before the child
    read the frames: more may come, and are then diagnosed again)."""
    findings = child.diagnose(*key)
    store.put_diagnostics(key[0], key[1], frames, findings).result()
    return findings


def diagnostics(store: Store, session_id: str, rank: int) -> tuple[Findings, bool, bool]:
    """Findings for one rank, whether they were freshly computed (a finding event is due), and
    whether they are behind the rank's frames (the caller queues the rank: its "finding" live
    event then brings the page the update).

    A running rank's findings of the frames diagnosed so far come at once: the doctor reads
    every frame again, and on a full-mode run, beside the training on the same cores, a request
    waited 18, then 37, then 51 s (QA 49b).  A rank that has ended waits for its doctor (at most
    STALE_WAIT_S while another rank's runs): its findings are final, and the ones of a partial
    import, still cached a second after the whole file was opened, read as the run's (QA 49b)."""
    count = store.frame_count(session_id, rank)
    cached = store.diagnostics(session_id, rank)
    if cached is not None and (cached[0] == count or store.running(session_id, rank)):
        return cached[1], False, cached[0] != count
    if not _doctor_lock.acquire(blocking=False):
        # a doctor is running: the background queue lets us go first (at its next rank)
        _waiting.append(None)
        try:
            got = _doctor_lock.acquire(timeout=-1 if cached is None else STALE_WAIT_S)
        finally:
            _waiting.pop()
        if not got and cached is not None:  # (each waiting request holds a server thread)
            return cached[1], False, True
    try:
        # checked under the lock: a request that waited for a doctor run of the same
        # frames gets its result instead of starting another
        frames = _stale(store, (session_id, rank))
        if frames is None:
            cached = store.diagnostics(session_id, rank)
            return (cached[1] if cached else []), False, False
        child = DoctorChild(store.path)
        try:
            return _diagnose_into(store, child, (session_id, rank), frames), True, False
        except DoctorStopped:
            return [], False, False
        finally:
            child.close()
    finally:
        _doctor_lock.release()


class DoctorQueue:
    """Background diagnosis on one worker thread, with one doctor child for as long as keys
    are pending (deduplicated while they wait).  The doctor lock is taken per rank, so a
    request about another session waits for one rank at most.  ``done(key, findings)`` is
    called for each fresh result, stored by then."""

    def __init__(self, store: Store, done: Callable[[Key, Findings], None]) -> None:
        self._store, self._done = store, done
        self._pending: dict[Key, None] = {}  # insertion-ordered set
        # per running rank (diagnose_live): the monotonic time it may be queued again (inf
        # while queued), and the ranks whose NaN/Inf steps were queued already
        self._live: dict[Key, float] = {}
        self._nonfinite: set[Key] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="torchscope-doctor")
        self._drain: Future[None] | None = None
        self._closed = False

    def schedule(self, session_id: str, rank: int) -> None:
        with self._lock:
            if self._closed:  # the server is stopping: the next start's sweep finds the key
                return
            self._pending[(session_id, rank)] = None
            if self._drain is None:
                self._drain = self._pool.submit(self._run)

    def diagnose_live(self, session_id: str, rank: int, nonfinite: bool = False) -> None:
        """A running rank's frames were stored (``nonfinite``: a step's loss or gradient among
        them is NaN/Inf): queue it when it is due (see LIVE_EVERY_S)."""
        key = (session_id, rank)
        now = time.monotonic()
        with self._lock:
            if nonfinite and key not in self._nonfinite:
                self._nonfinite.add(key)
            elif key not in self._live:  # its first frames: due once it has streamed a while
                self._live[key] = now + LIVE_EVERY_S
                return
            elif now < self._live[key]:
                return
            self._live[key] = math.inf  # queued: not again before this doctor is over
        self.schedule(session_id, rank)

    def _live_done(self, key: Key, took: float) -> None:
        """A running rank's next turn comes LIVE_SHARE times this doctor's time from now (at
        least LIVE_EVERY_S); a rank that is over needs none (its end or silence queues it)."""
        with self._lock:
            if key not in self._live:
                return
        try:
            running = self._store.running(*key)
        except Exception:  # (the store closing with the server: nothing is due any more)
            running = False
        if running:
            with self._lock:
                self._live[key] = time.monotonic() + max(LIVE_EVERY_S, LIVE_SHARE * took)
        else:
            with self._lock:
                self._live.pop(key, None)
                self._nonfinite.discard(key)

    def _take(self) -> Key | None:
        with self._lock:
            if self._pending and not self._closed:
                key = next(iter(self._pending))
                del self._pending[key]
                return key
            self._drain = None
            return None

    def _run(self) -> None:
        child: DoctorChild | None = None
        try:
            while key := self._take():
                deadline = time.monotonic() + 5.0
                while _waiting and time.monotonic() < deadline:  # a request's rank first
                    time.sleep(0.01)
                took = 0.0
                try:
                    with _doctor_lock:
                        frames = _stale(self._store, key)
                        if frames is None:
                            continue
                        if child is None or not child.alive:
                            child = DoctorChild(self._store.path)
                        started = time.monotonic()
                        findings = _diagnose_into(self._store, child, key, frames)
                        took = time.monotonic() - started
                    self._done(key, findings)
                except DoctorStopped:
                    return  # the server is stopping (or the machine is out of memory)
                except DiskFull as exc:  # the sweep retries once there is room: one line, no traceback
                    log.error("torchscope: diagnostics of %s not stored: %s", key, exc)
                except Exception:  # the queue goes on; the sweep retries the key's next frames
                    log.exception("torchscope: diagnostics of %s failed", key)
                finally:
                    self._live_done(key, took)
        finally:
            if child is not None:
                child.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _child_main(argv: list[str]) -> int:
    """Child process: for each ``[session, rank]`` line on stdin, read that rank's frames from
    the store and print ``[session, rank, findings]`` as one JSON line; exit at end of input."""
    import os

    import pydantic_core

    os.nice(10)  # the server's requests come first
    store = Store(Path(argv[0]), read_only=True)
    for request in sys.stdin.buffer:
        session_id, rank = json.loads(request)
        findings = _diagnose(stored_events(store, session_id, rank), rank)
        line = pydantic_core.to_json([session_id, rank, findings], inf_nan_mode="strings")
        sys.stdout.buffer.write(line + b"\n")
        sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
