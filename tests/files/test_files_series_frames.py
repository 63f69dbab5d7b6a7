"""Series frames (format 1.1): whole-run series straight from small frames.

The capture follows each flush's step frames with one ``series`` frame per part (memory,
steps, grads).  ``load().memory()/grads()/summary()/len()`` read those frames, never the step
events, and must give exactly what ``series`` computes from the step events; files without
series frames (1.0) or cut short by a kill fall back to the step events they lack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProc, one_line_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchscope import series
from torchscope.schema import SCHEMA_VERSION
from torchscope.session import Session, load
from torchscope.sessionfile import (
    _FRAME,
    FLAG_GRAPH,
    FLAG_SERIES,
    FLAG_SERIES_GRADS,
    FLAG_SERIES_STEPS,
    FRAME_HEADER_SIZE,
    FRAME_TAG,
    HEADER_SIZE,
    SERIES_FLAGS,
    SessionFileError,
    SessionFileWriter,
    _step_range,
    file_header,
    index,
    iter_events,
    read_frames,
    series_part,
)

SCRIPT = Path(__file__).with_name("train_files_kill.py")
SESSION = {
    "kind": "session",
    "session_id": "sid",
    "name": "series",
    "rank": 0,
    "params": [{"name": "w", "module": ""}, {"name": "b", "module": ""}],
}


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def _expected(s: Session) -> tuple[dict[str, Any], dict[str, Any], dict[str, list[Any]]]:
    """What the series must be: computed from the step events (decoded on a fresh Session)."""
    fresh = load(s.path)
    steps = fresh.steps
    summary = {k: [series.step_summary(e)[k] for e in steps] for k in series.step_summary({})}
    return series.memory_series(steps), series.grad_series(steps, fresh.meta.get("params", [])), summary


def _assert_series_match(path: Path) -> Session:
    s = load(path)
    memory, grads, summary = _expected(s)
    assert s.memory() == memory
    assert s.grads() == grads
    assert s.summary() == summary
    assert len(s) == len(memory["step"])
    return s


def _run(record: Path, mode: str, steps: int, env: dict[str, str] | None = None) -> None:
    res = subprocess.run(
        [sys.executable, str(SCRIPT), str(record), mode, str(steps)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real training run recorded by ``torchscope.watch``."""
    record = tmp_path_factory.mktemp("watched") / "run.tscope"
    _run(record, "watch", 120)
    return record


def test_files_real_run_series_equal_the_step_events(watched: Path) -> None:
    version, frames = index(watched)
    assert version == SCHEMA_VERSION and version >= (1, 1)  # series frames since 1.1
    parts = {series_part(f) for f in frames if f.flags & FLAG_SERIES}
    assert parts == set(series.PARTS)
    s = _assert_series_match(watched)
    assert len(s) == 120 and s.memory()["step"] == list(range(120))
    assert s.memory()["live"][0] > 0 and s.grads()["params"] == [p["name"] for p in s.meta["params"]]
    assert all(v is not None and v > 0 for v in s.grads()["total_norm"])
    # series records are derived data, not events: neither the reader nor the codec yields them
    assert not [e for e in s.events() if e["kind"] == "series"]
    assert not [e for e in iter_events(watched) if e["kind"] == "series"]
    assert sum(1 for e in s.events() if e["kind"] == "step") == 120
    # each record names its rank, so consumers that group records by rank file it right
    records = [e for evs in read_frames(watched, [f for f in frames if f.flags & FLAG_SERIES]) for e in evs]
    assert {r["part"] for r in records} == set(series.PARTS) and {r["rank"] for r in records} == {0}


