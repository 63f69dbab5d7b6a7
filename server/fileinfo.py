"""``torchscope info``: a one-screen summary of a session file, read with the codec and the
server's own frame decoder (``frames.file_frames``: the file's events checked against the schema
as an import checks them, so a file info summarizes is one the server imports), except graph
frames, whose insides it only checksums (see ``_events``)."""

from __future__ import annotations

import itertools
import os
import shlex
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchscope.schema import ScriptSource, capture_off, script_source
from torchscope.session import writer_alive
from torchscope.sessionfile import (
    FLAG_GRAPH,
    FLAG_SERIES,
    FrameInfo,
    Readable,
    SessionFileError,
    check_frames,
    salvage,
)

from .frames import BadFrames, file_frames
from .labels import of_event as of_labels

# What a session file mailed or archived most often arrives wrapped in, by its first bytes: the
# reader would only say "not a torchscope session file" of it, where the fix is one command.
# (A .tscope's frames are compressed inside already: wrapping gains next to nothing.)
_WRAPPERS = ((b"\x1f\x8b", "gzip-compressed", "gunzip it first (gzip -dc FILE > run.tscope)"),
             (b"PK\x03\x04", "a zip archive", "unzip it first"),
             (b"\xfd7zXZ\x00", "xz-compressed", "unxz it first"),
             (b"(\xb5/\xfd", "zstd-compressed", "unzstd it first"),
             (b"BZh", "bzip2-compressed", "bunzip2 it first"))


