"""All SQL lives here.  SQLite in WAL mode: ONE writer thread owns the only write
connection and is fed by a queue (as Datasette's database.py does), so writes never race
and batches of ingest commit together; readers use their own connection per thread.

Tables
- ``sessions``: one row per session id (name, tags, model, times; rank 0's session event);
  ``labeled`` 1 once a name or tags were given to it (a PATCH, a downloaded file's labels): its
  downloads carry them from then on, renamed back to the recorded ones too (server/labels.py).
- ``ranks``: per (session, rank): next expected frame seq, last contact, end status.
- ``frames``: raw frames exactly as received, keyed (session, rank, seq): export is the file.
- ``steps``: derived, one row per StepEvent with the scalar columns of
  ``torchscope.series.step_summary`` plus the event JSON and its memory/grads parts -- the
  event stored without them (``_SPLIT``; put back by ``steps_json``): kept twice, they were over
  a third of the store's bytes (rows stored before keep them in the event too).
- ``graphs``: the graph index (session, rank, step, micro) -> frame seq, so ``/graph``
  decodes exactly one frame.
- ``diagnostics``: doctor findings cached by the frame count they were computed on (the
  rank's ``next_seq`` then): fewer than the rank has now means stale (``undiagnosed``).
- ``deleted``: the ids of sessions deleted by a user, so that a run still streaming does not
  bring its session back (``SessionDeleted``); an import of its file lifts it.

A PostgreSQL store would be a second implementation of this class's methods; nothing
outside this module writes SQL.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import math
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pydantic_core

from torchscope.schema import END_STATUSES, SCHEMA_VERSION
from torchscope.series import check_columns, columns, concat, memory_series, metric_rows, metric_series
from torchscope.sessionfile import FRAME_HEADER_SIZE, series_part

from .frames import Frame

T = TypeVar("T")
log = logging.getLogger("torchscope.server")

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    name TEXT,
    tags TEXT NOT NULL DEFAULT '[]',
    model TEXT,
    started_at REAL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    meta TEXT,
    labeled INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS ranks (
    session_id TEXT NOT NULL,
    rank INTEGER NOT NULL,
    next_seq INTEGER NOT NULL DEFAULT 0,
    last_seen REAL NOT NULL,
    end_status TEXT,
    steps INTEGER NOT NULL DEFAULT 0,
    graphs INTEGER NOT NULL DEFAULT 0,
    events INTEGER NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0,
    version_major INTEGER NOT NULL DEFAULT 1,
    version_minor INTEGER NOT NULL DEFAULT 0,
    meta TEXT,
    PRIMARY KEY (session_id, rank)
);
CREATE TABLE IF NOT EXISTS frames (
    session_id TEXT NOT NULL,
    rank INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (session_id, rank, seq)
);
CREATE TABLE IF NOT EXISTS steps (
    session_id TEXT NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    t REAL, duration_us INTEGER, forward_us INTEGER, backward_us INTEGER, loss REAL,
    live INTEGER, peak INTEGER, allocated INTEGER, reserved INTEGER, grad_norm REAL,
    graph_signature TEXT,
    -- nonfinite_losses, lr and the m_<key> columns of MEMORY_KEYS are added by _add_missing_columns
    event TEXT NOT NULL,
    memory TEXT,
    grads TEXT,
    PRIMARY KEY (session_id, rank, step)
);
CREATE TABLE IF NOT EXISTS graphs (
    session_id TEXT NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    micro INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    ops INTEGER NOT NULL,
    nodes INTEGER NOT NULL,
    PRIMARY KEY (session_id, rank, step, micro)
);
CREATE TABLE IF NOT EXISTS memory_chunks (
    session_id TEXT NOT NULL,
    rank INTEGER NOT NULL,
    seq INTEGER NOT NULL,  -- last frame of the ingest batch the chunk was built from
    cols TEXT NOT NULL,  -- JSON array: per /memory column, that batch's values as JSON text sans brackets
    PRIMARY KEY (session_id, rank, seq)
);
-- the numbers of torchscope.log() (LogEvent.metrics): a logged name's value at a step, the last
-- logged; a NaN or infinity in `nonfinite` ("NaN", "Infinity", "-Infinity"), as SQLite keeps no NaN
CREATE TABLE IF NOT EXISTS metrics (
    session_id TEXT NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    name TEXT NOT NULL,
    value REAL,
    nonfinite TEXT,
    PRIMARY KEY (session_id, rank, name, step)
);
-- sessions a user deleted: live ingest of them is refused (a running training's next frames,
-- or its transport's rewind and resend from its file, re-created the whole session: QA 51c);
-- an import of the run's file, an explicit act, lifts the entry
CREATE TABLE IF NOT EXISTS deleted (
    session_id TEXT PRIMARY KEY,
    deleted_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS diagnostics (
    session_id TEXT NOT NULL,
    rank INTEGER NOT NULL,
    frames INTEGER NOT NULL,
    findings TEXT NOT NULL,
    errors INTEGER NOT NULL,
    warnings INTEGER NOT NULL,
    PRIMARY KEY (session_id, rank)
);
"""

_STEP_COLS = ("t", "duration_us", "forward_us", "backward_us", "loss", "live", "peak", "allocated",
              "reserved", "grad_norm", "graph_signature")
# The /memory columns, named as torchscope.series.memory_series names them; each step row keeps
# its value of every one (m_<name>), so the whole series is one index scan, no JSON decoding.
MEMORY_KEYS = tuple(k for k in memory_series([]) if k not in ("step", "t"))
_MEMORY_COLS = tuple(f"m_{k}" for k in MEMORY_KEYS)


class _Job(NamedTuple):
    fn: Callable[[sqlite3.Connection], Any]
    fut: Future[Any]
    attach: Path | None


class NotFound(LookupError):
    pass


# A rank (``ranks r``) whose writer went silent without an end event, last heard of before ?
_SILENT = "r.end_status IS NULL AND r.last_seen < ?"


class StoreClosed(RuntimeError):
    pass


class RunConflict(ValueError):
    """Frames that cannot join the rank stored under their session id: another run's (its
    stored frames differ, or it ended and these go on after its end).  The message is one line."""


