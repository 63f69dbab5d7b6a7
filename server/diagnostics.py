"""The doctor, run over stored events and cached by the frame count it saw.

The doctor runs in a child process (``python -m torchscope.server.diagnostics DB SESSION
RANK``) reading the SQLite file read-only: its CPU time on a long run must not hold the
server's GIL while the dashboard is being served.  ``torchscope.doctor`` is imported there,
guarded: a missing or failing doctor means "no findings" (logged), never a 500.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchscope.sessionfile import decode_frame

from .store import Store

log = logging.getLogger("torchscope.server")
DOCTOR_TIMEOUT_S = 600
_children: set[subprocess.Popen[bytes]] = set()
_children_lock = threading.Lock()
# One doctor at a time: on 2 cores, parallel doctors would starve the API they serve.
_doctor_lock = threading.Lock()


def _diagnose(events: Iterator[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        from torchscope.doctor import diagnose
    except Exception as exc:  # the doctor is optional to the server
        log.warning("torchscope: doctor unavailable (%s); diagnostics are empty", exc)
        return []
    try:
        return [dict(f) for f in diagnose(events)]
    except Exception:  # a doctor bug on odd data is logged, never a 500 for the dashboard
        log.exception("torchscope: the doctor failed on this session")
        return []


def stored_events(store: Store, session_id: str, rank: int) -> Iterator[dict[str, Any]]:
    for raw in store.frames(session_id, rank):
        yield from decode_frame(raw)[1]


def stop_children() -> None:
    """Server shutdown: a doctor still running must not keep the server process alive."""
    with _children_lock:
        for proc in _children:
            proc.kill()


def _run_child(db: Path, session_id: str, rank: int) -> list[dict[str, Any]]:
    proc = subprocess.Popen([sys.executable, "-m", "torchscope.server.diagnostics", str(db), session_id, str(rank)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    with _children_lock:
        _children.add(proc)
    try:
        out, err = proc.communicate(timeout=DOCTOR_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        log.warning("torchscope: the doctor took over %ss on %s; no findings", DOCTOR_TIMEOUT_S, session_id)
        return []
    finally:
        with _children_lock:
            _children.discard(proc)
    if proc.returncode != 0:
        log.warning("torchscope: the doctor process ended with %s: %s", proc.returncode,
                    err.decode(errors="replace")[-500:])
        return []
    try:
        findings = json.loads(out)
    except ValueError:
        return []
    return findings if isinstance(findings, list) else []


def diagnostics(store: Store, session_id: str, rank: int) -> tuple[list[dict[str, Any]], bool]:
    """Findings for one rank, and whether they were freshly computed (a finding event is due)."""
    if not _doctor_lock.acquire(blocking=False):
        # a doctor is running: answer with what we have rather than queueing requests
        # (each would hold a server thread); the "finding" live event announces the update
        stale = store.diagnostics(session_id, rank)
        if stale is not None:
            return stale[1], False
        _doctor_lock.acquire()
    try:
        # checked under the lock: a request that waited for a doctor run of the same
        # frames gets its result instead of starting another
        frames = store.frame_count(session_id, rank)
        cached = store.diagnostics(session_id, rank)
        if cached is not None and cached[0] == frames:
            return cached[1], False
        findings = _run_child(store.path, session_id, rank)
        store.put_diagnostics(session_id, rank, frames, findings).result()
        return findings, True
    finally:
        _doctor_lock.release()


def _child_main(argv: list[str]) -> int:
    """Child process: read one rank's frames from the store, print the findings as JSON."""
    import os

    import pydantic_core

    os.nice(10)  # the server's requests come first
    db, session_id, rank = Path(argv[0]), argv[1], int(argv[2])
    store = Store(db, read_only=True)
    findings = _diagnose(stored_events(store, session_id, rank))
    sys.stdout.buffer.write(pydantic_core.to_json(findings, inf_nan_mode="strings"))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
