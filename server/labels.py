"""A run's name and tags given on the server travel with its file.

The dashboard's rename and tags live in the store (``sessions.name``, ``.tags``), not in the
recorded frames, so a download -- the stored frames, byte for byte -- read as the capture named
it (fifty-first session: a colleague's ``torchscope open`` showed "train" and no tags for the
"baseline lr=1e-3" a user had sent).  Now a download of a renamed or tagged run ends with one
more frame: a ``log`` event carrying ``labels`` (``schema.RunLabels``, format 1.13), the frame
numbered on from the stored ones.  Every reader reads it as the log line it is (a 1.12 reader
too: unknown fields are allowed, and its ``message`` says what it holds); the import and
``torchscope info`` take the name and tags from it.

The import does not store such trailing frames (they are the server's, not the run's): the
store's frames stay the run's own, so a file downloaded twice -- or downloaded, imported
elsewhere, renamed and downloaded again -- ends with exactly one labels frame, never a stack of
contradicting names, and two downloads of one run imported one after the other are the same
run (their frames match), the last one's labels winning.  A download of a session never given
a name or tags is the stored file as before, byte for byte; once given some (a PATCH, a file's
labels: ``sessions.labeled``), every download says them, the recorded ones too after a rename
back -- else importing it where an earlier download went would leave that one's name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchscope.sessionfile import FrameInfo, encode_frame, may_hold_labels

from .frames import BadFrames, file_frames

MAX_TAG = 100  # characters, as a PATCH keeps them
MAX_NAME = 200  # characters of a name (a PATCH refuses more; an import keeps the first)
MAX_TAGS = 50  # tags of a session (likewise)
# what a blank name or tag may hold besides spaces (str.strip() keeps the zero-width ones)
INVISIBLE = " \t\n\r\f\v\u00a0\u200b\u200c\u200d\u2060\ufeff"


def labels_event(name: str, tags: list[str]) -> dict[str, Any]:
    """The log event (``schema.LogEvent.labels``) of a name and tags given on a server."""
    said = f"named {name!r}" + (f", tagged {', '.join(tags)}" if tags else "")
    # no time in it: two downloads of one state are the same bytes
    return {"kind": "log", "level": "info",
            "message": f"torchscope server: {said} (the run's name and tags on the server it was downloaded from)",
            "labels": {"name": name, "tags": tags}}


def labels_frame(seq: int, name: str, tags: list[str]) -> bytes:
    return encode_frame(seq, [labels_event(name, tags)])


def to_append(summary: dict[str, Any]) -> tuple[str, list[str]] | None:
    """The name and tags a download of this session (``Store.session``) must carry: None when
    none was ever given to it (the recorded file says them).  One renamed back to its recorded
    name, its tags taken off, still carries them: a copy imported from an earlier download took
    that download's name, and importing this one must take it back (QA 53)."""
    meta = summary.get("meta") or {}
    recorded = meta.get("name") if isinstance(meta.get("name"), str) else None
    name, tags = str(summary.get("name") or ""), [str(t) for t in summary.get("tags") or []]
    if name == (recorded or summary.get("id")) and not tags and not summary.get("labeled"):
        return None
    return name, tags


def of_event(ev: dict[str, Any]) -> tuple[str | None, list[str] | None] | None:
    """``(name, tags)`` of a labels log event (validated against the schema), None for any other
    event; a blank name or a tag that is no string is left out."""
    labels = ev.get("labels") if ev.get("kind") == "log" else None
    if not isinstance(labels, dict):
        return None
    name = labels.get("name")
    name = name.strip()[:MAX_NAME] if isinstance(name, str) and name.strip() else None
    tags = labels.get("tags")
    # (as a PATCH takes them: stripped; a blank one, which a PATCH refuses, left out; past a
    # PATCH's limits, cut to them -- QA 52c: a 100,000-character name and 5,000 tags were stored)
    tags = ([t.strip()[:MAX_TAG] for t in tags if isinstance(t, str) and t.strip(INVISIBLE)][:MAX_TAGS]
            if isinstance(tags, list) else None)
    return name, tags


def split(path: Path, infos: list[FrameInfo]) -> tuple[list[FrameInfo], tuple[str | None, list[str] | None] | None]:
    """The file's frames without its trailing labels frames, and the labels of the last of them
    (None: none).  The first frame is always kept (the session event's); a frame that does not
    decode is left in, for the import to refuse in its words."""
    end = len(infos)
    found = None
    while end > 1 and may_hold_labels(infos[end - 1]):
        try:
            frame = next(file_frames(path, infos[end - 1:end]))
        except BadFrames:
            break
        got = of_event(frame.events[0]) if frame.events else None
        if got is None:
            break
        found = found or got  # walking back: the file's last labels win
        end -= 1
    return infos[:end], found
