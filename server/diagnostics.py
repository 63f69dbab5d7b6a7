"""The doctor, run over stored events and cached by the frame count it saw.

``torchscope.doctor`` is imported lazily and guarded: a missing or broken doctor must
never take the server down, it only means "no findings" (logged once).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from torchscope.sessionfile import decode_frame

from .store import Store

log = logging.getLogger("torchscope.server")
_warned = False


def _diagnose(events: Iterator[dict[str, Any]]) -> list[dict[str, Any]]:
    global _warned
    try:
        from torchscope.doctor import diagnose
    except Exception as exc:  # the doctor is optional to the server
        if not _warned:
            _warned = True
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


def diagnostics(store: Store, session_id: str, rank: int) -> tuple[list[dict[str, Any]], bool]:
    """Findings for one rank, and whether they were freshly computed (a finding event is due)."""
    frames = store.frame_count(session_id, rank)
    cached = store.diagnostics(session_id, rank)
    if cached is not None and cached[0] == frames:
        return cached[1], False
    findings = _diagnose(stored_events(store, session_id, rank))
    store.put_diagnostics(session_id, rank, frames, findings).result()
    return findings, True