class SessionDeleted(LookupError):
    """Live frames (or a heartbeat) of a session a user deleted.  The message is one line."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id} was deleted on this server: its run's frames are not stored "
                         "again (importing its file brings it back)")


def _refuse_deleted(c: sqlite3.Connection, session_id: str) -> None:
    """Raise ``SessionDeleted`` when a user deleted ``session_id`` (asked only of a rank the
    store does not hold: deleting removes every rank, and only an import, which lifts the
    entry, makes one again)."""
    if c.execute("SELECT 1 FROM deleted WHERE session_id=?", (session_id,)).fetchone() is not None:
        raise SessionDeleted(session_id)


WRITER_DEAD = "the store's writer stopped (see the server's log): restart the server"


class DiskFull(OSError):
    """A write the store (or an import's scratch files) could not make for lack of space; the
    message is one line, "the server's disk is full: ...", for a 507."""


_SQLITE_FULL = 13  # SQLITE_FULL, sqlite3.OperationalError.sqlite_errorcode & 0xff


def disk_full(exc: BaseException, where: Path | str) -> DiskFull | None:
    """``exc`` as a ``DiskFull`` naming ``where`` when it says the disk is full (SQLite's
    SQLITE_FULL, an OSError ENOSPC or EDQUOT), else None."""
    if isinstance(exc, DiskFull):
        return exc
    full = False
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        full = (code is not None and code & 0xFF == _SQLITE_FULL) or "disk is full" in str(exc)
    elif isinstance(exc, OSError):
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if not full:
        return None
    err = DiskFull(f"the server's disk is full: no space left for {where}")
    err.errno = errno.ENOSPC
    return err


@dataclass
class IngestResult:
    next_seq: int
    stored: list[Frame] = field(default_factory=list)
    gap: bool = False  # a frame's seq was beyond next_seq: the client must rewind
    created: bool = False  # first frames of this session
    # a stored step's loss (or a micro-batch's) or gradient is NaN/Inf: the server has a live
    # rank diagnosed at once (the sessions list shows the error while the run goes on)
    nonfinite: bool = False
    ended: bool = False  # a live rank whose end was stored before (its writer's last series frames)


# the non-finite floats as api_json writes them (into the stored step events too)
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _metric_value(value: float | None) -> tuple[float | None, str | None]:
    """A metric as the ``value, nonfinite`` columns keep it."""
    if value is None or math.isfinite(value):
        return value, None
    return None, "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def api_json(obj: Any) -> bytes:
    """JSON for browsers: NaN/Infinity (real in a diverging run) become the strings
    "NaN"/"Infinity"/"-Infinity", which JSON.parse accepts and the dashboard can show."""
    return pydantic_core.to_json(obj, inf_nan_mode="strings")


class Store:
    def __init__(self, path: Path, read_only: bool = False) -> None:
        """``read_only``: readers only (the doctor's child process); no writer thread."""
        self.path = Path(path)
        self._local = threading.local()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._closed = read_only
        if read_only:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        wconn = self._connect()
        wconn.execute("PRAGMA journal_mode=WAL")
        wconn.executescript(SCHEMA_SQL)
        _add_missing_columns(wconn)
        wconn.commit()
        self._writer = threading.Thread(target=self._write_loop, args=(wconn,), name="torchscope-store",
                                         daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ connections
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across app crashes
        conn.execute("PRAGMA foreign_keys=OFF")
        return conn

    def _read(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only=ON")
            self._local.conn = conn
        return conn

    def close(self) -> None:
        if not hasattr(self, "_writer"):
            return
        self._closed = True
        self._jobs.put(None)
        self._writer.join(10)
        self._fail_pending()

    def _fail_pending(self) -> None:
        # a job queued after the writer stopped must not leave its caller waiting forever
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None and not job.fut.cancelled():
                with contextlib.suppress(InvalidStateError):
                    job.fut.set_exception(StoreClosed("the store is closed" if self._closed else WRITER_DEAD))

    # ------------------------------------------------------------------ the writer thread
    def write(self, fn: Callable[[sqlite3.Connection], T], attach: Path | None = None) -> Future[T]:
        """Run ``fn`` on the write connection, in a transaction.  ``attach``: a database file
        ``fn`` reads as schema ``staged`` (SQLite attaches only outside a transaction, so such
        a job runs in a transaction of its own)."""
        fut: Future[T] = Future()
        if self._closed:
            fut.set_exception(StoreClosed("the store is closed"))
            return fut
        if not self._writer.is_alive():  # it never should stop: no caller may wait on it forever
            fut.set_exception(StoreClosed(WRITER_DEAD))
            return fut
        self._jobs.put(_Job(fn, fut, attach))
        if self._closed or not self._writer.is_alive():  # closed meanwhile: the writer may be gone already
            self._fail_pending()
        return fut

    @property
    def writer_alive(self) -> bool:
        """Whether the writer thread runs (a read-only store has none: False)."""
        return hasattr(self, "_writer") and self._writer.is_alive()

    def _write_loop(self, conn: sqlite3.Connection) -> None:
        try:
            self._serve_writes(conn)
        except BaseException:
            # never meant to happen: /api/health says so, and no write waits on a dead writer
            log.critical("torchscope: the store's writer stopped", exc_info=True)
            self._fail_pending()

    def _serve_writes(self, conn: sqlite3.Connection) -> None:
        carried: _Job | None = None  # a job with an attachment, taken while batching others
        while True:
            job = carried or self._jobs.get()
            carried = None
            if job is None:
                # the WAL folded into the database and emptied now: the last connection's close
                # would do it, but uvicorn re-raises a SIGTERM after its shutdown with the default
                # action, which ends the process with the readers' connections open -- the WAL
                # stayed at its high-water size (QA 51a: 389 MB beside a 431 MB store)
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                conn.close()
                return
            batch = [job]
            # Commit whatever is already queued in one transaction: ingest from many ranks
            # costs one fsync-free WAL commit per batch, not per request.
            while len(batch) < 64 and job.attach is None:
                try:
                    nxt = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._jobs.put(None)
                    break
                if nxt.attach is not None:
                    carried = nxt
                    break
                batch.append(nxt)
            try:
                results = self._run_attached(conn, batch, job.attach)
            except BaseException as exc:  # noqa: BLE001 - the batch as a whole failed (disk full at COMMIT...)
                # nothing of it is stored: each of its callers gets the error, and the writer
                # goes on with the next batch (the disk may have room again by then)
                failed: BaseException = disk_full(exc, self.path.parent) or exc
                if failed is exc:
                    log.error("torchscope: a write to the store failed: %s", exc)
                results = [(j.fut, None, failed) for j in batch]
                conn = self._recover(conn)
            for fut, res, err in results:
                if fut.cancelled():  # its request went away (asyncio.wrap_future cancels it)
                    continue
                with contextlib.suppress(InvalidStateError):  # cancelled meanwhile
                    if err is not None:
                        fut.set_exception(disk_full(err, self.path.parent) or err)
                    else:
                        fut.set_result(res)

    def _run_attached(self, conn: sqlite3.Connection, batch: list[_Job],
                      attach: Path | None) -> list[tuple[Future[Any], Any, BaseException | None]]:
        if attach is None:
            return self._run_batch(conn, batch)
        # its name as bytes: SQL text is UTF-8, and a data directory's path need not be (QA 53b:
        # every import into --data /srv/d<0xff> failed, UnicodeEncodeError, 500)
        conn.execute("ATTACH DATABASE ? AS staged", (os.fsencode(attach),))
        try:
            return self._run_batch(conn, batch)
        finally:
            conn.execute("DETACH DATABASE staged")

    def _recover(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        """The write connection after a failed batch: its transaction rolled back and any
        attachment gone; a fresh connection when it cannot be made so."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if any(row[1] == "staged" for row in conn.execute("PRAGMA database_list")):
                conn.execute("DETACH DATABASE staged")
            return conn
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            while True:  # the next batch needs a connection; the disk may hold the way
                try:
                    return self._connect()
                except sqlite3.Error as exc:
                    log.error("torchscope: cannot reopen the store (%s); retrying", exc)
                    time.sleep(1.0)

    @staticmethod
    def _run_batch(conn: sqlite3.Connection, batch: list[_Job]) -> list[tuple[Future[Any], Any, BaseException | None]]:
        """The batch in one transaction, each job in a savepoint: a job's own error goes to its
        caller alone.  Anything else (BEGIN or COMMIT failing, a savepoint that cannot be rolled
        back) rolls the whole transaction back and raises."""
        results: list[tuple[Future[Any], Any, BaseException | None]] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for fn, fut, _ in batch:
                conn.execute("SAVEPOINT job")
                try:
                    results.append((fut, fn(conn), None))
                    conn.execute("RELEASE job")
                except BaseException as exc:  # the job's own error goes to its caller
                    try:
                        conn.execute("ROLLBACK TO job")
                        conn.execute("RELEASE job")
                    except sqlite3.Error:  # SQLite rolled the transaction back itself (SQLITE_FULL)
                        raise exc from None
                    results.append((fut, None, exc))
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            raise
        return results

    # ------------------------------------------------------------------ writes
    def ingest(self, session_id: str, rank: int, frames: list[Frame], *, imported: bool = False,
               version: tuple[int, int] | None = None) -> Future[IngestResult]:
        return self.write(lambda c: _ingest(c, session_id, rank, frames, imported, version))

    def commit_staged(self, staged: StagedImport, writing: bool = False) -> Future[IngestResult | None]:
        """Copy a staged import into the store in one transaction (SQL only: no event is
        decoded again).  None when its rank was stored meanwhile (another import or a live
        run): the caller then ingests the file's frames as any other.  ``writing``: the file's
        run still writes it, so the rank is heard from now (it reads "running" from the moment
        it is listed, not "ended unexpectedly" until the import's caller touches it)."""
        staged.close()
        return self.write(lambda c: _commit_staged(c, staged.session_id, staged.rank, writing), attach=staged.path)

    def touch(self, session_id: str, rank: int) -> Future[int]:
        """The transport's heartbeat: record contact, answer the next expected seq."""

        def fn(c: sqlite3.Connection) -> int:
            now = time.time()
            row = c.execute("SELECT next_seq FROM ranks WHERE session_id=? AND rank=?",
                            (session_id, rank)).fetchone()
            if row is None:
                _refuse_deleted(c, session_id)
                return 0
            c.execute("UPDATE ranks SET last_seen=? WHERE session_id=? AND rank=?", (now, session_id, rank))
            c.execute("UPDATE sessions SET updated_at=? WHERE id=?", (now, session_id))
            return int(row[0])

        return self.write(fn)

    def update(self, session_id: str, name: str | None, tags: list[str] | None) -> Future[bool]:
        def fn(c: sqlite3.Connection) -> bool:
            if c.execute("SELECT 1 FROM sessions WHERE id=?", (session_id,)).fetchone() is None:
                return False
            if name is not None:
                c.execute("UPDATE sessions SET name=? WHERE id=?", (name, session_id))
            if tags is not None:
                c.execute("UPDATE sessions SET tags=? WHERE id=?", (_dumps(tags), session_id))
            if name is not None or tags is not None:  # given (a PATCH, a file's labels): its downloads say them
                c.execute("UPDATE sessions SET labeled=1 WHERE id=?", (session_id,))
            return True

        return self.write(fn)

    def delete(self, session_id: str) -> Future[bool]:
        def fn(c: sqlite3.Connection) -> bool:
            found = c.execute("DELETE FROM sessions WHERE id=?", (session_id,)).rowcount > 0
            if found:  # its run may still be streaming: it must not bring the session back
                c.execute("INSERT OR REPLACE INTO deleted VALUES (?,?)", (session_id, time.time()))
            for table in ("ranks", "frames", "steps", "graphs", "memory_chunks", "metrics", "diagnostics"):
                c.execute(f"DELETE FROM {table} WHERE session_id=?", (session_id,))  # noqa: S608
            return found

        return self.write(fn)

    def put_diagnostics(self, session_id: str, rank: int, frames: int, findings: list[dict[str, Any]]) -> Future[None]:
        errors = sum(1 for f in findings if f.get("severity") == "error")
        warnings = sum(1 for f in findings if f.get("severity") == "warning")

        def fn(c: sqlite3.Connection) -> None:
            if c.execute("SELECT 1 FROM sessions WHERE id=?", (session_id,)).fetchone() is None:
                return
            c.execute("INSERT OR REPLACE INTO diagnostics VALUES (?,?,?,?,?,?)",
                      (session_id, rank, frames, _dumps(findings), errors, warnings))

        return self.write(fn)

    # ------------------------------------------------------------------ reads
    def sessions(self) -> list[dict[str, Any]]:
        rows = self._read().execute(
            """SELECT s.id, s.name, s.tags, s.model, s.started_at, s.created_at, s.updated_at,
                      (SELECT COALESCE(MAX(steps), 0) FROM ranks r WHERE r.session_id = s.id),
                      (SELECT COALESCE(SUM(errors), 0) FROM diagnostics d WHERE d.session_id = s.id),
                      (SELECT COALESCE(SUM(warnings), 0) FROM diagnostics d WHERE d.session_id = s.id),
                      EXISTS (SELECT 1 FROM diagnostics d WHERE d.session_id = s.id),
                      json_extract(s.meta, '$.mode')
               FROM sessions s ORDER BY s.created_at DESC"""
        ).fetchall()
        ranks = self._all_ranks()
        return [_session_row(r, ranks.get(r[0], [])) for r in rows]

    def _all_ranks(self, session_id: str | None = None) -> dict[str, list[dict[str, Any]]]:
        sql = "SELECT session_id, rank, last_seen, end_status, steps, graphs, next_seq, events, bytes FROM ranks"
        args: tuple[Any, ...] = ()
        if session_id is not None:
            sql += " WHERE session_id=?"
            args = (session_id,)
        out: dict[str, list[dict[str, Any]]] = {}
        for sid, rank, last_seen, end_status, steps, graphs, frames, events, nbytes in self._read().execute(
                sql + " ORDER BY rank", args):
            out.setdefault(sid, []).append({
                "rank": rank, "last_seen": last_seen, "end_status": end_status, "steps": steps,
                "graphs": graphs, "frames": frames, "events": events, "bytes": nbytes,
                "status": rank_status(end_status, last_seen),
            })
        return out

    def session(self, session_id: str) -> dict[str, Any]:
        row = self._read().execute(
            """SELECT s.id, s.name, s.tags, s.model, s.started_at, s.created_at, s.updated_at,
                      (SELECT COALESCE(MAX(steps), 0) FROM ranks r WHERE r.session_id = s.id),
                      (SELECT COALESCE(SUM(errors), 0) FROM diagnostics d WHERE d.session_id = s.id),
                      (SELECT COALESCE(SUM(warnings), 0) FROM diagnostics d WHERE d.session_id = s.id),
                      EXISTS (SELECT 1 FROM diagnostics d WHERE d.session_id = s.id),
                      json_extract(s.meta, '$.mode'), s.meta, s.labeled
               FROM sessions s WHERE s.id=?""", (session_id,)).fetchone()
        if row is None:
            raise NotFound(f"no session {session_id!r}")
        ranks = self._all_ranks(session_id).get(session_id, [])
        out = _session_row(row[:12], ranks)
        out["meta"] = json.loads(row[12]) if row[12] else None
        out["labeled"] = bool(row[13])  # a name or tags were ever given to it (labels.to_append)
        out["rank_info"] = ranks
        return out

    def names(self, session_ids: list[str]) -> dict[str, str]:
        """The name of each of these sessions that is stored (its id where it has none), by id."""
        out: dict[str, str] = {}
        for i in range(0, len(session_ids), 500):
            chunk = session_ids[i:i + 500]
            rows = self._read().execute(f"SELECT id, name FROM sessions WHERE id IN ({','.join('?' * len(chunk))})",
                                        chunk)
            out.update((sid, name or sid) for sid, name in rows)
        return out

    def exists(self, session_id: str) -> bool:
        return self._read().execute("SELECT 1 FROM sessions WHERE id=?", (session_id,)).fetchone() is not None

    def rank_meta(self, session_id: str, rank: int) -> dict[str, Any] | None:
        row = self._read().execute("SELECT meta FROM ranks WHERE session_id=? AND rank=?",
                                   (session_id, rank)).fetchone()
        return json.loads(row[0]) if row and row[0] else None

    def frame_count(self, session_id: str, rank: int) -> int:
        row = self._read().execute("SELECT next_seq FROM ranks WHERE session_id=? AND rank=?",
                                   (session_id, rank)).fetchone()
        return int(row[0]) if row else 0

    def running(self, session_id: str, rank: int) -> bool:
        """Whether the rank reads "running": no end event, and heard from lately."""
        row = self._read().execute("SELECT end_status, last_seen FROM ranks WHERE session_id=? AND rank=?",
                                   (session_id, rank)).fetchone()
        return row is not None and rank_status(row[0], row[1]) == "running"

    def ended(self, session_id: str, rank: int) -> bool:
        """Whether the rank's end event is stored."""
        row = self._read().execute("SELECT end_status FROM ranks WHERE session_id=? AND rank=?",
                                   (session_id, rank)).fetchone()
        return row is not None and row[0] is not None

    def frame_headers(self, session_id: str, rank: int, count: int) -> Iterator[bytes]:
        """The first ``count`` stored frames' headers (their first ``FRAME_HEADER_SIZE`` bytes:
        seq, length, CRC of the payload, step range), in seq order: enough to tell whether a
        file holds the same frames, without reading the payloads back (SQLite reads a blob's
        prefix alone: ~0.2 s for 200,000 frames)."""
        rows = self._read().execute(
            "SELECT substr(data, 1, ?) FROM frames WHERE session_id=? AND rank=? AND seq<? ORDER BY seq",
            (FRAME_HEADER_SIZE, session_id, rank, count))
        for (head,) in rows:
            yield bytes(head)

    def file_version(self, session_id: str, rank: int) -> tuple[int, int]:
        row = self._read().execute("SELECT version_major, version_minor FROM ranks WHERE session_id=? AND rank=?",
                                   (session_id, rank)).fetchone()
        if row is None:
            raise NotFound(f"session {session_id!r} has no rank {rank}")
        return int(row[0]), int(row[1])

    def steps_json(self, session_id: str, rank: int, start: int | None, end: int | None,
                   limit: int, offset: int) -> str:
        """StepEvents as one JSON array, concatenated from the stored texts: the event with its
        memory and grads parts put back by SQLite's json_set (which keeps every number's text)."""
        rows = self._read().execute(
            f"SELECT {_WHOLE_EVENT} FROM steps WHERE session_id=? AND rank=? AND step>=? AND step<=? "  # noqa: S608
            "ORDER BY step LIMIT ? OFFSET ?",
            (session_id, rank, -1 if start is None else start, 2**62 if end is None else end, limit, offset),
        ).fetchall()
        return "[" + ",".join(r[0] for r in rows) + "]"

    def memory_json(self, session_id: str, rank: int, start: int | None = None) -> bytes:
        """The memory series as JSON.  Normally the concatenation of the column texts each
        ingest batch stored (``memory_chunks``): a few hundred rows for 100k steps, no value
        touched.  A rank whose steps did not arrive in increasing order (or one stored by an
        earlier build) is built by SQLite (json_group_array over the per-step columns), and so
        are the steps from ``start`` on (a live chart's new steps: an index range scan of a few
        rows, where the chunks would be read whole)."""
        conn = self._read()
        names = ("step", "t", *MEMORY_KEYS)
        flag = conn.execute("SELECT mem_chunks FROM ranks WHERE session_id=? AND rank=?",
                            (session_id, rank)).fetchone()
        if flag and flag[0] and start is None:
            chunks = [json.loads(r[0]) for r in conn.execute(
                "SELECT cols FROM memory_chunks WHERE session_id=? AND rank=? ORDER BY seq", (session_id, rank))]
            return ("{" + ",".join(f'"{n}":[' + ",".join(ch[i] for ch in chunks) + "]"
                                   for i, n in enumerate(names)) + "}").encode()
        # an infinite t would come out as SQLite's bare Inf, which is not JSON: null it
        cols = ("step", "CASE WHEN abs(t) <= 1.7976931348623157e308 THEN t END AS t", *_MEMORY_COLS)
        aggregates = ", ".join(f"json_group_array({c})" for c in ("step", "t", *_MEMORY_COLS))
        row = conn.execute(
            f"SELECT {aggregates} FROM (SELECT {', '.join(cols)} FROM steps "  # noqa: S608
            "WHERE session_id=? AND rank=? AND step>=? ORDER BY step)",
            (session_id, rank, -1 if start is None else start)).fetchone()
        return ("{" + ",".join(f'"{n}":{v}' for n, v in zip(names, row, strict=True)) + "}").encode()

    def step_parts(self, session_id: str, rank: int, column: str, start: int | None = None,
                   end: int | None = None, max_steps: int | None = None) -> tuple[list[dict[str, Any]], int, int]:
        """Minimal step dicts ``{step, t, <column>}`` for the series functions, with the number
        of steps in the range and the stride taken: at most ``max_steps`` steps, one of every
        stride consecutive ones, so a 100,000-step run never decodes 100,000 JSON parts at once.
        Of each ``stride`` steps the one with the largest total gradient norm (a non-finite one
        first): a spike is what a sampled chart must not miss (QA 48b: every other step of a
        2,000-step run, and the explosion the doctor named was not drawn), and the range's first
        and last steps besides."""
        assert column in ("memory", "grads")
        conn = self._read()
        bounds: tuple[Any, ...] = (session_id, rank, -1 if start is None else start, 2**62 if end is None else end)
        where = "WHERE session_id=? AND rank=? AND step>=? AND step<=?"
        # the step numbers alone come from the primary-key index, without touching the rows
        numbers = [r[0] for r in conn.execute(f"SELECT step FROM steps {where} ORDER BY step", bounds)]  # noqa: S608
        # two of the max_steps go to the range's first and last steps, drawn whatever their norm:
        # a live chart's right edge is the step just made, and an axis that starts late reads as
        # a run that did (the forty-eighth session's sampling lost both)
        stride = (1 if max_steps is None or len(numbers) <= max_steps
                  else -(-len(numbers) // max(1, max_steps - 2)))
        args: tuple[Any, ...] = bounds
        if stride == 1:
            sql = f"SELECT step, t, {column} FROM steps {where} ORDER BY step"  # noqa: S608
        else:
            sql = (f"SELECT step, t, {column} FROM steps WHERE session_id=? AND rank=? "  # noqa: S608
                   "AND step IN (SELECT value FROM json_each(?)) ORDER BY step")
            args = (session_id, rank, _dumps(self._loudest(conn, where, bounds, stride)))
        rows = conn.execute(sql, args).fetchall()
        parts = [{"step": s, "t": t, column: _finite_back(json.loads(v)) if v else None} for s, t, v in rows]
        return parts, len(numbers), stride

    @staticmethod
    def _loudest(conn: sqlite3.Connection, where: str, bounds: tuple[Any, ...], stride: int) -> list[int]:
        """Of every ``stride`` consecutive steps, the one whose total gradient norm is largest;
        SQLite keeps a NaN as NULL, so a NULL norm whose gradients' text holds a non-finite
        number (``api_json``'s "NaN", "Infinity") counts above every finite one."""
        rows = conn.execute(
            f"SELECT step, grad_norm, CASE WHEN grad_norm IS NULL AND grads IS NOT NULL "  # noqa: S608
            f"THEN instr(grads, '\"NaN\"') + instr(grads, 'Infinity') ELSE 0 END FROM steps {where} ORDER BY step",
            bounds).fetchall()
        picked = {max(rows[k:k + stride], key=lambda r: (bool(r[2]), -1.0 if r[1] is None else r[1]))[0]
                  for k in range(0, len(rows), stride)}
        return sorted(picked | {rows[0][0], rows[-1][0]}) if rows else []

    def loss_series(self, session_id: str, rank: int, start: int | None = None,
                    end: int | None = None) -> dict[str, list[Any]]:
        """The loss of every step in the range, as columns ``{step, loss, nonfinite, lr}``
        (``nonfinite``: the steps whose loss, or a micro-batch's loss, was NaN or infinite;
        ``lr``: each param group's learning rate, a list per step, None without an optimizer).
        One index range scan of the ``loss``, ``nonfinite_losses`` and ``lr`` columns, no event
        decoded but in one case: SQLite stores a NaN as NULL, as it stores "no loss", so for
        those rows alone the event tells which."""
        rows = self._read().execute(
            "SELECT step, loss, CASE WHEN loss IS NULL THEN json_extract(event, '$.loss') END, nonfinite_losses, lr "
            "FROM steps "
            "WHERE session_id=? AND rank=? AND step>=? AND step<=? ORDER BY step",
            (session_id, rank, -1 if start is None else start, 2**62 if end is None else end)).fetchall()
        steps: list[int] = []
        losses: list[Any] = []
        nonfinite: list[int] = []
        lrs: list[Any] = []
        last: tuple[str | None, Any] = (None, None)  # a schedule's LR holds for many steps: decoded once
        for step, loss, in_event, bad, lr in rows:
            if in_event is not None:  # a non-finite loss, as api_json wrote it into the event ("NaN")
                loss = _NONFINITE.get(in_event) if isinstance(in_event, str) else in_event
            steps.append(step)
            losses.append(loss)
            if bad or (loss is not None and not math.isfinite(loss)):
                nonfinite.append(step)
            if lr != last[0]:
                last = (lr, json.loads(lr) if lr else None)
            lrs.append(last[1])
        return {"step": steps, "loss": losses, "nonfinite": nonfinite, "lr": lrs}

    def metric_series(self, session_id: str, rank: int, start: int | None = None) -> dict[str, dict[str, list[Any]]]:
        """Each name ``torchscope.log()`` recorded: ``{step, value}`` columns in step order (from
        step ``start`` on)."""
        rows = self._read().execute(
            "SELECT step, name, value, nonfinite FROM metrics WHERE session_id=? AND rank=? AND step>=? "
            "ORDER BY name, step", (session_id, rank, -1 if start is None else start)).fetchall()
        return metric_series((step, name, _NONFINITE.get(bad, value))
                             for step, name, value, bad in rows)

    def graphs(self, session_id: str, rank: int) -> list[dict[str, Any]]:
        rows = self._read().execute(
            """SELECT g.step, g.micro, g.ops, g.nodes, s.graph_signature FROM graphs g
               LEFT JOIN steps s ON s.session_id=g.session_id AND s.rank=g.rank AND s.step=g.step
               WHERE g.session_id=? AND g.rank=? ORDER BY g.step, g.micro""",
            (session_id, rank)).fetchall()
        return [{"step": r[0], "micro": r[1], "ops": r[2], "nodes": r[3], "signature": r[4]} for r in rows]

    def graph_frame(self, session_id: str, rank: int, step: int, micro: int | None) -> bytes | None:
        sql = ("SELECT f.data FROM graphs g JOIN frames f ON f.session_id=g.session_id AND f.rank=g.rank "
               "AND f.seq=g.seq WHERE g.session_id=? AND g.rank=? AND g.step=?")
        args: list[Any] = [session_id, rank, step]
        if micro is not None:
            sql += " AND g.micro=?"
            args.append(micro)
        row = self._read().execute(sql + " ORDER BY g.micro DESC LIMIT 1", args).fetchone()
        return bytes(row[0]) if row else None

    def frames(self, session_id: str, rank: int) -> Iterator[bytes]:
        """Raw frames in seq order, read in pages so a huge session never sits in memory."""
        conn = self._read()
        seq = 0
        while True:
            rows = conn.execute("SELECT seq, data FROM frames WHERE session_id=? AND rank=? AND seq>=? "
                                "ORDER BY seq LIMIT 256", (session_id, rank, seq)).fetchall()
            if not rows:
                return
            for s, data in rows:
                yield bytes(data)
                seq = s + 1

    def silent(self, before: float) -> list[tuple[str, int]]:
        """Ranks whose writer went silent without an end event (last heard of before ``before``)."""
        rows = self._read().execute(f"SELECT r.session_id, r.rank FROM ranks r WHERE {_SILENT}", (before,)).fetchall()
        return [(str(s), int(r)) for s, r in rows]

    def undiagnosed(self, before: float) -> list[tuple[str, int]]:
        """Ranks that are over (an end event, or a writer silent since before ``before``: a
        killed run, an imported file) and whose frames the doctor has not seen all of: no
        findings, or findings of fewer frames (``diagnostics.frames``, the rank's ``next_seq``
        when they were computed).  What a server stopped before its queue was drained left."""
        rows = self._read().execute(
            "SELECT r.session_id, r.rank FROM ranks r LEFT JOIN diagnostics d "
            "ON d.session_id = r.session_id AND d.rank = r.rank "
            "WHERE (r.end_status IS NOT NULL OR r.last_seen < ?) AND (d.frames IS NULL OR d.frames != r.next_seq) "
            "ORDER BY r.rowid DESC",  # newest first, as the sessions list shows them
            (before,)).fetchall()
        return [(str(s), int(r)) for s, r in rows]

    def diagnostics(self, session_id: str, rank: int) -> tuple[int, list[dict[str, Any]]] | None:
        row = self._read().execute("SELECT frames, findings FROM diagnostics WHERE session_id=? AND rank=?",
                                   (session_id, rank)).fetchone()
        return (int(row[0]), json.loads(row[1])) if row else None


# ---------------------------------------------------------------------- staged imports
class StagedImport:
    """A session file's frames ingested into a scratch database of the same tables (by the
    same ``_ingest``), from the importing thread and without the store's writer: each frame is
    decoded once, and nothing reaches the store until ``Store.commit_staged`` copies the whole
    session in one transaction, so a bad frame anywhere leaves the store untouched."""

    def __init__(self, path: Path, session_id: str, rank: int, version: tuple[int, int]) -> None:
        self.path, self.session_id, self.rank, self.version = path, session_id, rank, version
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        # a scratch file, deleted with the upload: no journal, no fsync
        self._conn.execute("PRAGMA journal_mode=OFF")
        self._conn.execute("PRAGMA synchronous=OFF")
        self._conn.executescript(SCHEMA_SQL)
        _add_missing_columns(self._conn)

    def add(self, frames: list[Frame]) -> IngestResult:
        self._conn.execute("BEGIN")
        try:
            res = _ingest(self._conn, self.session_id, self.rank, frames, True, self.version)
        finally:
            self._conn.execute("COMMIT")
        return res

    def close(self) -> None:
        self._conn.close()


_STAGED_TABLES = ("ranks", "frames", "steps", "graphs", "memory_chunks", "metrics")


def _commit_staged(c: sqlite3.Connection, session_id: str, rank: int, writing: bool) -> IngestResult | None:
    if c.execute("SELECT 1 FROM ranks WHERE session_id=? AND rank=?", (session_id, rank)).fetchone():
        return None
    now = time.time()
    # importing a file is a user's explicit act: a session they deleted comes back (docs/server.md)
    c.execute("DELETE FROM main.deleted WHERE session_id=?", (session_id,))
    for table in _STAGED_TABLES:  # the scratch holds this one rank; its columns are the store's
        cols = ", ".join(row[1] for row in c.execute(f"PRAGMA staged.table_info({table})"))
        c.execute(f"INSERT INTO main.{table} ({cols}) SELECT {cols} FROM staged.{table}")  # noqa: S608
    if writing:
        c.execute("UPDATE ranks SET last_seen=? WHERE session_id=? AND rank=? AND end_status IS NULL",
                  (now, session_id, rank))
    created = c.execute("INSERT OR IGNORE INTO sessions (id, created_at, updated_at) VALUES (?,?,?)",
                        (session_id, now, now)).rowcount > 0
    next_seq, meta = c.execute("SELECT next_seq, meta FROM staged.ranks").fetchone()
    if created:  # the scratch's row is what the file's session events made of a new session
        c.execute("UPDATE sessions SET (name, model, started_at, meta) = "
                  "(SELECT name, model, started_at, meta FROM staged.sessions WHERE id=?) WHERE id=?",
                  (session_id, session_id))
    elif meta:  # another rank's session: this rank's session event applied as ingest applies it
        _put_session_event(c, session_id, rank, json.loads(meta))
    return IngestResult(int(next_seq), created=created)


# ---------------------------------------------------------------------- status
def rank_status(end_status: str | None, last_seen: float, now: float | None = None) -> str:
    from .config import RUNNING_TIMEOUT_S

    if end_status is not None and end_status in END_STATUSES:
        return end_status
    if (now or time.time()) - last_seen < RUNNING_TIMEOUT_S:
        return "running"
    return "ended unexpectedly"


def session_status(rank_statuses: list[str]) -> str:
    """Running while any rank runs; then the worst outcome of any rank."""
    for status in ("running", "error", "ended unexpectedly", "interrupted", "finished"):
        if status in rank_statuses:
            return status
    return "ended unexpectedly"  # a session with no rank rows has no writer


def _session_row(r: tuple[Any, ...], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": r[0], "name": r[1] or r[0], "tags": json.loads(r[2]), "model": r[3],
        "started_at": r[4], "created_at": r[5], "updated_at": r[6], "steps": r[7],
        "errors": r[8], "warnings": r[9],
        # whether the doctor has looked yet: 0 errors of an undiagnosed run are no verdict
        "diagnosed": bool(r[10]),
        # the capture mode of rank 0's session event: "light", "default" or "full"
        "mode": r[11] if r[11] in ("light", "default", "full") else None,
        "ranks": [x["rank"] for x in ranks],
        "status": session_status([x["status"] for x in ranks]),
    }


# ---------------------------------------------------------------------- ingest (writer thread)
def _ingest(c: sqlite3.Connection, session_id: str, rank: int, frames: list[Frame], imported: bool,
            version: tuple[int, int] | None) -> IngestResult:
    now = time.time()
    row = c.execute("SELECT next_seq, mem_chunks, end_status FROM ranks WHERE session_id=? AND rank=?",
                    (session_id, rank)).fetchone()
    # A live rank whose end event is stored takes no frame but the series frames its writer
    # puts after the end (the columns of its last steps): anything else is another run that
    # reuses the session id.  (An import checks the file as a whole first: upload.py.)
    ended = not imported and row is not None and row[2] is not None
    created = False
    if row is None:
        if not imported:
            _refuse_deleted(c, session_id)
        # An imported file's writer is gone: without an end event it "ended unexpectedly" at once.
        # a live session's export header is the server's format version (docs/server.md)
        major, minor = version or SCHEMA_VERSION
        c.execute("INSERT INTO ranks (session_id, rank, last_seen, version_major, version_minor, mem_chunks) "
                  "VALUES (?,?,?,?,?,1)", (session_id, rank, 0.0 if imported else now, major, minor))
        created = c.execute("INSERT OR IGNORE INTO sessions (id, created_at, updated_at) VALUES (?,?,?)",
                            (session_id, now, now)).rowcount > 0
        next_seq = 0
    else:
        next_seq = int(row[0])
    chunked = row is None or bool(row[1])
    last_step = c.execute("SELECT MAX(step) FROM steps WHERE session_id=? AND rank=?",
                          (session_id, rank)).fetchone()[0] if chunked else None
    res = IngestResult(next_seq, created=created, ended=ended)
    graphs = events = nbytes = 0
    frame_rows: list[tuple[str, int, int, bytes]] = []
    step_events: list[dict[str, Any]] = []
    metrics: list[tuple[int, str, float | None]] = []
    series: dict[str, list[Any]] = {part: [] for part in _SUMMARY_PARTS}  # the frames' series records
    for f in frames:
        if f.info.seq < next_seq:
            continue  # a resend of a frame we have
        if f.info.seq > next_seq:
            res.gap = True
            break
        if ended and series_part(f.info) is None:
            raise RunConflict(f"session {session_id} rank {rank} has ended (its end event is stored): frame "
                              f"{next_seq} would go on after it; is another run using this session id?")
        frame_rows.append((session_id, rank, next_seq, f.raw))
        for ev in f.events:
            kind = ev.get("kind")
            if kind == "step":
                step_events.append(ev)
            elif kind == "graph":
                graphs += _put_graph(c, session_id, rank, next_seq, ev)
            elif kind == "session":
                _put_session_event(c, session_id, rank, ev)
            elif kind == "end":
                c.execute("UPDATE ranks SET end_status=? WHERE session_id=? AND rank=?",
                          (ev.get("status", "finished"), session_id, rank))
            elif kind == "series" and ev.get("part") in series:
                series[ev["part"]].append(ev.get("columns"))
            elif kind == "log" and "metrics" in ev:
                metrics += metric_rows([ev])
        events += len(f.events)
        nbytes += len(f.raw)
        next_seq += 1
        res.stored.append(f)
    res.next_seq = next_seq
    c.executemany("INSERT INTO frames VALUES (?,?,?,?)", frame_rows)
    if metrics:  # in the order logged: a name logged twice for a step keeps the later value
        c.executemany("INSERT OR REPLACE INTO metrics VALUES (?,?,?,?,?,?)",
                      [(session_id, rank, step, name, *_metric_value(value)) for step, name, value in metrics])
    # the batch's steps in one statement: one pass of torchscope.series over them, not one per step
    step_events = [ev for ev in step_events if type(ev.get("step")) is int]
    if step_events:
        cols, res.nonfinite = _put_steps(c, session_id, rank, step_events, series)
        if chunked:
            _put_memory_chunk(c, session_id, rank, next_seq - 1, last_step, cols)
    c.execute("UPDATE ranks SET next_seq=?, steps=steps+?, graphs=graphs+?, events=events+?, bytes=bytes+?"
              + ("" if imported else ", last_seen=?") + " WHERE session_id=? AND rank=?",
              (next_seq, len(step_events), graphs, events, nbytes, *(() if imported else (now,)),
               session_id, rank))
    c.execute("UPDATE sessions SET updated_at=? WHERE id=?", (now, session_id))
    return res


_INSERT_STEP = (
    f"INSERT OR REPLACE INTO steps (session_id, rank, step, {', '.join(_STEP_COLS)}, "
    f"{', '.join(_MEMORY_COLS)}, nonfinite_losses, lr, event, memory, grads) "
    f"VALUES (?,?,?,{','.join('?' * (len(_STEP_COLS) + len(_MEMORY_COLS)))},?,?,?,?,?)")
# A stored event writes a non-finite float as api_json does: one of these strings
_NONFINITE_SQL = "('NaN','Infinity','-Infinity')"


def _add_missing_columns(c: sqlite3.Connection) -> None:
    """Stores made by an earlier build lack newer step columns: add them (no data lost)."""
    have = {row[1] for row in c.execute("PRAGMA table_info(steps)")}
    added = [col for col in _MEMORY_COLS if col not in have]
    for col in added:
        c.execute(f"ALTER TABLE steps ADD COLUMN {col} INTEGER")
    if added and "mem_chunks" in {row[1] for row in c.execute("PRAGMA table_info(ranks)")}:
        # the stored /memory texts lack the new columns: every rank is built by SQL from now on
        c.execute("UPDATE ranks SET mem_chunks=0")
        c.execute("DELETE FROM memory_chunks")
    if "nonfinite_losses" not in have:
        # how many of a step's micro-batch losses were NaN/Inf (/loss marks the step): counted
        # once here for the steps stored before, from their events
        c.execute("ALTER TABLE steps ADD COLUMN nonfinite_losses INTEGER NOT NULL DEFAULT 0")
        c.execute("UPDATE steps SET nonfinite_losses=(SELECT count(*) FROM json_each(event, '$.losses') "
                  f"WHERE value IN {_NONFINITE_SQL}) WHERE instr(event, '\"losses\"')")
    if "lr" not in have:
        # each param group's learning rate (a JSON list), for /loss beside the loss: taken once
        # here from the events of the steps stored before
        c.execute("ALTER TABLE steps ADD COLUMN lr TEXT")
        c.execute("UPDATE steps SET lr=json_extract(event, '$.lr') WHERE instr(event, '\"lr\"')")
    if "labeled" not in {row[1] for row in c.execute("PRAGMA table_info(sessions)")}:
        # a store from before: its sessions whose name or tags are not the recorded ones (as
        # labels.to_append compared them); one renamed back before cannot be told, and downloads
        # as recorded, as it did
        c.execute("ALTER TABLE sessions ADD COLUMN labeled INTEGER NOT NULL DEFAULT 0")
        c.execute("UPDATE sessions SET labeled=1 WHERE tags != '[]' OR COALESCE(name, id) != COALESCE(CASE WHEN "
                  "json_type(meta, '$.name') = 'text' THEN NULLIF(json_extract(meta, '$.name'), '') END, id)")
    if "mem_chunks" not in {row[1] for row in c.execute("PRAGMA table_info(ranks)")}:
        # 0: ranks stored before memory_chunks existed have none; /memory builds them by SQL
        c.execute("ALTER TABLE ranks ADD COLUMN mem_chunks INTEGER NOT NULL DEFAULT 0")


def _raw_json(obj: Any) -> str | None:
    # NaN stays a NaN literal here: read back by json.loads, not browsers
    return None if obj is None else pydantic_core.to_json(obj, inf_nan_mode="constants").decode()


# A step event's parts stored in columns of their own (read alone by step_parts), and so not
# again in its ``event`` text: as api_json writes them, JSON SQLite's json() reads (a NaN
# literal it refuses), put back into the event by _WHOLE_EVENT.
_SPLIT = ("memory", "grads")
_WHOLE_EVENT = ("CASE WHEN grads IS NULL AND memory IS NULL OR json_type(event, '$.grads') IS NOT NULL THEN event "
                "WHEN grads IS NULL THEN json_set(event, '$.memory', json(memory)) "
                "WHEN memory IS NULL THEN json_set(event, '$.grads', json(grads)) "
                "ELSE json_set(event, '$.grads', json(grads), '$.memory', json(memory)) END")


def _part_json(obj: Any) -> str | None:
    return None if obj is None else api_json(obj).decode()


def _finite_back(obj: Any) -> Any:
    """A stored memory/grads part as the capture wrote it: api_json's "NaN"/"Infinity" strings
    floats again (parts stored before hold NaN literals, which json.loads read as floats)."""
    if isinstance(obj, str):
        return _NONFINITE.get(obj, obj)
    if isinstance(obj, list):
        return [_finite_back(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _finite_back(v) for k, v in obj.items()}
    return obj


# the parts of torchscope.series whose columns are together step_summary's
_SUMMARY_PARTS = ("memory", "steps")


def _summary_columns(steps: list[dict[str, Any]], series: dict[str, list[Any]]) -> dict[str, dict[str, list[Any]]]:
    """Per part of ``_SUMMARY_PARTS``, the columns of these step events: the series records of
    the same frames when they hold exactly these steps (a session file's: the capture wrote
    them with the same ``series.columns`` over these events, and readers of the file read them
    too), else computed."""
    numbers = [ev["step"] for ev in steps]
    out: dict[str, dict[str, list[Any]]] = {}
    for part in _SUMMARY_PARTS:
        try:
            given = concat([check_columns(cols, part) for cols in series[part]], part) if series[part] else None
        except ValueError:  # a bad record: the reader refuses it too, but the events are fine
            given = None
        out[part] = given if given is not None and given["step"] == numbers else columns(steps, part)
    return out


def _put_steps(c: sqlite3.Connection, session_id: str, rank: int, steps: list[dict[str, Any]],
               series: dict[str, list[Any]]) -> tuple[dict[str, list[Any]], bool]:
    """Store step events (each with an int step) with their scalar columns; returns their
    /memory columns and whether a step's loss, a micro-batch's, or a gradient was NaN/Inf
    (read off the columns made here anyway: no event is looked at again).  The ``memory``
    and ``steps`` columns of ``torchscope.series`` are together ``step_summary``: for the
    whole batch at once (``_summary_columns``)."""
    parts = _summary_columns(steps, series)
    mem = parts["memory"]
    summary = {**parts["steps"], **mem}
    n = len(steps)
    bad_losses = [_nonfinite_count(ev.get("losses")) for ev in steps]
    rows = zip([session_id] * n, [rank] * n, summary["step"],
               *(summary[k] for k in _STEP_COLS), *(mem[k] for k in MEMORY_KEYS),
               bad_losses,
               [_raw_json(ev.get("lr")) for ev in steps],
               [api_json({k: v for k, v in ev.items() if k not in _SPLIT}).decode() for ev in steps],
               [_part_json(ev.get("memory")) for ev in steps], [_part_json(ev.get("grads")) for ev in steps],
               strict=True)
    c.executemany(_INSERT_STEP, rows)
    cols = parts["steps"]
    nonfinite = (any(bad_losses) or any(cols["grad_nan"]) or any(cols["grad_inf"])
                 or any(isinstance(v, float) and not math.isfinite(v) for v in (*cols["loss"], *cols["grad_norm"])))
    return mem, nonfinite


def _nonfinite_count(losses: Any) -> int:
    """How many of a step's micro-batch losses are NaN or infinite."""
    if not isinstance(losses, list):
        return 0
    return sum(1 for v in losses if isinstance(v, float) and not math.isfinite(v))


def _put_memory_chunk(c: sqlite3.Connection, session_id: str, rank: int, seq: int, last_step: int | None,
                      cols: dict[str, list[Any]]) -> None:
    """Store this batch's /memory columns as ready JSON text, so /memory on a long run joins a
    few hundred texts instead of reading 100,000 rows.  Valid only while steps arrive in
    increasing order (the capture's order): otherwise the rank falls back to the SQL build."""
    numbers = cols["step"]
    if (last_step is not None and numbers[0] <= last_step) or any(a >= b for a, b in itertools.pairwise(numbers)):
        c.execute("UPDATE ranks SET mem_chunks=0 WHERE session_id=? AND rank=?", (session_id, rank))
        return
    # each column as api_json writes it (non-finite floats as strings JSON.parse accepts), sans brackets
    texts = [api_json(cols[k])[1:-1].decode() for k in ("step", "t", *MEMORY_KEYS)]
    c.execute("INSERT OR REPLACE INTO memory_chunks VALUES (?,?,?,?)", (session_id, rank, seq, _dumps(texts)))


def _put_graph(c: sqlite3.Connection, session_id: str, rank: int, seq: int, ev: dict[str, Any]) -> int:
    step = ev.get("step")
    if not isinstance(step, int):
        return 0
    # ev is the frame's graph summary (frames.Frame): the counts, not the records
    c.execute("INSERT OR REPLACE INTO graphs VALUES (?,?,?,?,?,?,?)",
              (session_id, rank, step, int(ev.get("micro", 0)), seq, ev["n_ops"], ev["n_nodes"]))
    return 1


def _put_session_event(c: sqlite3.Connection, session_id: str, rank: int, ev: dict[str, Any]) -> None:
    text = _dumps(ev)
    c.execute("UPDATE ranks SET meta=? WHERE session_id=? AND rank=?", (text, session_id, rank))
    if rank == 0 or c.execute("SELECT meta FROM sessions WHERE id=?", (session_id,)).fetchone()[0] is None:
        # rank 0's session event describes the run; a user's rename is kept (COALESCE)
        c.execute("UPDATE sessions SET meta=?, name=COALESCE(name, ?), model=?, started_at=? WHERE id=?",
                  (text, ev.get("name"), ev.get("model"), ev.get("started_at"), session_id))