def test_files_memory_reads_only_its_series_frames(watched: Path) -> None:
    """The kernel's byte count: memory() reads the memory-part frames and nothing else (the
    file closed normally, so no step frame lies after the last series frame)."""
    _, frames = index(watched)
    for part, read in (("memory", Session.memory), ("grads", Session.grads)):
        s = load(watched)
        before = _rchar()
        read(s)
        used = _rchar() - before
        # (+ at most the few hundred bytes of reading /proc/self/io itself)
        expect = sum(FRAME_HEADER_SIZE + f.length for f in frames if series_part(f) == part)
        assert expect <= used <= expect + 300
    steps_bytes = sum(
        FRAME_HEADER_SIZE + f.length for f in frames if not f.flags & (FLAG_SERIES | FLAG_GRAPH)
    )
    memory_bytes = sum(FRAME_HEADER_SIZE + f.length for f in frames if series_part(f) == "memory")
    assert memory_bytes < steps_bytes / 3


def test_files_transport_run_series_equal_the_step_events(tmp_path: Path) -> None:
    """The Transport alone (steps with sparse fields: absent values must stay None)."""
    record = tmp_path / "t.tscope"
    _run(record, "transport", 80)
    s = _assert_series_match(record)
    assert s.memory()["peak"] == [None] * 80 and s.memory()["live"] == [1000 + i for i in range(80)]


def test_files_file_without_series_frames_still_loads(tmp_path: Path, watched: Path) -> None:
    """A 1.0 file (no series frames): the same series, from the step events."""
    old = tmp_path / "old.tscope"
    with open(old, "wb") as out:
        out.write(file_header((1, 0)))
        _, frames = index(watched)
        with open(watched, "rb") as src:
            seq = 0
            for f in frames:
                if f.flags & FLAG_SERIES:
                    continue
                src.seek(f.offset)
                raw = bytearray(src.read(FRAME_HEADER_SIZE + f.length))
                raw[12:16] = seq.to_bytes(4, "little")  # renumber: the seq chain has no gaps
                out.write(raw)
                seq += 1
    version, frames = index(old)
    assert version == (1, 0) and not any(f.flags & FLAG_SERIES for f in frames)
    s = _assert_series_match(old)
    assert s.memory() == load(watched).memory() and s.grads() == load(watched).grads()
    assert s.summary() == load(watched).summary() and len(s) == 120


