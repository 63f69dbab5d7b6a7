"""``torchscope.load(path)``: a read-only view of one ``.tscope`` file for notebooks and tests.

Opening walks the frame headers only (``sessionfile.index``) and decodes the first frame for
the ``session`` record; everything else is decoded on demand.  Graph events live in frames of
their own flagged ``FLAG_GRAPH`` with their step in the header, so ``graph(n)`` decodes one
frame and ``steps`` decodes every frame *except* the graphs (the bulk of a file) and the
series frames.  ``memory()``, ``grads()``, ``summary()`` and ``len()`` read the series frames
(format 1.1, flagged ``FLAG_SERIES``) instead of the step events, plus the step events of any
step frames after the last series frame (a killed writer's last flush, or a 1.0 file that has
none).  Every record is validated (``validate.py``, ``series.check_columns``) as it is decoded.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import series
from .schema import END_STATUSES, script_source
from .sessionfile import (
    FLAG_GRAPH,
    FLAG_SERIES,
    NO_STEP,
    FrameInfo,
    SessionFileError,
    index,
    may_hold_labels,
    read_frames,
    series_part,
)
from .validate import RecordError, validate_event

if TYPE_CHECKING:
    from .schema import Finding, GraphEvent, ScriptSource, SessionEvent, StepEvent


class Session:
    """One rank's recorded run.  Build it with ``torchscope.load(path)``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._name = self.path
        self.version, self._frames = index(self.path)
        if not self._frames:
            raise SessionFileError(f"{self._name} holds no records (empty or cut off before its first frame)")
        first = self._decode([self._frames[0]])
        if not first or first[0].get("kind") != "session":
            raise SessionFileError(f"{self._name} does not start with a session record")
        self.meta: SessionEvent = first[0]  # type: ignore[assignment]
        self._steps: list[StepEvent] | None = None
        self._tail: list[dict[str, Any]] | None = None  # log/end records (decoded with the steps)
        self._columns: dict[str, dict[str, list[Any]]] = {}  # series part -> its columns, whole run
        self._decoded: dict[int, list[dict[str, Any]]] = {}  # seq -> records of a plain frame

    # ------------------------------------------------------------------ decoding
    def _decode(self, frames: list[FrameInfo]) -> list[dict[str, Any]]:
        return [ev for records in self._decode_each(frames) for ev in records]

    def _decode_each(self, frames: list[FrameInfo]) -> Iterator[list[dict[str, Any]]]:
        """The records of each of these frames, validated; a series record comes back with
        its columns checked."""
        for info, events in zip(frames, read_frames(self.path, frames), strict=True):
            out: list[dict[str, Any]] = []
            for ev in events:
                if ev["kind"] == "series":  # check_records matched its part with the frame's flags
                    try:
                        ev["columns"] = series.check_columns(ev.get("columns"), ev["part"])
                    except ValueError as exc:
                        where = f"{self._name} is corrupt at byte {info.offset}"
                        raise SessionFileError(f"{where}: {exc}") from None
                    out.append(ev)
                    continue
                try:
                    out.append(validate_event(ev))
                except RecordError as exc:
                    raise SessionFileError(f"{self._name}: {exc}") from None
            yield out

    def _plain_records(self, frames: list[FrameInfo]) -> list[dict[str, Any]]:
        """The records of these plain frames, each frame decoded once per Session (a 1.0 file's
        series and ``steps`` share one decode)."""
        todo = [f for f in frames if f.seq not in self._decoded]
        for f, records in zip(todo, self._decode_each(todo), strict=True):
            self._decoded[f.seq] = records
        return [e for f in frames for e in self._decoded[f.seq]]

    def _load_records(self) -> None:
        if self._steps is not None:
            return
        records = self._plain_records([f for f in self._frames if _plain(f)])
        self._steps = [e for e in records if e["kind"] == "step"]  # type: ignore[misc]
        self._tail = [e for e in records if e["kind"] in ("log", "end")]

    def _series(self, part: str) -> dict[str, list[Any]]:
        """The whole run's columns of one series part: the series frames of that part, then
        the step events of the step frames after the last of them (none in a file closed
        normally; all of them in a 1.0 file)."""
        if part in self._columns:
            return self._columns[part]
        stored: list[FrameInfo] = []
        after: list[FrameInfo] = []  # frames not covered by a series frame of this part yet
        for f in self._frames:
            if f.flags & FLAG_SERIES:
                if series_part(f) == part:
                    stored.append(f)
                    after = []
            elif _plain(f) and f.step_lo != NO_STEP:  # every step event has a step
                after.append(f)
        pieces = [r["columns"] for r in self._decode(stored)]
        pieces.append(series.columns([e for e in self._plain_records(after) if e["kind"] == "step"], part))
        self._columns[part] = series.concat(pieces, part)
        return self._columns[part]

    # ------------------------------------------------------------------ identity
    @property
    def session_id(self) -> str:
        return str(self.meta.get("session_id", ""))

    @property
    def name(self) -> str:
        """The run's name: as given on a torchscope server when the file is a download of a run
        renamed there (its last record carries the labels), else as recorded (``meta["name"]``)."""
        given = self._labels().get("name")
        return given if isinstance(given, str) and given else str(self.meta.get("name", ""))

    @property
    def tags(self) -> list[str]:
        """The tags given on a torchscope server, when the file is a download of a tagged run."""
        tags = self._labels().get("tags")
        return [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []

    def _labels(self) -> dict[str, Any]:
        # a server's download ends with one labels record (schema.LogEvent.labels); only the last
        # frame is read, not the run
        last = self._frames[-1]
        if len(self._frames) < 2 or not may_hold_labels(last):
            return {}
        records = self._plain_records([last])
        labels = records[0].get("labels") if records and records[0]["kind"] == "log" else None
        return labels if isinstance(labels, dict) else {}

    @property
    def source(self) -> ScriptSource | None:
        """The run's script as ``watch()`` recorded it (``schema.ScriptSource``: ``path``,
        ``sha256``, ``bytes``, ``text``), None when the file holds none (``save_code=False``,
        ``python -c``, a notebook, a file before format 1.14).  Read from the frames without a
        step only (the writer gives it a frame of its own after the session event's)."""
        for f in self._frames:
            if not _plain(f) or f.step_lo != NO_STEP:
                continue
            for ev in self._plain_records([f]):
                src = script_source(ev)
                if src is not None:
                    return src
        return None

    @property
    def rank(self) -> int:
        return int(self.meta.get("rank", 0))

    @property
    def world_size(self) -> int:
        return int(self.meta.get("world_size", 1))

    @property
    def end(self) -> dict[str, Any] | None:
        """The ``end`` record of a run that closed normally, else None."""
        self._load_records()
        assert self._tail is not None
        ends = [e for e in self._tail if e["kind"] == "end"]
        return ends[-1] if ends else None

    @property
    def status(self) -> str:
        """``finished`` | ``interrupted`` | ``error`` (from the end record), ``running`` while the
        writing process is alive on this host, else ``ended unexpectedly``."""
        end = self.end
        if end is not None:
            status = end.get("status")
            return status if status in END_STATUSES else "finished"
        return "running" if writer_alive(self.meta) else "ended unexpectedly"

    @property
    def logs(self) -> list[dict[str, Any]]:
        self._load_records()
        assert self._tail is not None
        return [e for e in self._tail if e["kind"] == "log"]

    def metrics(self) -> dict[str, dict[str, list[Any]]]:
        """What ``torchscope.log()`` recorded: each name's ``{step, value}`` columns, in step order."""
        return series.metric_series(series.metric_rows(self.logs))

    # ------------------------------------------------------------------ steps
    @property
    def steps(self) -> list[StepEvent]:
        """Every recorded step, in order (decoded on first use; graph frames are skipped)."""
        self._load_records()
        assert self._steps is not None
        return self._steps

    def step(self, n: int) -> StepEvent:
        """Step ``n``; decodes only the frames whose step range holds it."""
        if self._steps is not None:
            pool: list[Any] = self._steps
        else:
            pool = self._decode([f for f in self._frames if _plain(f) and f.step_lo <= n <= f.step_hi])
        for ev in pool:
            if ev.get("kind") == "step" and ev.get("step") == n:
                return ev  # type: ignore[no-any-return]
        raise KeyError(f"step {n} is not in {self._name}")

    # ------------------------------------------------------------------ graphs
    @property
    def graph_steps(self) -> list[int]:
        """Steps with a captured graph, from the frame headers alone."""
        return sorted({f.step_lo for f in self._frames if f.flags & FLAG_GRAPH and f.step_lo >= 0})

    def graph(self, step: int, micro: int | None = None) -> GraphEvent:
        """The captured graph of ``step`` (micro-batch ``micro``, default the first one);
        decodes only the graph frames of that step.  A step is captured at its first backward:
        with gradient accumulation or several backwards per step, the graph is the first
        backward's (micro-batch 0); the step's later backwards are counted, not captured."""
        frames = [f for f in self._frames if f.flags & FLAG_GRAPH and f.step_lo <= step <= f.step_hi]
        for ev in self._decode(frames):
            if ev["kind"] == "graph" and ev["step"] == step and micro in (None, ev.get("micro", 0)):
                return ev  # type: ignore[return-value]
        captured = ", ".join(map(str, self.graph_steps[:20])) or "none"
        which = f"step {step}" + (f" micro-batch {micro}" if micro is not None else "")
        raise KeyError(f"no graph captured for {which}; captured steps: {captured}")

    # ------------------------------------------------------------------ series and doctor
    # whole-run series come from the series frames: small, and no step event is decoded
    def memory(self) -> dict[str, list[Any]]:
        """Columnar memory series (see ``series.memory_series``)."""
        return {k: list(v) for k, v in self._series("memory").items()}

    def grads(self) -> dict[str, Any]:
        """Columnar gradient statistics aligned with ``meta['params']`` (``series.grad_series``)."""
        return series.grads_from_columns(self._series("grads"), self.meta.get("params", []))  # type: ignore[arg-type]

    def summary(self) -> dict[str, list[Any]]:
        """``series.step_summary`` of every step, as columns (step, loss, duration_us, ...)."""
        return series.summary_from_columns(self._series("memory"), self._series("steps"))

    def events(self) -> Iterator[dict[str, Any]]:
        """Every record in file order, graphs included (validated, decoded frame by frame).
        Series frames are checked but not yielded: they are derived from the step events."""
        for frame in self._frames:
            yield from (e for e in self._decode([frame]) if e["kind"] != "series")

    def diagnostics(self, settings: Any = None) -> list[Finding]:
        from .doctor import diagnose  # the doctor is optional for a reader; import on use

        return list(diagnose(self.events(), settings))

    def __len__(self) -> int:
        """The number of step events (from the series frames: no step event is decoded)."""
        return len(self._series("memory")["step"])

    def __repr__(self) -> str:
        graphs = len(self.graph_steps)
        rank = f" rank {self.rank}/{self.world_size}" if self.world_size > 1 else ""
        return (
            f"<torchscope.Session {self.name or self._name!r} id={self.session_id}{rank}: "
            f"{len(self)} steps, {graphs} captured graphs, {self.status}>"
        )


def _plain(frame: FrameInfo) -> bool:
    """A frame of step, log, end or session records (not a graph, not a series frame)."""
    return not frame.flags & (FLAG_GRAPH | FLAG_SERIES)


def writer_alive(meta: dict[str, Any] | SessionEvent) -> bool:
    """Is the process that wrote this file still running here?  Guards against pid reuse by
    comparing the process's start time with the session's (Linux /proc; elsewhere: no)."""
    pid, started = meta.get("pid"), meta.get("started_at")
    if not isinstance(pid, int) or not isinstance(started, (int, float)) or meta.get("host") != socket.gethostname():
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, StopIteration, IndexError, ValueError):
        return False
    if fields[0] == "Z":  # a zombie has exited; only its parent has not reaped it yet
        return False
    proc_start = btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return proc_start <= started + 2.0 and time.time() >= started


def load(path: str | os.PathLike[str]) -> Session:
    """Open a ``.tscope`` session file read-only; ``SessionFileError`` (one line) if it is not one.
    A file a watch of this process is still writing is brought up to date first: a notebook
    reads its run in the cell after the training one, before the writer's next flush."""
    from ._watch import flush_writers  # the reader needs the capture only for this

    flush_writers(path)
    return Session(path)
