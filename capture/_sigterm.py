"""SIGTERM ends a run as "interrupted", not "ended unexpectedly".

A scheduler's preemption (SLURM), ``kill``, ``docker stop`` and torchrun tearing down its workers
send SIGTERM, whose default action kills a Python process without running atexit: the watches
never wrote their end records and the dashboard told such runs as "ended unexpectedly".  Where
nothing else handles SIGTERM (the default action, installed from the main thread), a handler
writes the runs' end records and then lets the signal kill the process as it would have (its
parent sees the same -SIGTERM status).  A handler installed later that calls ours as the one it
replaced (Lightning's does) only has the runs noted as interrupted: that process goes on, and
its watches close as usual.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

_installed_in: int | None = None  # the process that installed it (a forked worker inherits it)
_end: Callable[[bool], None] | None = None


def install(end: Callable[[bool], None]) -> None:
    """Handle SIGTERM where nothing does: ``end(dying)`` notes the active runs as ended by it
    and, when ``dying`` (ours is the handler), writes their end records before the process dies."""
    global _installed_in, _end
    if _installed_in == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    try:
        current = signal.getsignal(signal.SIGTERM)
        if current is not _on_sigterm:  # (ours, inherited from a forked parent: this process's now)
            if current is not signal.SIG_DFL:
                return  # the process handles it already: its handling stays as it is
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError, AttributeError):  # no signals here (an embedded interpreter)
        return
    _installed_in, _end = os.getpid(), end


def _on_sigterm(signum: int, frame: Any) -> None:
    dying = signal.getsignal(signal.SIGTERM) is _on_sigterm  # not called by a handler chained after ours
    if os.getpid() == _installed_in and _end is not None:  # not a forked DataLoader worker's copy
        with contextlib.suppress(Exception):  # the process is ending: nothing may stop it
            _end(dying)
    if dying:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
