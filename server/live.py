"""The live channel: Server-Sent Events fan-out to every open dashboard.

Each subscriber owns a bounded asyncio queue; publishing never waits.  A subscriber whose
queue is full is too slow to follow and is dropped (its browser reconnects and refetches),
so one stalled tab can never hold up ingest.  Publish only from the event loop's thread.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

QUEUE_SIZE = 1000
KEEPALIVE_S = 15.0


class LiveHub:
    def __init__(self) -> None:
        self._subs: set[asyncio.Queue[str | None]] = set()
        self._closed = False  # the server is stopping: streams end, new ones at once

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    def publish(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, separators=(",", ":"))
        for q in list(self._subs):
            try:
                q.put_nowait(line)
            except asyncio.QueueFull:
                self._subs.discard(q)
                # make room for the sentinel so the stream ends now, not at the next keepalive
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(None)

    def close(self) -> None:
        """End every stream (the server is stopping): an open dashboard's stream never ends by
        itself, so uvicorn would wait its graceful-shutdown timeout for it and log an ERROR."""
        self._closed = True
        for q in list(self._subs):
            self._subs.discard(q)
            while not q.empty():
                q.get_nowait()
            q.put_nowait(None)

    async def stream(self) -> AsyncIterator[str]:
        """SSE text: one ``data: {json}`` per event, a comment line as keepalive."""
        q: asyncio.Queue[str | None] = asyncio.Queue(QUEUE_SIZE)
        if self._closed:  # a browser reconnecting while the server stops
            return
        self._subs.add(q)
        try:
            yield ": connected\n\n"
            while True:
                try:
                    line = await asyncio.wait_for(q.get(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield ": keepalive\n\n"
                    continue
                if line is None:
                    return
                yield f"data: {line}\n\n"
        finally:
            self._subs.discard(q)


def ingest_messages(session_id: str, rank: int, frames_events: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """What one ingest tells the browsers: every session/graph/end event, and for steps one
    message per frame naming its last step (a frame can hold hundreds of steps; the dashboard
    refetches the range it shows)."""
    out: list[dict[str, Any]] = []
    for events in frames_events:
        last_step: int | None = None
        ends: list[dict[str, Any]] = []
        for ev in events:
            kind = ev.get("kind")
            if kind == "step":
                step = ev.get("step")
                if isinstance(step, int):
                    last_step = step if last_step is None else max(last_step, step)
            elif kind == "end":
                ends.append({"session": session_id, "rank": rank, "kind": "end"})
            elif kind in ("session", "graph"):
                msg: dict[str, Any] = {"session": session_id, "rank": rank, "kind": kind}
                if kind == "graph":
                    msg["step"] = ev.get("step")
                    msg["micro"] = ev.get("micro", 0)
                out.append(msg)
        if last_step is not None:
            out.append({"session": session_id, "rank": rank, "kind": "step", "step": last_step})
        out.extend(ends)  # the end comes after the steps it closes
    return out
