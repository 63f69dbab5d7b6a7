"""``torchscope.load(path)``: a read-only view of one ``.tscope`` file for notebooks and tests.

Opening walks the frame headers only (``sessionfile.index``) and decodes the first frame for
the ``session`` record; everything else is decoded on demand.  Graph events live in frames of
their own flagged ``FLAG_GRAPH`` with their step in the header, so ``graph(n)`` decodes one
frame and ``steps``/``memory()``/``grads()`` decode every frame *except* the graphs, which
are the bulk of a file.  Every record is validated (``validate.py``) as it is decoded.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import series
from .sessionfile import FLAG_GRAPH, FrameInfo, SessionFileError, index, read_frames
from .validate import RecordError, validate_event

if TYPE_CHECKING:
    from .schema import Finding, GraphEvent, SessionEvent, StepEvent


class Session:
    """One rank's recorded run.  Build it with ``torchscope.load(path)``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._name = os.path.basename(self.path)
        self.version, self._frames = index(self.path)
        if not self._frames:
            raise SessionFileError(f"{self._name} holds no records (empty or cut off before its first frame)")
        first = self._decode([self._frames[0]])
        if not first or first[0].get("kind") != "session":
            raise SessionFileError(f"{self._name} does not start with a session record")
        self.meta: SessionEvent = first[0]  # type: ignore[assignment]
        self._steps: list[StepEvent] | None = None
        self._tail: list[dict[str, Any]] | None = None  # log/end records (decoded with the steps)

    # ------------------------------------------------------------------ decoding
    def _decode(self, frames: list[FrameInfo]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for events in read_frames(self.path, frames):
            for ev in events:
                try:
                    out.append(validate_event(ev))
                except RecordError as exc:
                    raise SessionFileError(f"{self._name}: {exc}") from None
        return out

    def _load_records(self) -> None:
        if self._steps is not None:
            return
        records = self._decode([f for f in self._frames if not f.flags & FLAG_GRAPH])
        self._steps = [e for e in records if e["kind"] == "step"]  # type: ignore[misc]
        self._tail = [e for e in records if e["kind"] in ("log", "end")]

    # ------------------------------------------------------------------ identity
    @property
    def session_id(self) -> str:
        return str(self.meta.get("session_id", ""))

    @property
    def name(self) -> str:
        return str(self.meta.get("name", ""))

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
        """``finished`` | ``error`` (from the end record), ``running`` while the writing
        process is alive on this host, else ``ended unexpectedly``."""
        end = self.end
        if end is not None:
            return "error" if end.get("status") == "error" else "finished"
        return "running" if _writer_alive(self.meta) else "ended unexpectedly"

    @property
    def logs(self) -> list[dict[str, Any]]:
        self._load_records()
        assert self._tail is not None
        return [e for e in self._tail if e["kind"] == "log"]

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
            frames = [f for f in self._frames if not f.flags & FLAG_GRAPH and f.step_lo <= n <= f.step_hi]
            pool = self._decode(frames)
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
        decodes only the graph frames of that step."""
        frames = [f for f in self._frames if f.flags & FLAG_GRAPH and f.step_lo <= step <= f.step_hi]
        for ev in self._decode(frames):
            if ev["kind"] == "graph" and ev["step"] == step and micro in (None, ev.get("micro", 0)):
                return ev  # type: ignore[return-value]
        captured = ", ".join(map(str, self.graph_steps[:20])) or "none"
        which = f"step {step}" + (f" micro-batch {micro}" if micro is not None else "")
        raise KeyError(f"no graph captured for {which}; captured steps: {captured}")

    # ------------------------------------------------------------------ series and doctor
    def memory(self) -> dict[str, list[Any]]:
        """Columnar memory series (see ``series.memory_series``)."""
        return series.memory_series(self.steps)  # type: ignore[arg-type]

    def grads(self) -> dict[str, Any]:
        """Columnar gradient statistics aligned with ``meta['params']``."""
        return series.grad_series(self.steps, self.meta.get("params", []))  # type: ignore[arg-type]

    def events(self) -> Iterator[dict[str, Any]]:
        """Every record in file order, graphs included (validated, decoded frame by frame)."""
        for frame in self._frames:
            yield from self._decode([frame])

    def diagnostics(self, settings: Any = None) -> list[Finding]:
        from .doctor import diagnose  # the doctor is optional for a reader; import on use

        return list(diagnose(self.events(), settings))

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        graphs = len(self.graph_steps)
        rank = f" rank {self.rank}/{self.world_size}" if self.world_size > 1 else ""
        return (
            f"<torchscope.Session {self.name or self._name!r} id={self.session_id}{rank}: "
            f"{len(self.steps)} steps, {graphs} captured graphs, {self.status}>"
        )


def _writer_alive(meta: dict[str, Any] | SessionEvent) -> bool:
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
    """Open a ``.tscope`` session file read-only; ``SessionFileError`` (one line) if it is not one."""
    return Session(path)
