"""Background transport: events -> session file -> server, never on the training thread.

The training thread only calls ``emit`` (a deque append).  One daemon thread wakes every
``flush_interval`` seconds, writes the pending events to the session file as frames, and
then sends to the server every frame the server does not have yet, read back from the file.
The file is therefore the source of truth: when the server is down the thread backs off and
keeps writing; when it comes back the server says which frame it expects next
(``GET /api/ingest/{session}/{rank}/next``) and the gap is filled from the file.

Back-pressure: step-level events are essential and never dropped; per-op detail (graph
events) is shed first when too many are pending, and the count is reported in the end event.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from typing import Any

from .sessionfile import FRAME_HEADER_SIZE, FrameInfo, SessionFileWriter

log = logging.getLogger("torchscope")

DEFAULT_SERVER = "http://127.0.0.1:6150"
_MAX_PENDING_GRAPHS = 16  # graph events waiting for the writer before new ones are shed
_MAX_POST_BYTES = 8 * 1024 * 1024
_HTTP_TIMEOUT = 2.0


class Transport:
    def __init__(
        self,
        path: str,
        session_id: str,
        rank: int = 0,
        server: str | None = None,
        token: str | None = None,
        autostart: bool = False,
        flush_interval: float = 0.25,
    ) -> None:
        self.session_id = session_id
        self.rank = rank
        self.server = server.rstrip("/") if server else None
        self.token = token
        self.autostart = autostart
        self.flush_interval = flush_interval
        self.writer = SessionFileWriter(path)
        self.shed = 0
        self.sent_seq = 0  # next frame seq the server is known to expect
        self.server_ok: bool | None = None
        self._queue: deque[dict[str, Any]] = deque()
        self._pending_graphs = 0
        self._lock = threading.Lock()  # guards _pending_graphs only
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._backoff_until = 0.0
        self._backoff = 0.5
        self._autostarted = False
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="torchscope-transport", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ training thread side
    def emit(self, event: dict[str, Any]) -> None:
        """Queue one event; O(1), never blocks, never raises."""
        if event.get("kind") == "graph":
            with self._lock:
                if self._pending_graphs >= _MAX_PENDING_GRAPHS:
                    self.shed += len(event.get("ops", ()))
                    return
                self._pending_graphs += 1
        self._queue.append(event)

    def flush(self, timeout: float = 5.0) -> None:
        """Ask the thread to write (and send) now; wait until the queue is written."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        while self._queue and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self, end_event: dict[str, Any] | None = None, timeout: float = 5.0) -> None:
        if end_event is not None:
            end_event.setdefault("shed_ops", self.shed)
            self._queue.append(end_event)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        self.writer.close()

    # ------------------------------------------------------------------ background thread
    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            try:
                self._write_pending()
                if self.server:
                    self._send_pending(final=stopping)
            except Exception as exc:  # never let the thread die silently; keep the file going
                self._warn_once(f"torchscope: transport error ({exc!r}); recording continues")
            if stopping:
                return
            self._wake.wait(self.flush_interval)
            self._wake.clear()

    def _write_pending(self) -> None:
        batch: list[dict[str, Any]] = []
        while self._queue:
            ev = self._queue.popleft()
            if ev.get("kind") == "graph":
                # graph events get frames of their own so readers can seek to them by step
                if batch:
                    self.writer.append(batch)
                    batch = []
                self.writer.append([ev])
                with self._lock:
                    self._pending_graphs -= 1
            else:
                batch.append(ev)
        if batch:
            self.writer.append(batch)

    # ------------------------------------------------------------------ wire
    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/x-tscope-frames"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def _url(self, tail: str) -> str:
        return f"{self.server}/api/ingest/{self.session_id}/{self.rank}{tail}"

    def _request(self, url: str, data: bytes | None = None) -> dict[str, Any]:
        req = urllib.request.Request(url, data=data, headers=self._headers(), method="POST" if data else "GET")
        try:
            with urllib.request.urlopen(req, timeout=_HTTP_TIMEOUT) as resp:
                return dict(json.loads(resp.read() or b"{}"))
        except urllib.error.HTTPError as exc:
            if exc.code == 409:  # the server expects another seq: it says which
                return dict(json.loads(exc.read() or b"{}"))
            raise

    def _send_pending(self, final: bool) -> None:
        if time.monotonic() < self._backoff_until and not final:
            return
        frames = self.writer.frames
        try:
            if self.server_ok is not True:
                self.sent_seq = int(self._request(self._url("/next")).get("next_seq", 0))
            deadline = time.monotonic() + (3.0 if final else 1.0)
            while self.sent_seq < len(frames) and time.monotonic() < deadline:
                chunk = self._chunk(frames, self.sent_seq)
                reply = self._request(self._url(""), chunk)
                self.sent_seq = int(reply.get("next_seq", self.sent_seq))
            self.server_ok = True
            self._backoff = 0.5
        except (OSError, ValueError) as exc:
            self.server_ok = False
            self._maybe_autostart()
            self._backoff_until = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, 10.0)
            self._warn_once(
                f"torchscope: server {self.server} not reachable ({exc.__class__.__name__}); "
                f"training continues, recording to {self.writer.path}"
            )

    def _chunk(self, frames: list[FrameInfo], start: int) -> bytes:
        out: list[bytes] = []
        size = 0
        with open(self.writer.path, "rb") as f:
            for info in frames[start:]:
                n = FRAME_HEADER_SIZE + info.length
                if out and size + n > _MAX_POST_BYTES:
                    break
                f.seek(info.offset)
                out.append(f.read(n))
                size += n
        return b"".join(out)

    def _maybe_autostart(self) -> None:
        """Start `torchscope serve` in its own process session, once; it outlives the script."""
        if not self.autostart or self._autostarted or not self.server:
            return
        self._autostarted = True
        port = self.server.rsplit(":", 1)[-1].split("/")[0]
        cmd = [sys.executable, "-m", "torchscope.server.cli", "serve", "--port", port, "--quiet"]
        try:
            subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "TORCHSCOPE_AUTOSTARTED": "1"},
            )
            self._backoff = 0.25
        except OSError as exc:
            self._warn_once(f"torchscope: could not start a server ({exc}); recording to the file only")

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            print(message, file=sys.stderr)
            log.warning(message)
