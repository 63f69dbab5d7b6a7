"""One server per data directory: ``torchscope serve`` holds an OS lock (``fcntl.flock``) on
``DATA/server.lock`` for its whole life, so a second server on the same directory -- which
would write the same SQLite store -- refuses to start, and says which server holds it.  The
kernel drops the lock with the process (a SIGKILL too), so a killed server leaves nothing to
clean up; the file itself stays (deleting a lock file races with the next server taking it).
Standard library only: the CLI's client (``client.ensure_server``) reads it too."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # (not POSIX: no lock, as before)
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = "server.lock"
# How long a server waits for the lock before it says another holds it: a client looking at the
# lock (``holder``) takes it for a moment; a server holds it for its life.
_RETRY_S = 1.0


class DataDirInUse(RuntimeError):
    """Another live process serves this data directory; ``url`` is its address when known."""

    def __init__(self, data_dir: Path, url: str | None, pid: int | None) -> None:
        self.data_dir, self.url, self.pid = data_dir, url, pid
        at = f" at {url}" if url else ""
        who = f" (pid {pid})" if pid else ""
        super().__init__(f"a torchscope server{at}{who} already uses the data directory {data_dir}: open that one, "
                         "or give this one another --data")


def _read(fd: int) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        os.lseek(fd, 0, os.SEEK_SET)
        data = json.loads(os.read(fd, 4096) or b"{}")
        if isinstance(data, dict):
            return data
    return {}


def _open(data_dir: Path) -> int:
    # never O_TRUNC: a server holding the lock wrote its address there (O_CLOEXEC by Python's
    # default: the doctor's child processes do not inherit it, nor keep the lock past the server)
    return os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)


def _try_lock(fd: int) -> bool:
    assert fcntl is not None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def acquire(data_dir: Path, url: str) -> int | None:
    """Lock ``data_dir`` for this process's life and write ``url`` and the pid in the lock file;
    the descriptor (keep it open: closing it lets the lock go).  Raises ``DataDirInUse`` when
    another process holds it, ``OSError`` when the file cannot be made (a read-only directory:
    the store could not be written either).  None where the OS has no ``flock``."""
    if fcntl is None:
        return None
    fd = _open(data_dir)
    deadline = time.monotonic() + _RETRY_S
    while not _try_lock(fd):
        if time.monotonic() >= deadline:
            held = _read(fd)
            os.close(fd)
            url_held, pid = held.get("url"), held.get("pid")
            raise DataDirInUse(data_dir, url_held if isinstance(url_held, str) else None,
                               pid if isinstance(pid, int) else None)
        time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps({"url": url, "pid": os.getpid(), "started_at": time.time()}).encode())
    return fd


def holder(data_dir: Path) -> dict[str, Any] | None:
    """What the lock file of a held ``data_dir`` says (``url``, ``pid``; ``{}`` when the holder
    has not written it yet), None when no server holds it (or it cannot be told).  Takes the lock
    for a moment when it is free: a server starting then waits for it (``_RETRY_S``)."""
    if fcntl is None:
        return None
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return _read(fd)
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