def wrapped(path: Path, name: str | None = None) -> str | None:
    """The one-line error for a session file that arrived compressed or archived (``name``: how
    to call it, default the path), None for any other file (a missing or unreadable one too: the
    reader says what is wrong with it).  Only a regular file is opened: opening a pipe with no
    writer blocks forever (the reader says what a pipe is)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return None
    for magic, what, fix in _WRAPPERS:
        if head.startswith(magic):
            said = name or str(path)
            return f"{said} is {what}, not a torchscope session file itself: {fix.replace('FILE', shlex.quote(said))}"
    return None


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _lone_graph(info: FrameInfo) -> bool:
    # the header says it: one record, and the graph flag (check_records holds a frame to it)
    return bool(info.flags & FLAG_GRAPH) and info.n_events == 1


def _events(path: Path, frames: list[FrameInfo]) -> Iterator[dict[str, Any]]:
    """``sessionfile.iter_events``, each event validated as an import validates it (a record the
    server refuses stops the summary with the import's words, as one that is not JSON stops the
    reader; no slower: the import's decoder parses and validates in one pass), except that a
    frame holding one GraphEvent (by its header) is only checksummed, and stands as
    ``{"kind": "graph"}``: the summary counts graphs, and decoding their JSON was nearly all the
    time on a big file (4-5 s for 20 MiB; checking them with the import's fast path still costs
    ~1.9 s for 12 MiB of graph frames, against 0.01 s).  A damaged graph frame still stops the
    summary with the reader's error (``salvage`` already checked the checksums: only a frame
    damaged since can)."""
    for lone, group in itertools.groupby((f for f in frames if not f.flags & FLAG_SERIES), _lone_graph):
        if not lone:
            try:
                for frame in file_frames(path, list(group)):
                    yield from frame.events
            except BadFrames as exc:  # "run.tscope is corrupt at byte N: invalid step event: ..."
                raise SessionFileError(str(exc)) from None
            continue
        for _ in check_frames(path, list(group)):
            yield {"kind": "graph"}


def _graphs(graphs: int, session: dict[str, Any], cut: dict[str, Any] | None, end: dict[str, Any] | None) -> str | int:
    """The graphs the file holds, and what of the captured ones it does not: a step's ops cut at
    ``max_ops``, and graphs shed under back-pressure (a disk or a server slower than the capture:
    QA 51a, 195 of ~400 graphs shed and nothing said)."""
    notes = [_cut(session, cut)] if cut is not None else []
    shed = end.get("shed_ops") if end else None
    if type(shed) is int and shed > 0:
        notes.append(f"more were captured, {shed:,} ops of them shed: the writer could not keep up")
    return f"{graphs} ({'; '.join(notes)})" if notes else graphs


def _ranks(session: dict[str, Any], ranks: set[int]) -> str:
    """How many ranks the run had and which of them this file records ("ranks: 0" read as
    none)."""
    world = session.get("world_size")
    world = world if isinstance(world, int) and world > 0 else len(ranks) or 1
    mine = ", ".join(map(str, sorted(ranks))) or "0"
    return f"{world} (rank {mine})" if world == 1 else f"{world} (this file: rank {mine})"


def _duration(begin: float | None, stop: float | None) -> str:
    """From the session's start to its end (or its last step): a run of a few steps in ms, not
    "0.0 s"; "unknown" with why, not "?" (QA 42b)."""
    if begin is None or stop is None:
        return "unknown (no step and no end in the file)"
    took = max(stop - begin, 0.0)
    return f"{took * 1000:.0f} ms" if took < 1 else f"{took:.1f} s"


def _cut(session: dict[str, Any], cut: dict[str, Any]) -> str:
    """What the graph count leaves out: a step that ran more ops than ``max_ops`` has a graph of
    its first ``max_ops`` (a graph of a big step read as whole; QA 46c)."""
    settings = session.get("settings")
    cap = settings.get("max_ops") if isinstance(settings, dict) else None
    kept = f"its first {cap:,}" if isinstance(cap, int) else "its first max_ops"
    return (f"cut at max_ops: step {cut.get('step', '?')} ran {cut['ops_cut']:,} ops, its graph holds {kept}, "
            "as does every step that ran more")


def _source(source: ScriptSource | None) -> str:
    """The script recorded in the file (``LogEvent.source``, 1.14), for the doctor's source lines
    on any host: its name and size."""
    if source is None:
        return "not recorded (the doctor reads the script where the run was, if it is unchanged)"
    size = source.get("bytes")
    return f"{os.path.basename(source['path'])} ({_size(size if type(size) is int else len(source['text'].encode()))} recorded)"


def summarize(path: Path, found: Readable | None = None) -> dict[str, Any]:
    """The summary of a session file (``found``: its ``salvage``, when the caller has it)."""
    found = found or salvage(path)
    session: dict[str, Any] = {}
    end: dict[str, Any] | None = None
    steps: set[int] = set()
    ranks: set[int] = set()
    graphs = 0
    t_first = t_last = None
    cut: dict[str, Any] | None = None  # the warning that a step's graph was cut at max_ops
    turned_off: list[str] = []  # parts of the capture that turned themselves off: when, and why
    given: tuple[str | None, list[str] | None] | None = None
    source: ScriptSource | None = None
    for ev in _events(path, found.frames):
        kind = ev.get("kind")
        if kind == "session" and not session:
            session = ev
            if isinstance(ev.get("rank"), int):
                ranks.add(ev["rank"])
        elif kind == "step":
            if isinstance(ev.get("step"), int):
                steps.add(ev["step"])
            if isinstance(ev.get("rank"), int):
                ranks.add(ev["rank"])
            t = ev.get("t")
            if isinstance(t, (int, float)):
                t_first = t if t_first is None else min(t_first, t)
                t_last = t if t_last is None else max(t_last, t)
        elif kind == "graph":
            graphs += 1
        elif kind == "end":
            end = ev
        elif kind == "log" and (src := script_source(ev)) is not None and source is None:
            source = src  # the run's script recorded (1.14): the doctor reads its lines on any host
        elif kind == "log" and (got := of_labels(ev)) is not None:
            given = got  # a download's name and tags (server/labels.py): the file's last win
        elif kind == "log" and isinstance(ev.get("ops_cut"), int) and cut is None:
            cut = ev
        elif kind == "log" and (off := capture_off(ev)) is not None:
            step = ev.get("step")
            at = f" at step {step}" if type(step) is int else ""
            turned_off.append(f"capture of {off[0]} turned off{at} after an internal error: {off[1]}")
    started = session.get("started_at")
    finished = end.get("t") if end else None
    begin = started if isinstance(started, (int, float)) else t_first
    stop = finished if isinstance(finished, (int, float)) else t_last
    writing = not end and writer_alive(session)
    recorded = session.get("name", path.stem)
    name, tags = given or (None, None)
    info = {
        # the name given on the server it was downloaded from, and the capture's beside it
        "name": f"{name} (recorded as {recorded})" if name and name != recorded else recorded,
        **({"tags": ", ".join(tags)} if tags else {}),
        "model": session.get("model", "?"),
        **({"mode": session["mode"]} if isinstance(session.get("mode"), str) else {}),  # (QA 45c: not shown)
        "steps": len(steps),
        "ranks": _ranks(session, ranks),
        "status": (
            f"{end.get('status', 'finished')}" + (f" — {end['message']}" if end.get("message") else "")
            if end
            else "running" if writing else "ended unexpectedly"
        ),
        "graphs captured": _graphs(graphs, session, cut, end),
        "size": _size(os.path.getsize(path)),
        "duration": _duration(begin, stop),
        # the run's script (a line, never its text: `torchscope.load(path).source["text"]` holds it)
        "source": _source(source),
    }
    if turned_off:
        # the session holds less than the run did: said beside its numbers (a "0 steps, finished"
        # with nothing else read as a run that never stepped; QA 38a)
        info["capture"] = "; ".join(turned_off)
    note = found.note(str(path), writing)
    if note:
        info["note"] = note
    return info

