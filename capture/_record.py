"""Which file a run records to, claimed before anything is written.

``record=`` is the user's choice; without it ``torchscope-runs/<name>-<time>.tscope``.  A path
is created exclusively (``O_EXCL``), so two runs started in one second -- a GAN's two watches,
a sweep launched with ``&`` -- never share one file and lose both.  A path the user chose that
a finished run recorded is written over, as re-running a script expects; nothing else is ever
removed: not a file another run is writing, not a file that is no session file (a checkpoint,
``/dev/null``), not a directory (a run records into one given as ``record=``).  A folder that
cannot be written (read-only, a container's working directory) sends the run to the system's
temporary folder; a run that can have no file at all is not watched, and says so -- ``watch()``
never raises into the training for its file.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ._console import say
from .distributed import RankInfo, rank_path
from .session import writer_alive
from .sessionfile import (
    FRAME_HEADER_SIZE,
    HEADER_SIZE,
    check_file_header,
    claim,
    decode_frame,
    parse_frame_header,
)


def default_record(name: str) -> str:
    """``torchscope-runs/<name>-<time>.tscope`` (``claim_record`` makes it ``-2``, ``-3``...
    when another run has it)."""
    return os.path.join("torchscope-runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.tscope")


def claim_record(base: str, rank: RankInfo, chosen: bool, written_here: Callable[[str], bool],
                 name: str) -> str | None:
    """The file this run records to, created here; None when there can be none (said).
    ``written_here``: whether a running watch of this process writes a path."""
    if chosen and os.path.isdir(base):
        base = os.path.join(base, os.path.basename(default_record(name)))
    elif chosen and os.path.exists(base) and not os.path.isfile(base):
        # a device (/dev/null: "no file"), a pipe, a socket: never written into nor removed
        say(f"torchscope: record={base!r} is not a regular file: not watching this run")
        return None
    try:
        return _claim(base, rank, chosen, written_here)
    except OSError as exc:
        reason = _not_a_folder(base) or exc.strerror or type(exc).__name__
    spare = os.path.join(tempfile.gettempdir(), "torchscope-runs", os.path.basename(base))
    try:
        # (the name chosen, its finished run's file there is written over as it would have been
        # where it was asked for: "being written by another run" was said of it, QA 49c)
        path = _claim(spare, rank, chosen, written_here)
    except OSError:
        say(f"torchscope: cannot record to {rank_path(base, rank)} ({reason}), nor to {tempfile.gettempdir()}: "
            "not watching this run")
        return None
    say(f"torchscope: cannot record to {rank_path(base, rank)} ({reason}); recording to {path}")
    return path


def _not_a_folder(path: str) -> str | None:
    """"<a> is not a directory" when a folder of ``path`` is a file (``/dev/full/run.tscope``,
    ``train.py/run.tscope``): makedirs says only "File exists" (QA 49c)."""
    folder = os.path.dirname(os.path.abspath(path))
    while folder and not os.path.exists(folder):
        folder = os.path.dirname(folder)
    return f"{folder} is not a directory" if folder and not os.path.isdir(folder) else None


def _claim(base: str, rank: RankInfo, chosen: bool, written_here: Callable[[str], bool]) -> str:
    stem = base[: -len(".tscope")] if base.endswith(".tscope") else base
    taken = ""  # why the asked path was not used
    for n in range(1, 1000):
        path = rank_path(base if n == 1 else f"{stem}-{n}.tscope", rank)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if n == 1 and os.path.lexists(path):
            if not _ours(path):
                taken = "is not a torchscope session file (left as it is)"
                continue
            if chosen:
                taken = _kept(path, written_here)
                if not taken:
                    os.remove(path)
        try:
            claim(path)  # (its header in it from the start: never read as an empty file)
        except FileExistsError:
            # (a name not chosen, another run's file: kept whether or not it is still written)
            taken = taken or _kept(path, written_here) or "holds another run's recording (kept)"
            continue
        if n > 1:
            say(f"torchscope: {rank_path(base, rank)} {taken}; recording to {path}")
        _claimed.add(os.path.abspath(path))
        return path
    raise FileExistsError(f"{rank_path(base, rank)} and 998 more names beside it are taken")


def _ours(path: str) -> bool:
    """Whether ``path`` is a regular file holding a torchscope session (its header), or one
    too new to hold its header yet (another run created it a moment ago)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return False
        with open(path, "rb") as f:
            head = f.read(HEADER_SIZE)
    except OSError:
        return False
    if not head:
        return time.time() - st.st_mtime < 10
    try:
        check_file_header(head)
    except Exception:  # another kind of file, or a newer format: not ours to write over
        return False
    return True


def first_event(path: str) -> dict[str, Any] | None:
    """The first event of a session file (its first frame only, however long the file), or None."""
    try:
        with open(path, "rb") as f:
            check_file_header(f.read(HEADER_SIZE))
            head = f.read(FRAME_HEADER_SIZE)
            frame = head + f.read(parse_frame_header(head).length)
        events = decode_frame(frame)[1]
    except Exception:  # not (yet) a readable session file
        return None
    return events[0] if events else None


_claimed: set[str] = set()  # the files this interpreter's watches recorded to
_WRITTEN = "is being written by another run"


def _kept(path: str, written_here: Callable[[str], bool]) -> str:
    """Why the session file ``path`` must not be written over, or "": a running watch of this
    process or a live process on this host writes it (its session event's pid; a file too new
    to hold that event yet counts as written), or this process recorded it before it exec'd
    itself (a self-restart goes on in a second file, not over its first half)."""
    if written_here(path):
        return _WRITTEN
    first = first_event(path)
    if isinstance(first, dict) and first.get("kind") == "session":
        if first.get("pid") != os.getpid():
            return _WRITTEN if writer_alive(first) else ""
        # this very process: an earlier watch of this interpreter (a notebook's cell run again:
        # written over), or the program this process was before an exec (its start time is
        # this process's, which writer_alive checks)
        if os.path.abspath(path) not in _claimed and writer_alive(first):
            return "holds this process's run from before it exec'd itself (kept)"
        return ""
    with contextlib.suppress(OSError):
        if time.time() - os.path.getmtime(path) < 10:
            return _WRITTEN
    return ""