@pytest.fixture(scope="module")
def rewritten(watched: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real run's frames written again with series frames after every third step frame
    (the transport writes them every 256 steps, more than this short run has)."""
    path = tmp_path_factory.mktemp("rewritten") / "run.tscope"
    w = SessionFileWriter(path)
    _, frames = index(watched)
    plain = [f for f in frames if not f.flags & FLAG_SERIES]
    for i, events in enumerate(read_frames(watched, plain)):
        w.append(events)
        if i % 3 == 2:
            w.append_series()
    w.append_series()
    w.close(fsync=False)
    return path


def test_files_cut_file_has_series_up_to_its_last_whole_frame(tmp_path: Path, rewritten: Path) -> None:
    """What a SIGKILL leaves, at every frame boundary and inside every frame: the series
    always equal the step events that survived (series frames for the flushes that completed,
    the step events of the flushes after them)."""
    data = rewritten.read_bytes()
    _, frames = index(rewritten)
    assert sum(1 for f in frames if series_part(f) == "memory") >= 3
    cut = tmp_path / "cut.tscope"
    survivors = []
    for f in frames[1:]:
        for size in (f.offset, f.offset + FRAME_HEADER_SIZE + f.length // 2):
            cut.write_bytes(data[:size])
            s = _assert_series_match(cut)
            assert s.memory()["step"] == list(range(len(s)))  # a prefix, in order
            survivors.append(len(s))
    assert survivors == sorted(survivors) and survivors[0] < survivors[-1] == 120


def test_files_writer_keeps_no_step_event_until_its_series_frame(tmp_path: Path, watched: Path) -> None:
    """The writer encodes a flush's series rows as it writes the flush, and lets the step
    events go: it used to keep up to 256 of them per part and encode them all at the series
    frame, holding the GIL for 10-25 ms on the writer thread (a stall of the training step
    running then, every 256 steps).  The series frame it writes later is the same."""
    _, frames = index(watched)
    plain = [events for events in read_frames(watched, [f for f in frames if not f.flags & FLAG_SERIES])]
    w = SessionFileWriter(tmp_path / "again.tscope")
    held = []
    for events in plain:
        before = [sys.getrefcount(e) for e in events]
        w.append(events)
        after = [sys.getrefcount(e) for e in events]
        held += [a - b for a, b in zip(after, before, strict=True)]
    assert w.series_pending == 120
    assert held and set(held) == {0}  # no reference to any event outlives append()
    w.append_series()
    w.close(fsync=False)
    s = _assert_series_match(tmp_path / "again.tscope")
    assert s.memory() == load(watched).memory() and s.grads() == load(watched).grads()
    assert s.summary() == load(watched).summary()


def test_files_killed_training_run_keeps_its_series(tmp_path: Path) -> None:
    """A real run killed mid-flight (SIGKILL) after the transport wrote series frames: the
    file opens and its series cover every step event in its whole frames.  (The ``watch``
    path's kills are in test_files_kill.py, which checks the series too.)"""
    record = tmp_path / "killed.tscope"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(record), "transport"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("STEP ") and int(line.split()[1]) >= 700:  # past two series flushes
                break
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    s = _assert_series_match(record)
    assert len(s) >= 500 and s.status == "ended unexpectedly"
    assert sum(1 for f in index(record)[1] if series_part(f) == "memory") >= 2


def test_files_series_frames_go_to_the_server_unchanged(tmp_path: Path) -> None:
    """The server stores series frames like any other (same seq chain): it has every frame of
    the file, its memory columns equal the file's, and its export holds the very frames."""
    server = ServerProc(tmp_path / "data").start()
    try:
        record = tmp_path / "live.tscope"
        _run(record, "watch", 60, env={"TSCOPE_TEST_SERVER": server.url})
        s = load(record)
        info = server.get(f"/api/sessions/{s.session_id}")
        assert isinstance(info, dict) and info["steps"] == 60 and info["status"] == "finished"
        mem = server.get(f"/api/sessions/{s.session_id}/memory")
        assert isinstance(mem, dict)
        ours = s.memory()
        assert {k: mem[k] for k in ("step", "live", "peak", "params", "grads")} == {
            k: ours[k] for k in ("step", "live", "peak", "params", "grads")
        }
        with open(record, "rb") as f:
            f.seek(HEADER_SIZE)
            file_frames = f.read()
        with urllib.request.urlopen(f"{server.url}/api/sessions/{s.session_id}/export", timeout=10) as resp:
            exported = resp.read()
        assert exported[HEADER_SIZE:] == file_frames
    finally:
        server.stop()


# ----------------------------------------------------------------------------- hostile series frames
def _raw(payload: bytes, seq: int, n: int, flags: int, lo: int, hi: int) -> bytes:
    return _FRAME.pack(FRAME_TAG, len(payload), zlib.crc32(payload), seq, n, flags, lo, hi) + payload


def _hostile_file(
    path: Path, record: Any, flags: int = FLAG_SERIES, n: int = 1, steps: tuple[int, int] | None = None
) -> Path:
    """A session frame, two step frames, then one crafted series frame and an end frame."""
    w = SessionFileWriter(path)
    w.append([SESSION])
    w.append(
        [
            {"kind": "step", "step": i, "t": 1.0 + i, "memory": {"live": i}, "grads": {"norm": [1.0, 2.0]}}
            for i in range(3)
        ]
    )
    w.close(fsync=False)
    body = record if isinstance(record, bytes) else json.dumps(record).encode()
    lo, hi = steps or (0, 2)
    end = zlib.compress(json.dumps({"kind": "end", "status": "finished"}).encode())
    with open(path, "ab") as f:
        f.write(_raw(zlib.compress(body), 2, n, flags, lo, hi) + _raw(end, 3, 1, 0, -1, -1))
    return path


def _good(part: str = "memory") -> dict[str, Any]:
    steps = [
        {"kind": "step", "step": i, "t": 1.0 + i, "memory": {"live": i}, "grads": {"norm": [1.0, 2.0]}}
        for i in range(3)
    ]
    return {"kind": "series", "part": part, "columns": series.columns(steps, part)}


def _read_everything(path: Path) -> None:
    s = load(path)
    s.memory()
    s.grads()
    s.summary()
    len(s)
    list(s.events())


def _one_line_error(path: Path) -> str:
    return one_line_error(_read_everything, path)


def test_files_crafted_good_series_frame_reads(tmp_path: Path) -> None:
    """The crafting itself is sound: an honest series frame made this way reads."""
    for part, flags in SERIES_FLAGS.items():
        _read_everything(_hostile_file(tmp_path / f"{part}.tscope", _good(part), flags))
        assert load(tmp_path / f"{part}.tscope").memory()["live"] == [0, 1, 2]


def _bad_lengths() -> dict[str, Any]:
    r = _good()
    r["columns"]["live"] = [1, 2]
    return r


def _bad_type() -> dict[str, Any]:
    r = _good()
    r["columns"]["t"] = ["yesterday", 2.0, 3.0]
    return r


def _bad_item() -> dict[str, Any]:
    r = _good("grads")
    r["columns"]["norm"] = [[1.0, "x"], None, None]
    return r


def _missing() -> dict[str, Any]:
    r = _good()
    del r["columns"]["peak"]
    return r


def _bool_step() -> dict[str, Any]:
    r = _good("steps")
    r["columns"]["graph_captured"] = [1, 0, 1]
    return r


@pytest.mark.parametrize(
    ("record", "flags", "n", "steps", "expect"),
    [
        (_bad_lengths(), FLAG_SERIES, 1, None, "has 2 rows, not 3"),
        (_bad_type(), FLAG_SERIES, 1, None, "column 't' holds a value of the wrong type"),
        (_bad_item(), FLAG_SERIES | FLAG_SERIES_GRADS, 1, None, "column 'norm' holds a value"),
        (_missing(), FLAG_SERIES, 1, None, "lacks the column 'peak'"),
        (_bool_step(), FLAG_SERIES | FLAG_SERIES_STEPS, 1, None, "'graph_captured'"),
        ({**_good(), "columns": [[0, 1, 2]]}, FLAG_SERIES, 1, (-1, -1), "has no columns"),
        (_good(), FLAG_SERIES, 2, None, "impossible flags"),  # a count that lies
        (_good(), FLAG_SERIES, 0, None, "impossible flags"),
        (_good(), FLAG_SERIES_GRADS, 1, None, "impossible flags"),  # a part bit alone
        (_good(), FLAG_SERIES | FLAG_SERIES_STEPS | FLAG_SERIES_GRADS, 1, None, "impossible flags"),
        (_good(), FLAG_SERIES | FLAG_GRAPH, 1, (1, 1), "impossible flags"),
        # the header says grads, the record is the memory part
        (_good(), FLAG_SERIES | FLAG_SERIES_GRADS, 1, None, "does not match"),
        (_good(), 0, 1, None, "does not match"),  # a series record in a step frame
        (_good(), FLAG_SERIES, 1, (0, 7), "does not match"),  # a step range that lies
        ({**_good(), "part": "everything"}, FLAG_SERIES, 1, None, "does not match"),
        ([_good()], FLAG_SERIES, 1, (-1, -1), "without a kind"),
        (b"[" * 100_000, FLAG_SERIES, 1, (-1, -1), "not JSON"),
    ],
    ids=[
        "lengths",
        "type",
        "item-type",
        "missing",
        "bool",
        "no-columns",
        "count-2",
        "count-0",
        "part-alone",
        "two-parts",
        "with-graph",
        "wrong-part",
        "plain-frame",
        "step-range",
        "unknown-part",
        "not-object",
        "deep",
    ],
)
def test_files_hostile_series_frames(
    tmp_path: Path, record: Any, flags: int, n: int, steps: tuple[int, int] | None, expect: str
) -> None:
    msg = _one_line_error(_hostile_file(tmp_path / "bad.tscope", record, flags, n, steps))
    assert expect in msg


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["step", "t", "live", "x"]), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(columns=json_values, part=st.sampled_from(sorted(series.PARTS)))
def test_files_random_series_columns_never_crash(tmp_path: Path, columns: Any, part: str) -> None:
    """Any columns in an otherwise well-formed series frame: they read, or one SessionFileError."""
    record = {"kind": "series", "part": part, "columns": columns}
    # the header the codec would write, so that the columns themselves are what is tested
    path = _hostile_file(tmp_path / "r.tscope", record, SERIES_FLAGS[part], 1, _step_range([record]))
    try:
        _read_everything(path)
    except SessionFileError as exc:
        assert "\n" not in str(exc)


def test_grads_part_carries_not_trained_and_reads_records_written_before_it() -> None:
    """``not_trained`` (parameters no optimizer trains: no gradient by design) is a grads column
    added after format 1.1: written and read back, and absent in an older record, where every
    step reads as none not trained instead of the record being refused."""
    steps = [{"kind": "step", "step": i, "grads": {"norm": [None, 1.0], "none": [0], "not_trained": [0]}}
             for i in range(2)]
    cols = series.columns(steps, "grads")
    assert cols["not_trained"] == [[0], [0]]
    params = [{"name": "frozen.weight"}, {"name": "head.weight"}]
    assert series.grads_from_columns(series.check_columns(cols, "grads"), params)["not_trained"] == [[0], [0]]
    older = {k: v for k, v in cols.items() if k != "not_trained"}
    read = series.grads_from_columns(series.check_columns(older, "grads"), params)
    assert read["not_trained"] == [[], []] and read["none"] == [[0], [0]]


def test_memory_part_carries_graphs_alive_and_reads_records_written_before_it() -> None:
    """``graphs_alive`` (P7's autograd nodes of earlier steps still alive) is a memory column
    added after format 1.1: written and read back, None per step in an older record."""
    steps = [{"kind": "step", "step": i, "graphs_alive": 5 * i, "memory": {"live": 100}} for i in range(3)]
    cols = series.columns(steps, "memory")
    assert series.check_columns(cols, "memory")["graphs_alive"] == [0, 5, 10]
    older = {k: v for k, v in cols.items() if k != "graphs_alive"}
    read = series.check_columns(older, "memory")
    assert read["graphs_alive"] == [None, None, None] and read["live"] == [100, 100, 100]


def test_memory_part_carries_the_bytes_forward_hooks_keep() -> None:
    """``hook_bytes`` (P13: what user forward hooks keep, all modules together) is a memory
    column added after format 1.1, summed from ``StepEvent.hooks``; None where an event has no
    such map and in a record written before the column."""
    steps = [{"kind": "step", "step": i, "hooks": {"enc": 1000 * i, "head": 24}, "memory": {"live": 100}}
             for i in range(3)] + [{"kind": "step", "step": 3, "memory": {"live": 100}}]
    cols = series.columns(steps, "memory")
    assert series.check_columns(cols, "memory")["hook_bytes"] == [24, 1024, 2024, None]
    older = {k: v for k, v in cols.items() if k != "hook_bytes"}
    assert series.check_columns(older, "memory")["hook_bytes"] == [None] * 4


def test_memory_part_carries_what_kept_graphs_hold() -> None:
    """``kept`` (1.6, P7: bytes saved for backward by earlier steps' graphs still alive) is a
    memory column from ``MemoryStats.kept``; a record written before it (1.5) reads as None in
    every row, not as a broken record."""
    steps = [{"kind": "step", "step": i, "memory": {"live": 100, **({"kept": 512 * i} if i else {})}} for i in range(3)]
    cols = series.columns(steps, "memory")
    assert series.check_columns(cols, "memory")["kept"] == [None, 512, 1024]
    older = {k: v for k, v in cols.items() if k != "kept"}
    read = series.check_columns(older, "memory")
    assert read["kept"] == [None, None, None] and read["live"] == [100, 100, 100]
