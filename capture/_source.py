"""The run's script, recorded in its session file (format 1.14, ``schema.LogEvent.source``).

The doctor names lines the capture cannot see (``history.append(loss)``, ``val_loss +=
criterion(...)``) by reading the script.  Read from the disk, that works only on the host the
run was on, while the script is unchanged: a ``.tscope`` mailed to a colleague lost those
findings' precise wording.  So ``watch()`` (unless ``save_code=False`` or
``$TORCHSCOPE_SAVE_CODE=0``) records the text of the ``__main__`` file once, as data (a JSON
string), in one ``log`` event of a frame of its own right after the session event's.

The training thread only names the file, once at watch() (``main_script``: no file read, ~1 ms); the writer
thread reads it (``source_event``) when it meets the marker the watch queued after the session
event.  Nothing here raises into the user's loop: a file that cannot be read, or is not worth
recording, is left out silently.
"""

from __future__ import annotations

import os
import stat
import sys
import sysconfig
import time
from typing import Any

MAX_BYTES = 2 << 20  # a training script, not a data file (the doctor's limit too)
ENV = "TORCHSCOPE_SAVE_CODE"
_OFF = ("0", "false", "no", "off")
# a file under these is a library's, not the user's script (``python -m pytest``, a launcher)
_LIBRARY_DIRS = ("site-packages", "dist-packages")


def wanted(save_code: bool) -> bool:
    """Whether this watch records the script: ``save_code`` and no ``TORCHSCOPE_SAVE_CODE=0``."""
    return bool(save_code) and os.environ.get(ENV, "").strip().lower() not in _OFF


def _library(path: str) -> bool:
    """Whether ``path`` is a library's file, not the user's script: under ``site-packages``, the
    standard library (``python -m cProfile train.py`` runs cProfile.py as ``__main__``), or
    Jupyter's kernel launcher."""
    parts = path.split(os.sep)
    if "ipykernel" in parts[-1] or any(p in _LIBRARY_DIRS or p.startswith("ipykernel") for p in parts[:-1]):
        return True
    stdlib = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib")} - {None, ""}
    return any(os.path.dirname(path) == d or path.startswith(d + os.sep) for d in stdlib)


def main_script() -> str | None:
    """The absolute path of the run's script: the ``__main__`` module's ``.py`` file (``python
    train.py``, and the module's file for ``python -m pkg.train``), else ``sys.argv[0]``'s where
    ``__main__`` is a tool's that runs it (``python -m cProfile train.py``); None where there is
    none worth recording: ``python -c``, a console, a Jupyter kernel (its ``__main__`` is the
    notebook's namespace, or the kernel launcher's file), a library's entry point under
    ``site-packages``.  No I/O: the writer thread finds out whether the file is there."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    argv0 = sys.argv[0] if sys.argv else None
    for path in (main, argv0):
        if isinstance(path, str) and path.endswith(".py"):
            path = os.path.abspath(path)
            if not _library(path):
                return path
    return None


def _process_started() -> float | None:
    """When this process started (Linux ``/proc``; None elsewhere): a script modified later is
    not the text Python compiled."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return None


def _text(data: bytes) -> str:
    """The file's text as Python reads it (its PEP 263 coding line, UTF-8 by default), each
    undecodable byte a U+FFFD: a session file holds valid Unicode only, and lines stay lines."""
    import io
    import tokenize  # (the writer thread's import, not watch()'s)

    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:  # a coding line naming no codec Python knows
        encoding = "utf-8"
    try:
        return data.decode(encoding, "replace")
    except LookupError:
        return data.decode("utf-8", "replace")


def source_event(path: str) -> dict[str, Any] | None:
    """The ``log`` event recording the script at ``path`` (writer thread), None when it is not
    recorded: gone, no regular file, over ``MAX_BYTES``, or modified since the process started."""
    import hashlib

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            return None
        started = _process_started()
        if started is not None and st.st_mtime > started + 2.0:  # (/proc's boot time is whole seconds)
            return None
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_BYTES:
        return None
    name = os.path.basename(path)
    size = f"{len(data)} B" if len(data) < 1024 else f"{len(data) / 1024:.1f} KiB"
    return {
        "kind": "log",
        "t": time.time(),
        "level": "info",
        "message": f"torchscope: the script {name} ({size}) is recorded in this file, for the doctor's source lines "
                   f"(watch(save_code=False) or {ENV}=0 leave it out)",
        "source": {"path": path, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "text": _text(data)},
    }
