"""Background transport: events -> session file -> server, never on the training thread.

The training thread only calls ``emit`` (a deque append).  One daemon thread wakes every
``flush_interval`` seconds, writes the pending events to the session file as frames (and,
every few hundred steps, the series frames of those steps), and then sends to the server every
frame the server does not have yet, read back from the file.
The file is therefore the source of truth: when the server is down the thread backs off and
keeps writing; when it comes back the server says which frame it expects next
(``GET /api/ingest/{session}/{rank}/next``) and the gap is filled from the file.

Back-pressure: step-level events are essential and never dropped; per-op detail (graph
events) is shed first when too many are pending, and the count is reported in the end event.
Memory stays bounded while the server is away because frames are re-read from the file, never
kept in memory, and however long the run: the writer remembers where its latest few thousand
frames lie and every 1024th, and finds any other by its headers (``SessionFileWriter.spans``).
When nothing was sent for ``_HEARTBEAT_S`` the thread asks the server for its ``next`` seq, so
the server can tell a quiet run from a dead one.

Shutdown: on ``close`` the thread writes the last events, closes the file (complete from now
on), and only then tries a last bounded send; ``close`` returns within its timeout whatever the
server does.  A forked child (DataLoader worker) inherits the object but not the thread: every
entry point checks the pid, so a child never writes the file nor opens a connection.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import weakref
from collections import deque
from typing import Any

from ._console import say
from ._source import source_event
from .sessionfile import RawJSON, SessionFileWriter, dumps_event, parse_frame_header

# What a server that refuses the token is told as, here and by the `torchscope` CLI
NEEDS_TOKEN = "needs its token: set TORCHSCOPE_TOKEN to the one in the URL it printed"
WRONG_TOKEN = "refused TORCHSCOPE_TOKEN: it is not this server's token (see the URL it printed)"
UNSENDABLE_TOKEN = "the token holds a control character (a newline?), which no browser or HTTP client can send"


def read_token(given: str | None = None) -> str | None:
    """The token given, else ``$TORCHSCOPE_TOKEN``, as the server and every client read it:
    stripped (a token read from a file keeps its newline), empty meaning none."""
    return (given or "").strip() or (os.environ.get("TORCHSCOPE_TOKEN") or "").strip() or None


def sendable(token: str | None) -> bool:
    """Whether ``token`` can travel in a URL and an Authorization header (see UNSENDABLE_TOKEN)."""
    return token is None or token.isprintable()

log = logging.getLogger("torchscope")
# A library's logger stays silent unless the user configures logging: the one-line messages
# below already go to stderr, and Python's last-resort handler would print them twice.
log.addHandler(logging.NullHandler())

DEFAULT_SERVER = "http://127.0.0.1:6150"
_MAX_PENDING_GRAPHS = 16  # graph events waiting for the writer before new ones are shed
_MAX_POST_BYTES = 8 * 1024 * 1024
_MAX_PENDING_OPS = 2_000_000  # ops held by those pending graph events
_HTTP_TIMEOUT = 2.0
_HEARTBEAT_S = 5.0
_FINAL_SEND_S = 3.0  # how long close() may spend sending the tail to the server
_BOOTING_WAIT_S = 10.0  # how long close() waits for a server this run started that has not answered yet
_AUTOSTART_GRACE_S = 30.0  # how long a server started by this run may take to answer before we warn
_NET_ERRORS = (OSError, ValueError, TypeError, http.client.HTTPException)
# the queue's marker where the writer records the run's script (record_source): no event kind
_SOURCE_MARK = "\x00source"


def server_url(text: str) -> str | None:
    """``text`` as a server's base URL (no trailing slash), or None when it is not an http(s)
    URL with a host (and a valid port, if it names one)."""
    text = text.strip()
    try:
        # urlsplit raises ValueError on a bracketed host it cannot read ("http://[::1"), .port
        # on a port that is no number or out of range
        u = urllib.parse.urlsplit(text)
        u.port  # noqa: B018
    except ValueError:
        return None
    return text.rstrip("/") if u.scheme in ("http", "https") and u.hostname else None


def names_more_than_a_server(url: str) -> bool:
    """Whether an http(s) URL names more than a server's base: a path, a query, a user:password
    (the server is served at its root, and asks for a token, not a password)."""
    try:
        parts = urllib.parse.urlsplit(url)
        return bool(parts.path.strip("/") or parts.query or parts.username is not None)
    except ValueError:  # what server_url let through and urlsplit refuses
        return True


def base_url_hint(origin: str, text: str) -> str:
    """What a URL with a path is told (the watch(), ``$TORCHSCOPE_SERVER`` and the CLI's words)."""
    sep = " " if origin.startswith("-") else "="
    return f"{origin}{sep}{text!r}: give the server's base URL ({DEFAULT_SERVER}), without a path or user:password"


def resolve_server(server: str | None) -> tuple[str | None, bool]:
    """``watch(server=...)`` -> (the server URL to send to, None: the file only; whether to
    start one when none answers).  "auto" is ``$TORCHSCOPE_SERVER`` or ``DEFAULT_SERVER``; a
    ``$TORCHSCOPE_SERVER`` that is no http(s) URL is said in one line and recording goes to
    the file only (it used to be sent to as is, and a server "started" for it)."""
    if server != "auto":
        return (server.rstrip("/") if server else None), False
    text = os.environ.get("TORCHSCOPE_SERVER") or DEFAULT_SERVER
    url = server_url(text)
    if url is None:
        say(f"torchscope: TORCHSCOPE_SERVER={text!r} is not an http(s) URL; recording to the file only")
    elif names_more_than_a_server(url):  # (QA 52a: sent there, refused "HTTP 404: {"detail":"Not Found"}")
        say(f"torchscope: {base_url_hint('TORCHSCOPE_SERVER', text)}; recording to the file only")
        url = None
    return url, url is not None


def local_port(url: str) -> int | None:
    """The port of a server this machine can start for ``url``: a loopback host and an explicit
    port; None for any other URL (a server started here would not answer there)."""
    u = urllib.parse.urlsplit(url)
    try:
        port = u.port
    except ValueError:
        return None
    return port if u.hostname in ("127.0.0.1", "localhost") and u.scheme == "http" and port else None


def started_line(url: str, pid: int) -> str:
    """What is said of a server started in the background: where, which process, how to stop it."""
    return (f"started a torchscope server at {url} in the background (pid {pid}); it keeps running "
            f"after this ends: stop it with `kill {pid}`")

# close() waits for the disk while it takes events, and gives up after it has taken none for
# this long (an NFS server that stopped answering): the process must be able to exit
_STALL_S = 30.0
# A disk that refuses a write (full) holds the run's events in memory until it takes them again,
# at most this many (the oldest beyond are dropped, counted, and said in the file and on stderr)
_MAX_HELD_EVENTS = 20_000
_CHECK_FILE_S = 0.2  # how often the writer looks whether another program deleted or truncated the file

class ServerRefused(ValueError):
    """The server answered, with an error status (401: no or a wrong token).  ``deleted``: a
    410 marked so, a user deleted the run's session on the server (docs/server.md)."""

    def __init__(self, status: int, detail: str, deleted: bool = False) -> None:
        super().__init__(f"HTTP {status} {detail}")
        self.status, self.detail, self.deleted = status, detail, deleted

    @property
    def foreign(self) -> bool:
        """Whether another program answered: a torchscope server's errors are JSON (FastAPI's
        ``{"detail": ...}``), a web server's 404 an HTML page (QA 45c: printed raw)."""
        try:
            return not isinstance(json.loads(self.detail), dict)
        except ValueError:
            return True


# Series frames (docs/session-format.md) are written once this many steps wait for them, or
# when the oldest waited this long, or at close: each frame costs a header and its column
# names, so a frame per 0.25 s flush would nearly double the bytes of the step frames, while
# a reader decodes the steps not yet in a series frame itself (at most these few).
_SERIES_ROWS = 256
_SERIES_EVERY_S = 10.0


# Every socket the transport opened and that may still be open (a socket whose close() is
# deferred by a response still holding it counts too).  A forked child closes its copies.
_sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
# Held from a socket's creation to its registration, and by a fork: a fork between the two
# would leave the child a copy it does not know of (connected by the parent a moment later).
_sockets_lock = threading.Lock()


class _Connection(http.client.HTTPConnection):
    """Plain HTTP whose socket is registered in ``_sockets`` *before* it connects, so a fork
    at any point of a request still finds (and closes) the child's copy."""

    def connect(self) -> None:
        family, kind, proto, _, addr = socket.getaddrinfo(self.host, self.port, 0, socket.SOCK_STREAM)[0]
        with _sockets_lock:
            sock = socket.socket(family, kind, proto)
            _sockets.add(sock)
        self.sock = sock
        sock.settimeout(self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.connect(addr)


def _after_fork_in_child() -> None:
    """A DataLoader worker (or any fork) inherits the parent's sockets; close the child's
    copies at once, so a child never holds a connection to the server.  Closing a copy sends
    nothing: the parent's socket stays open and in use.  detach + os.close, not close(): a
    response being read holds a makefile() reference that would defer close() forever."""
    _sockets_lock.release()  # taken by the forking thread (see register_at_fork below)
    for sock in list(_sockets):
        with contextlib.suppress(OSError):
            fd = sock.detach()
            if fd >= 0:
                os.close(fd)
    _sockets.clear()


os.register_at_fork(
    before=_sockets_lock.acquire, after_in_parent=_sockets_lock.release, after_in_child=_after_fork_in_child
)


def _n_ops(graph: dict[str, Any]) -> int:
    ops = graph.get("ops")
    return len(ops) if isinstance(ops, (list, RawJSON)) else 0


class Transport:
    """Owns the session file and the connection of one rank.  ``emit`` from the training
    thread; everything else happens on the daemon thread."""

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
        if server and server_url(server) is None:
            # (watch() checks its URL; $TORCHSCOPE_SERVER came here unchecked before resolve_server)
            origin = "TORCHSCOPE_SERVER" if server == os.environ.get("TORCHSCOPE_SERVER") else "server"
            say(f"torchscope: {origin}={server!r} is not an http(s) URL; recording to the file only")
            server, autostart = None, False
        self.server = server.rstrip("/") if server else None
        self.token = token
        self.autostart = autostart
        self.flush_interval = flush_interval
        self.writer = SessionFileWriter(path)
        self.path = self.writer.path
        self.shed = 0  # ops of graph events dropped under back-pressure
        self.shed_graphs = 0
        self.sent_seq = 0  # next frame seq the server is known to expect
        self.server_ok: bool | None = None
        self.heartbeats = 0
        self._pid = os.getpid()
        self._queue: deque[dict[str, Any]] = deque()
        self._emitted = 0  # events accepted by emit (training thread only)
        self._written = 0  # events written to the file (daemon thread only)
        self._pending_graphs = 0
        self._pending_ops = 0
        self._lock = threading.Lock()  # guards the pending-graph counters
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._file_closed = threading.Event()
        self._closed = False
        self._backoff_until = 0.0
        self._backoff = 0.5
        self._last_contact = time.monotonic()
        self._series_since = time.monotonic()  # when the oldest step not in a series frame was written
        self._checked_file = time.monotonic()
        self._refused_since: float | None = None  # when the disk began refusing writes (None: it takes them)
        self._lost_events = 0  # events dropped while it refused them (beyond _MAX_HELD_EVENTS)
        self._lost_steps: list[int] = []  # the first and last step among them
        self._autostarted = False
        self._autostarted_at: float | None = None
        self._autostarted_proc: subprocess.Popen[bytes] | None = None
        self._close_deadline = 0.0  # when close() stops waiting for this thread
        self._answered = False  # a server has answered this run once: never start another
        self._refused: int | None = None  # the HTTP status of the server's last refusal
        self._foreign = False  # ... given by another program than a torchscope server
        self._warned: set[str] = set()
        # a user deleted this run's session on the server: nothing more is sent there (the
        # server would refuse it; it used to bring the session back, QA 51c); the file goes on
        self.deleted = False
        self._http: http.client.HTTPConnection | None = None
        self._thread = threading.Thread(target=self._run, name="torchscope-transport", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ training thread side
    def sheds(self, graph: dict[str, Any]) -> bool:
        """Whether ``emit(graph)`` would shed it now: its step event says so first.  Only the
        training thread adds pending graphs, so the answer holds until it emits it."""
        with self._lock:
            return self._over(_n_ops(graph))

    def _over(self, n_ops: int) -> bool:
        return self._pending_graphs >= _MAX_PENDING_GRAPHS or self._pending_ops + n_ops > _MAX_PENDING_OPS

    def emit(self, event: dict[str, Any]) -> None:
        """Queue one event; O(1), never blocks, never raises."""
        if self._closed or os.getpid() != self._pid:
            return
        if event.get("kind") == "graph":
            n_ops = _n_ops(event)
            with self._lock:
                if self._over(n_ops):
                    self.shed += n_ops
                    self.shed_graphs += 1
                    return
                self._pending_graphs += 1
                self._pending_ops += n_ops
                # the writer sleeps flush_interval between writes: a fast loop in full mode
                # filled the queue in that time and shed the graphs of a writer with time to spare
                wake = self._pending_graphs >= _MAX_PENDING_GRAPHS // 2
        else:
            # the run's first events (its session, step 0) are written at once, not after
            # flush_interval: a run killed in its first fraction of a second keeps them
            wake = self._emitted < 4
        self._emitted += 1
        self._queue.append(event)
        if wake:
            self._wake.set()

    def record_source(self, path: str) -> None:
        """Queue the recording of the run's script at ``path`` (``_source``): read and written by
        the thread, in a frame of its own, where it meets this marker -- after the session event
        emitted before it.  O(1), as ``emit``."""
        self.emit({"kind": _SOURCE_MARK, "path": path})

    def flush(self, timeout: float = 5.0) -> bool:
        """Ask the thread to write now; wait until everything emitted so far is in the file.
        Returns False if that did not happen within ``timeout``."""
        if os.getpid() != self._pid or self._closed:
            return self._file_closed.is_set()
        target = self._emitted
        deadline = time.monotonic() + timeout
        self._wake.set()
        while self._written < target or self.writer.held is not None:  # (held: the disk refused it)
            if time.monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(0.005)
        return True

    def close(self, end_event: dict[str, Any] | None = None, timeout: float = 5.0, patient: bool = False) -> None:
        """Write the remaining events (and ``end_event``) and close the file, then give the
        server at most the rest of ``timeout`` (``_BOOTING_WAIT_S`` while a server this run
        started has not answered yet).  Idempotent; returns within that time -- ``patient``:
        longer while a backlog is being written (``_wait_for_file``).  Called again
        while a first call is under way (a SIGTERM handler inside it), it waits for the file
        the first call is completing: the process may die right after."""
        if os.getpid() != self._pid:
            return
        if self._closed:
            self._file_closed.wait(timeout)
            return
        if end_event is not None:
            # ops the capture itself dropped (its own count, if any) plus those shed here
            prior = end_event.get("shed_ops")
            end_event["shed_ops"] = (prior if isinstance(prior, int) else 0) + self.shed
            self._queue.append(end_event)
        self._closed = True
        if self.server_ok is not True and self._autostart_grace():
            # the server this run started is still booting (a script shorter than its imports):
            # the end of the run waits for it a little longer, else it would never see the run
            timeout = max(timeout, _BOOTING_WAIT_S)
        deadline = time.monotonic() + timeout
        self._close_deadline = deadline
        self._stop.set()
        self._wake.set()
        # the thread closes the file before its last send, so waiting for that is enough for
        # a complete file; the send gets whatever time is left
        if patient:
            self._wait_for_file(timeout)
        else:
            self._file_closed.wait(timeout)
        self._thread.join(max(0.0, deadline - time.monotonic()))

    def _wait_for_file(self, timeout: float) -> None:
        """Wait for the thread to close the file: ``timeout``, and then on while the disk takes
        events, until it has taken none for ``_STALL_S``.  A disk that stalled during the run
        leaves a backlog (QA 51a: a 30 s stall at step 5,000 of 20,000 left 15,000 events queued;
        close() returned after 5 s, the process exited, and the file ended at step 4,757 --
        read as a run killed there).  Both the wait and giving up are said."""
        if self._file_closed.wait(timeout):
            return
        say(f"torchscope: writing the last {self._emitted - self._written:,} events of this run to {self.path} "
            "(the disk is slow) ...")
        taken, since = self._written, time.monotonic()
        while not self._file_closed.wait(0.25) and self._thread.is_alive():
            if self._written != taken:
                taken, since = self._written, time.monotonic()
            elif time.monotonic() - since > _STALL_S:
                say(f"torchscope: gave up writing to {self.path}: the disk took nothing for {_STALL_S:.0f} s, and "
                    f"the file lacks the last {self._emitted - self._written:,} events of this run (it reads as a "
                    "run killed there)")
                return

    # ------------------------------------------------------------------ background thread
    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            try:
                self._write_pending(final=stopping)
                while stopping and self.writer.held is not None and time.monotonic() < self._close_deadline - 1.0:
                    time.sleep(0.25)  # the disk refuses the end of the run: a moment for it to take it
                    self._write_pending(final=True)
                if stopping and self.writer.held is not None:
                    self._untold_loss()
            except Exception as exc:  # a full disk must not kill the thread: keep sending
                self._warn_once("write", f"torchscope: cannot write {self.path} ({exc}); recording incomplete")
            if stopping:
                with contextlib.suppress(OSError):  # fsync on a full disk: the bytes are written
                    self.writer.close()
                self._file_closed.set()
            sending = bool(self.server) and not self.deleted
            try:
                if sending:
                    self._send_pending(final=stopping)
            except Exception as exc:  # never let the thread die silently; keep the file going
                self._warn_once("send", f"torchscope: transport error ({exc!r}); recording continues")
            if stopping:
                if sending and self.sent_seq < self.writer.seq:
                    self._await_booting_server()
                if sending and not self.deleted and self.sent_seq < self.writer.seq:
                    self._untold_end()
                self.writer.release()
                return
            self._wake.wait(self.flush_interval)
            self._wake.clear()

    def _write_pending(self, final: bool = False) -> None:
        now = time.monotonic()
        if final or now - self._checked_file >= _CHECK_FILE_S:
            self._checked_file = now
            self._check_file()
        try:
            if self.writer.held is not None:
                self.writer.write_held()  # the frame the disk refused last time, with its seq
                self._disk_back()
            self._write_queue(final)
        except OSError as exc:
            # the disk refused a frame (full): the writer holds it, the queue keeps the rest,
            # and both are written once the disk takes writes again
            self._disk_refused(exc)

    def _check_file(self) -> None:
        """Another program deleted or truncated the file during the run: the writer writes it
        again (``SessionFileWriter.check``), and that is said, once each time."""
        try:
            line = self.writer.check()
        except OSError:
            return
        if line:
            self.path = self.writer.path
            say(line)
            log.warning(line)

    def _disk_refused(self, exc: OSError) -> None:
        if self._refused_since is None:
            self._refused_since = time.monotonic()
        self._warn_once("write", f"torchscope: cannot write {self.path} ({exc.strerror or exc}); training continues, "
                                 "this run's events wait in memory until the disk takes them")
        # bounded: beyond _MAX_HELD_EVENTS the oldest are dropped (counted, and said once written again)
        while len(self._queue) > _MAX_HELD_EVENTS:
            ev = self._queue.popleft()
            self._written += 1
            self._lost_events += 1
            if ev.get("kind") == "graph":
                with self._lock:
                    self._pending_graphs -= 1
                    self._pending_ops -= _n_ops(ev)
            step = ev.get("step")
            if ev.get("kind") == "step" and isinstance(step, int):
                self._lost_steps = [self._lost_steps[0] if self._lost_steps else step, step]

    def _disk_back(self) -> None:
        """The disk took the held frame: said, with what could not be held (also in the file)."""
        since, self._refused_since = self._refused_since, None
        if since is None:
            return
        self._warned.discard("write")  # a later refusal is said again
        lost = ""
        if self._lost_events:
            steps = self._lost_steps
            which = f" (steps {steps[0]}-{steps[1]})" if steps else ""
            lost = f"{self._lost_events:,} events{which} could not wait in memory and are lost"
            self._lost_events, self._lost_steps = 0, []
            self._append([{"kind": "log", "t": time.time(), "level": "warning",
                           "message": f"torchscope: the disk refused writes for {time.monotonic() - since:.1f} s: {lost}"}])
        say(f"torchscope: {self.path}: the disk takes writes again after {time.monotonic() - since:.1f} s; recording "
            f"resumes, {lost + ' (said in the file)' if lost else 'nothing lost'}")

    def _untold_loss(self) -> None:
        """The run ended while the disk refused its last frames: the file ends at the last frame
        it took, as a killed run's does; said in one line."""
        held = self.writer.held
        if held is None:
            return
        info = parse_frame_header(held)
        missing = info.n_events + len(self._queue) + self._lost_events
        step = f" (from step {info.step_lo} on)" if info.step_lo >= 0 else ""
        say(f"torchscope: the disk refused the end of this run: {self.path} lacks its last {missing:,} events{step}, "
            "and reads as a run that ended unexpectedly there")

    def _write_queue(self, final: bool) -> None:
        batch: list[dict[str, Any]] = []
        while self._queue:
            ev = self._queue.popleft()
            kind = ev.get("kind")
            if kind == _SOURCE_MARK:
                if batch:  # the session event goes first, in its frame
                    self._append(batch)
                    batch = []
                self._append_source(str(ev.get("path")))
                continue
            if kind != "graph":
                batch.append(ev)
                continue
            # graph events get frames of their own so readers can seek to them by step
            if batch:
                self._append(batch)
                batch = []
            ops = ev.get("ops")
            try:
                self._append([ev])
            finally:
                with self._lock:
                    self._pending_graphs -= 1
                    self._pending_ops -= len(ops) if isinstance(ops, (list, RawJSON)) else 0
        if batch:
            self._append(batch)
        self._write_series(final)

    def _append_source(self, path: str) -> None:
        """The script's text in a frame of its own (so ``step(n)`` never decodes it, and a reader
        finds it among the frames without a step); a script that cannot be read is left out,
        unsaid: it is a convenience for the doctor, never a reason to disturb the run."""
        try:
            ev = source_event(path)
        except Exception:  # (source_event catches OSError; anything else stays here too)
            ev = None
        if ev is None:
            self._written += 1  # the marker, as flush() counts it
            return
        self._append([ev])

    def _write_series(self, final: bool) -> None:
        """The whole-run series of the steps written so far (frames that spare readers the step
        events), when enough steps wait for them (``_SERIES_ROWS``)."""
        now = time.monotonic()
        pending = self.writer.series_pending
        if not pending:
            self._series_since = now
        elif final or pending >= _SERIES_ROWS or now - self._series_since >= _SERIES_EVERY_S:
            self.writer.append_series()
            self._series_since = now

    def _append(self, events: list[dict[str, Any]]) -> None:
        try:
            try:
                self.writer.append(events)
            except (TypeError, ValueError):
                # an event JSON cannot hold (a value the capture did not foresee): that event is
                # dropped and said once, the others of its frame are written
                good = [e for e in events if _encodable(e)]
                bad = sorted({str(e.get("kind")) for e in events if not _encodable(e)})
                self._warn_once("encode", f"torchscope: dropped {', '.join(bad)} events that JSON cannot hold; "
                                          "recording continues")
                if good:
                    self.writer.append(good)
        finally:
            # counted even when the write failed: flush() waits for the attempt, not success
            self._written += len(events)

    # ------------------------------------------------------------------ wire
    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/x-tscope-frames"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def _path(self, tail: str) -> str:
        base = urllib.parse.urlsplit(self.server or "").path.rstrip("/")
        return f"{base}/api/ingest/{self.session_id}/{self.rank}{tail}"

    def _connection(self) -> http.client.HTTPConnection:
        if self._http is None:
            u = urllib.parse.urlsplit(self.server or "")
            cls = http.client.HTTPSConnection if u.scheme == "https" else _Connection
            self._http = cls(u.hostname or "127.0.0.1", u.port, timeout=_HTTP_TIMEOUT)
        return self._http

    def _drop_connection(self) -> None:
        if self._http is not None:
            with contextlib.suppress(Exception):
                self._http.close()
            self._http = None

    def _request(self, tail: str, data: bytes | None = None) -> dict[str, Any]:
        """One request on the kept-alive connection.  A reused connection the server has
        closed meanwhile (its keep-alive timeout) gets one retry on a fresh one."""
        for attempt in (0, 1):
            reused = self._http is not None
            conn = self._connection()
            try:
                conn.request("POST" if data else "GET", self._path(tail), body=data, headers=self._headers())
                resp = conn.getresponse()
                body = resp.read()
                break
            except (OSError, http.client.HTTPException):
                self._drop_connection()
                if not reused or attempt:
                    raise
        if resp.will_close:
            self._drop_connection()
        if resp.status != 409 and not 200 <= resp.status < 300:  # 409: the server says which seq it expects
            detail = body[:300].decode("utf-8", "replace").strip()
            raise ServerRefused(resp.status, detail, deleted=resp.status == 410 and _says_deleted(body))
        self._last_contact = time.monotonic()
        return dict(json.loads(body or b"{}"))

    def _send_pending(self, final: bool) -> None:
        now = time.monotonic()
        if now < self._backoff_until and not final:
            return
        written = self.writer.seq
        if self.server_ok is True and self.sent_seq >= written and now - self._last_contact < _HEARTBEAT_S:
            return  # nothing to send and the server heard from us recently
        try:
            if self.server_ok is not True or self.sent_seq >= written:
                # (re)connect, or the idle heartbeat: the server says where it stands
                self.sent_seq = self._next_seq(written)
                if self.server_ok is True:
                    self.heartbeats += 1
            deadline = time.monotonic() + (_FINAL_SEND_S if final else 1.0)
            while self.sent_seq < written and time.monotonic() < deadline:
                if self._stop.is_set() and not final:
                    break  # close() is waiting: write and close the file first
                chunk = self._chunk(self.sent_seq)
                reply = self._request("", chunk)
                self.sent_seq = int(reply.get("next_seq", self.sent_seq))
            self.server_ok = True
            self._answered = True
            self._backoff = 0.5
            if "server" in self._warned:  # said "not reachable": the user is told it is over (QA 37d)
                self._warned.discard("server")  # a later outage is said again
                say(f"torchscope: server {self.server} reachable again; the run streams to it, with the steps it missed")
        except _NET_ERRORS as exc:
            self.server_ok = False
            refused = exc if isinstance(exc, ServerRefused) else None
            if refused is not None and refused.deleted:
                self._stop_sending()
                return
            self._refused = refused.status if refused is not None else None
            self._foreign = refused is not None and refused.foreign
            started_now = refused is None and self._maybe_autostart()  # a server that answered is there
            self._backoff_until = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, 10.0)
            if started_now or (refused is None and self._autostart_grace()):
                return  # a server we just started is still booting: no alarm yet
            if refused is None and (code := self._autostart_exit()) is not None:
                # (a server is started for a loopback URL with a port only: local_port)
                why = (f"not reachable: the server started for it exited (status {code}; "
                       f"`torchscope serve --port {local_port(self.server or '')}` says why)")
            elif refused is None:
                why = f"not reachable ({exc.__class__.__name__})"
            elif refused.status == 401:
                why = WRONG_TOKEN if self.token else NEEDS_TOKEN
            elif refused.foreign:
                why = f"is another program, not a torchscope server (it answered HTTP {refused.status})"
            else:
                why = f"refused the run (HTTP {refused.status}: {refused.detail[:120]})"
            self._warn_once("server", f"torchscope: server {self.server} {why}; training continues, recording to {self.path}")

    def _stop_sending(self) -> None:
        """The server says a user deleted this run's session: sending more would be refused
        (before, it re-created the session from the file, QA 51c), so nothing more is sent,
        heartbeats included; the file is written as before.  Said once."""
        self.deleted = True
        self._drop_connection()
        self._warn_once("deleted", f"torchscope: session {self.session_id} was deleted on the server {self.server}: "
                                   f"this run is no longer sent there; training continues, recording to {self.path}")

    def _await_booting_server(self) -> None:
        """A script shorter than a server's start (its imports take seconds): the server this
        run started is given what is left of close()'s time to answer, and then the whole run."""
        while (self.server_ok is not True and not self.deleted and self._autostart_grace()
               and time.monotonic() < self._close_deadline - 0.2):
            time.sleep(0.1)
            try:
                self._send_pending(final=True)
            except Exception:  # (as in _run: never out of this thread) the line below says what is missing
                return

    def _untold_end(self) -> None:
        """The run ended with frames the server never got (it was down, or stopped): there it
        stays a run that "ended unexpectedly" until the file is imported, which fills it in."""
        missing = self.writer.seq - self.sent_seq
        where = f"the server {self.server}"
        if self._answered:
            what = f"{where} did not get the end of this run ({missing} frame{'s' if missing != 1 else ''})"
        elif self._refused is not None:  # it answered, with a refusal (said when it came)
            what = f"{where} refused this run"
        else:
            what = f"{where} never answered"
        url = urllib.parse.urlsplit(self.server or "")
        if local_port(self.server or "") is not None:
            port = f" --port {url.port}" if url.port and url.port != urllib.parse.urlsplit(DEFAULT_SERVER).port else ""
            fix = f"torchscope open {self.path}{port} shows the whole run there"
        else:
            fix = f"import {self.path} on its sessions page to see the whole run there"
        if self._refused == 401:
            fix = f"with TORCHSCOPE_TOKEN set to its token, {fix}"
        if self._foreign:  # no torchscope server can start on that port while the program holds it
            what = f"{where} is another program, not a torchscope server"
            fix = f"torchscope open {self.path} --port N, with a free port N, starts one there and shows the whole run"
        held = "the file is complete" if self.writer.held is None else "the file holds what the disk took"
        say(f"torchscope: {what}; {held}: {fix}")

    def _next_seq(self, have: int) -> int:
        seq = int(self._request("/next").get("next_seq", 0))
        if seq > have:
            # the server holds more frames under this id than this run wrote: another run
            # reused the session id; say so once instead of silently sending nothing
            self._warn_once(
                "seq",
                f"torchscope: server already has session {self.session_id} rank {self.rank} "
                f"with {seq} frames; this run's frames may not show there",
            )
        return seq

    def _chunk(self, start: int) -> bytes:
        out: list[bytes] = []
        size = 0
        with self.writer.reading() as f:
            for offset, n in self.writer.spans(start):
                if out and size + n > _MAX_POST_BYTES:
                    break
                f.seek(offset)
                out.append(f.read(n))
                size += n
        return b"".join(out)

    def _autostart_grace(self) -> bool:
        """True while a server started by this run may still be booting (imports take seconds);
        False once it has exited (another server holds its data directory, its port is taken)."""
        return (self._autostarted_at is not None and time.monotonic() - self._autostarted_at < _AUTOSTART_GRACE_S
                and self._autostart_exit() is None)

    def _autostart_exit(self) -> int | None:
        """The exit status of the server this run started, None while it runs (or none was)."""
        return self._autostarted_proc.poll() if self._autostarted_proc is not None else None

    def _maybe_autostart(self) -> bool:
        """Start `torchscope serve` in its own process session, once, and only while no server
        has answered this run; it outlives the script.  A server that answered and went away
        is being restarted (or stopped) by the user: one started here would take its port
        with another data directory, so the run keeps retrying and the file keeps every frame.

        Returns True when it started one now."""
        if not self.autostart or self._autostarted or self._answered or not self.server:
            return False
        self._autostarted = True
        port = local_port(self.server)
        if port is None:  # another machine's address: a server started here would not answer there
            return False
        cmd = [sys.executable, "-m", "torchscope.server.cli", "serve", "--port", str(port), "--quiet"]
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "TORCHSCOPE_AUTOSTARTED": "1"},
            )
            self._backoff = 0.25
            self._autostarted_at = time.monotonic()
            self._autostarted_proc = proc
            say(f"torchscope: no server answered at {self.server}; {started_line(self.server, proc.pid)}")
            return True
        except OSError as exc:
            self._warn_once("autostart", f"torchscope: could not start a server ({exc}); recording to the file only")
            return False

    def _warn_once(self, key: str, message: str) -> None:
        """One line per kind of trouble, on stderr (the user's console) and the logger."""
        if key not in self._warned:
            self._warned.add(key)
            # an answer from some other web server (an HTML error page) is not pasted in whole
            message = " ".join(message.split())
            message = message if len(message) <= 300 else message[:297] + "..."
            say(message)
            log.warning(message)


def _says_deleted(body: bytes) -> bool:
    """Whether a 410's body is a torchscope server's "this session was deleted" (its other 410,
    a rank that has ended, is backed off from and retried as any refusal)."""
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and answer.get("deleted") is True


def _encodable(event: dict[str, Any]) -> bool:
    try:
        dumps_event(event)
    except (TypeError, ValueError):
        return False
    return True
