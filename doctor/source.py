"""The user's lines that the capture cannot see, read back from the recorded script.

Some of what a finding should point at is no torch call, so the capture never records its
line: ``history.append(loss)`` keeps a loss, ``val_loss += criterion(out, y)`` names the
running sum that keeps an evaluation's graph.  The session header names the script
(``session.script``, an absolute path) and every recorded line is ``basename:line``; when that
script is still where it ran, unchanged since the run began, its text answers "which line
appends to ``history``".  Anything else -- the file gone or edited since, a line in another
module, a server reading a colleague's upload -- gives None, and the finding says what it knows
without that line.
"""

from __future__ import annotations

import os
import re
import socket
from functools import lru_cache

from .run import Run, as_float

_MAX_BYTES = 2 << 20  # a training script, not a data file

# ``name.append(``, ``.extend(``, ``.insert(``, ``.appendleft(``, ``.add(``, ``name += [``,
# ``name[key] = ``: a line that puts a value into the container ``name``
_KEEPS = r"(?:\s*\.\s*(?:append|extend|insert|appendleft|add)\s*\(|\s*\+=\s*[\[(]|\s*\[[^\]]*\]\s*=(?!=))"
# ``total += ...``, ``total = total + ...``: a running sum (its target, group 1)
_SUMS = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(?:\+=|=\s*\1\s*\+)")


def _script(run: Run, basename: str) -> str | None:
    """The recorded script's path when its name is ``basename`` and it has not changed since
    the run began (its lines are the ones recorded)."""
    path = run.session.get("script")
    if run.session.get("host") != socket.gethostname():
        return None  # another machine's run (a colleague's file, a remote live run): its path is not this one's
    if not isinstance(path, str) or not path.endswith(".py") or os.path.basename(path) != basename:
        return None
    started = as_float(run.session.get("started_at"))
    try:
        st = os.stat(path)
    except OSError:
        return None
    if started is None or st.st_mtime > started or st.st_size > _MAX_BYTES or not os.path.isfile(path):
        return None
    return path


@lru_cache(maxsize=16)
def _lines(path: str, mtime: float) -> tuple[str, ...]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return tuple(f.read(_MAX_BYTES).splitlines())
    except OSError:
        return ()


def src_line(src: object) -> tuple[str, int] | None:
    """``(basename, line)`` of a recorded ``basename:line``; None for anything else."""
    base, _, line = str(src or "").rpartition(":")
    return (base, int(line)) if base and line.isdigit() else None


def script_lines(run: Run, src: str) -> tuple[str, list[str]] | None:
    """(the file's basename, its lines) for a recorded ``basename:line`` in the run's script."""
    at = src_line(src)
    path = _script(run, at[0]) if at is not None else None
    if at is None or path is None:
        return None
    try:
        lines = _lines(path, os.stat(path).st_mtime)
    except OSError:
        return None
    return (at[0], list(lines)) if lines else None


def line_text(run: Run, src: str) -> str | None:
    """The text of the recorded line ``src`` (``basename:line``), stripped; None when unknown."""
    found = script_lines(run, src)
    n = int(src.rpartition(":")[2]) if found else 0
    return found[1][n - 1].strip() if found and 0 < n <= len(found[1]) else None


def keeping_line(run: Run, container: str, near: str) -> str | None:
    """``basename:line`` of the one line of the script (the file of ``near``, a recorded line)
    that puts values into ``container`` (``history``, ``self.outputs``): ``history.append(loss)``
    -- of several, the first after ``near``; None when unknown."""
    found = script_lines(run, near)
    if found is None or not container:
        return None
    base, lines = found
    keeps = re.compile(r"(?<![\w.])" + re.escape(container) + _KEEPS)
    hits = [n for n, text in enumerate(lines, 1) if keeps.search(text.split("#", 1)[0])]
    if len(hits) > 1:  # several: the first after the line that made the value
        at = int(near.rpartition(":")[2])
        hits = [n for n in hits if n > at][:1]
    return f"{base}:{hits[0]}" if hits else None


def running_sum(run: Run, src: str) -> str | None:
    """The name a recorded line sums into (``val_loss`` of ``val_loss += criterion(out, y)``),
    None when the line is no such sum or not known."""
    text = line_text(run, src)
    m = _SUMS.match(text) if text else None
    return m.group(1) if m else None
