"""The user's lines that the capture cannot see, read back from the recorded script.

Some of what a finding should point at is no torch call, so the capture never records its
line: ``history.append(loss)`` keeps a loss, ``val_loss += criterion(out, y)`` names the
running sum that keeps an evaluation's graph.  Every recorded line is ``basename:line``, and the
script's text answers "which line appends to ``history``":

- the text the capture recorded in the session file (``LogEvent.source``, format 1.14: the
  ``__main__`` file, read as the run began), when its file's basename is the line's -- on any
  host, whatever became of the script since (a colleague's ``torchscope doctor`` of a mailed
  file, a server's import);
- else the script the session header names (``session.script``, an absolute path), when it is
  still where it ran, on this host, unchanged since the run began (a file written with
  ``save_code=False``, or before 1.14).

Anything else -- no text recorded and the file gone or edited since, a line in another module --
gives None, and the finding says what it knows without that line.
"""

from __future__ import annotations

import os
import re
import socket
from functools import lru_cache

from torchscope.schema import script_source

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


def _split(text: str) -> tuple[str, ...]:
    """Lines as Python numbers them: at \\n, \\r\\n and \\r only (``str.splitlines`` also breaks
    at a form feed or U+2028, which would shift every later line)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return tuple(lines[:-1] if lines and not lines[-1] else lines)


@lru_cache(maxsize=16)
def _lines(path: str, mtime: float) -> tuple[str, ...]:
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            return _split(f.read(_MAX_BYTES))
    except OSError:
        return ()


@lru_cache(maxsize=16)
def _text_lines(text: str) -> tuple[str, ...]:
    return _split(text)


def _recorded(run: Run, basename: str) -> tuple[str, ...] | None:
    """The lines of the script's text recorded in the session (``LogEvent.source``) when its
    file is ``basename``; None when the session holds no such text."""
    for ev in run.logs:
        src = script_source(ev)
        if src is not None:
            return _text_lines(src["text"]) if os.path.basename(src["path"]) == basename else None
    return None


def src_line(src: object) -> tuple[str, int] | None:
    """``(basename, line)`` of a recorded ``basename:line``; None for anything else."""
    base, _, line = str(src or "").rpartition(":")
    return (base, int(line)) if base and line.isdigit() else None


def script_lines(run: Run, src: str) -> tuple[str, list[str]] | None:
    """(the file's basename, its lines) for a recorded ``basename:line`` in the run's script."""
    at = src_line(src)
    if at is None:
        return None
    recorded = _recorded(run, at[0])
    if recorded is not None:
        return (at[0], list(recorded)) if recorded else None
    path = _script(run, at[0])
    if path is None:
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
