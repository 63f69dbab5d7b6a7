"""The server's fast paths give the same answers as the plain ones: one-pass JSON validation
of frames (vs the file reader + schema), stored /memory chunks (vs the SQL build over every
step row), and /grads sampling of a long run (vs asking each step).  Real codec, real SQLite."""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from server_helpers import graph_event, session_event, step_event

from torchscope.series import memory_series
from torchscope.server import graphcheck
from torchscope.server.app import create_app
from torchscope.server.config import Settings
from torchscope.server.frames import BadFrames, split_frames
from torchscope.server.store import Store
from torchscope.sessionfile import _FRAME, FRAME_TAG, decode_frame, encode_frame

BASE = "http://127.0.0.1:6150"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(data_dir=tmp_path / "data")), base_url=BASE) as c:
        yield c


def _post(c: TestClient, sid: str, frames: list[bytes]) -> Any:
    res = c.post(f"/api/ingest/{sid}/0", content=b"".join(frames))
    assert res.status_code == 200, res.text
    return res.json()


def _frame_of_lines(seq: int, lines: list[bytes], n_events: int, lo: int = -1, hi: int = -1) -> bytes:
    """A frame with a hand-made payload (the encoder only writes good ones)."""
    payload = zlib.compress(b"\n".join(lines))
    return _FRAME.pack(FRAME_TAG, len(payload), zlib.crc32(payload), seq, n_events, 0, lo, hi) + payload


def test_frames_fast_path_equals_reader(tmp_path: Path) -> None:
    step = step_event(3)
    step["loss"] = float("nan")
    step["new_minor_field"] = {"kept": [1, 2]}  # a field a newer minor version adds
    events = [session_event("fp"), step, {"kind": "telemetry", "x": 1}, {"kind": "log", "t": 1.0, "message": "hi"}]
    frames = [encode_frame(0, events), encode_frame(1, [graph_event(3, n_ops=50)])]
    got = split_frames(b"".join(frames))
    for frame, raw in zip(got, frames, strict=True):
        want = [graphcheck.summary(ev) if ev["kind"] == "graph" else ev for ev in decode_frame(raw)[1]]
        assert len(frame.events) == len(want)
        for a, b in zip(frame.events, want, strict=True):
            # NaN != NaN: compare the JSON texts, which also shows every extra field was kept
            assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert got[1].events == [{"kind": "graph", "step": 3, "micro": 0, "n_ops": 50, "n_nodes": 50}]
    assert math.isnan(got[0].events[1]["loss"])
    assert got[0].events[2] == {"kind": "telemetry", "x": 1}  # unknown kind: stored raw


@pytest.mark.parametrize(("lines", "n", "needle"), [
    ([b'{"kind":"step","step":"three"}'], 1, "invalid step event: step"),
    ([b'{"kind":"graph","step":1,"ops":[{"id":1,"inputs":[1,"x"]}]}'], 1, "invalid graph event: ops.0.inputs.1"),
    ([b'{"kind":"step","step":1'], 1, "not JSON"),
    ([b'{"kind":"log"},{"kind":"log"}'], 2, "not JSON"),  # two records on one line
    ([b'{"kind":"log","message":"a', b'b"}'], 1, "not JSON"),  # one record over two lines
    ([b'[1,2]'], 1, "without a kind"),
    ([b'{"kind":"log"}', b'{"kind":"log"}'], 3, "event count mismatch"),
])
def test_frames_fast_path_refuses_what_the_reader_refuses(lines: list[bytes], n: int, needle: str) -> None:
    raw = _frame_of_lines(0, lines, n, *((1, 1) if b'"step":1' in lines[0] else (-1, -1)))
    with pytest.raises(BadFrames, match=needle):
        split_frames(raw)


def _store_steps(store: Store, sid: str, batches: list[list[int]]) -> list[dict[str, Any]]:
    events = []
    frames = [encode_frame(0, [session_event(sid)])]
    for i, steps in enumerate(batches, start=1):
        evs = [step_event(s) for s in steps]
        for ev in evs:
            ev["memory"]["device"] = {"allocated": 7 * ev["step"], "reserved": 1 << 40}
        if steps and steps[0] == 4:
            evs[0]["t"] = float("inf")  # non-finite floats are written as api_json writes them
        events += evs
        frames.append(encode_frame(i, evs))
    store.ingest(sid, 0, split_frames(b"".join(frames))).result()
    return events


def test_memory_chunks_equal_sql_build_and_series(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    try:
        # "in order": the capture's order, answered from the stored chunks; "replayed": a step
        # that arrives twice sends the rank to the SQL build over the step rows
        ordered = _store_steps(store, "in-order", [[0, 1, 2], [3], [4, 5, 6, 7]])
        _store_steps(store, "replayed", [[0, 1, 2], [3], [4, 5, 6, 7]])
        store.ingest("replayed", 0, split_frames(encode_frame(4, [step_event(2)]))).result()
        fast = json.loads(store.memory_json("in-order", 0))
        slow = json.loads(store.memory_json("replayed", 0))
        want = memory_series(ordered)
        want["t"][4] = "Infinity"
        assert fast == want
        assert slow["step"] == list(range(8))
        assert slow["t"][4] is None  # the SQL build cannot write an infinity: null, still JSON
        slow["t"][4] = "Infinity"
        slow["allocated"][2], slow["reserved"][2] = fast["allocated"][2], fast["reserved"][2]  # the replay lacks them
        assert slow == fast
        assert json.loads(store.memory_json("nope", 0))["step"] == []
    finally:
        store.close()


def test_grads_samples_long_runs_evenly(client: TestClient) -> None:
    n = 250
    frames = [encode_frame(0, [session_event("g")])]
    frames += [encode_frame(1 + i, [step_event(s) for s in range(i * 50, i * 50 + 50)]) for i in range(n // 50)]
    _post(client, "g", frames)
    every = client.get("/api/sessions/g/grads?max_steps=1000").json()
    assert every["steps"] == list(range(n)) and every["stride"] == 1 and every["total_steps"] == n
    sampled = client.get("/api/sessions/g/grads?max_steps=100").json()
    assert sampled["stride"] == 3 and sampled["total_steps"] == n
    # of each 3 steps the largest gradient norm: here (norms grow) the last of each, and the
    # range's first step besides (its last, 249, is its bucket's largest)
    assert sampled["steps"] == [0] + [min(k + 2, n - 1) for k in range(0, n, 3)]
    assert len(sampled["steps"]) <= 100
    # a sampled step's columns are that step's own
    assert sampled["norm"][6] == every["norm"][17] == [0.5 + 17, None]
    window = client.get("/api/sessions/g/grads?start=100&end=199&max_steps=50").json()
    assert window["steps"] == [100, *range(102, 200, 3), 199] and window["total_steps"] == 100
    assert window["stride"] == 3
    assert len(window["steps"]) <= 50
    assert client.get("/api/sessions/g/grads?max_steps=0").status_code == 422


def test_sampled_grads_keep_a_spike_and_a_nan(client: TestClient) -> None:
    """A long run's gradient charts show one step of every few: the one with the largest total
    norm, a non-finite one above all -- not every stride-th step, which drew a 1e6x explosion
    the doctor named as a flat line (QA 48b)."""
    n = 400
    events = []
    for s in range(n):
        ev = step_event(s)
        ev["grads"]["norm"] = [1.0 + (s % 7) / 100, None]
        if s == 101:
            ev["grads"]["norm"] = [1e6, None]
        if s == 250:
            ev["grads"]["norm"] = [math.nan, None]
            ev["grads"]["nan"] = [3, 0]
        events.append(ev)
    frames = [encode_frame(0, [session_event("sp")])]
    frames += [encode_frame(1 + i, events[i * 50:i * 50 + 50]) for i in range(n // 50)]
    _post(client, "sp", frames)
    sampled = client.get("/api/sessions/sp/grads?max_steps=100").json()
    assert sampled["stride"] == 5 and len(sampled["steps"]) <= 100
    assert 101 in sampled["steps"] and 250 in sampled["steps"]
    # the range's first and last steps are drawn whatever their norm: the chart's axis spans
    # the run, and a live chart's right edge is the step just made
    assert sampled["steps"][0] == 0 and sampled["steps"][-1] == n - 1
    assert max(v for v in sampled["total_norm"] if isinstance(v, float)) == 1e6
    # elsewhere each bucket's largest of its five: the 7-step pattern's peak where it falls
    every = client.get("/api/sessions/sp/grads?max_steps=1000").json()
    buckets = {s: every["total_norm"][s // 5 * 5:s // 5 * 5 + 5] for s in range(n)}
    for k, step in enumerate(sampled["steps"]):
        if step not in (0, n - 1, 101, 250):
            assert sampled["total_norm"][k] == max(buckets[step]), (step, buckets[step])
    assert len([s for s in sampled["steps"] if s not in (0, n - 1)]) == n // 5


@pytest.mark.parametrize("column", ["graphs_alive", "hook_bytes"])
def test_a_store_of_an_earlier_build_answers_memory_with_the_new_column(tmp_path: Path, column: str) -> None:
    """A store written before the memory series had ``column`` (no m_<column> step column;
    stored /memory texts one column short) is reopened by this build: the column is added,
    the stale texts dropped, and /memory answers every column -- the old steps' new one as
    null -- with nothing else lost."""
    import sqlite3

    path = tmp_path / "db.sqlite"
    store = Store(path)
    try:
        want = memory_series(_store_steps(store, "old", [[0, 1, 2], [3]]))
    finally:
        store.close()
    at = list(want).index(column) - 2  # the chunks hold the columns after step and t
    with sqlite3.connect(path) as c:  # as the earlier build left it
        c.execute(f"ALTER TABLE steps DROP COLUMN m_{column}")
        for key, cols in c.execute("SELECT rowid, cols FROM memory_chunks").fetchall():
            short = [v for i, v in enumerate(json.loads(cols)) if i != at]
            c.execute("UPDATE memory_chunks SET cols=? WHERE rowid=?", (json.dumps(short), key))
    store = Store(path)
    try:
        got = json.loads(store.memory_json("old", 0))
        assert got.pop(column) == [None] * 4
        assert got == {k: v for k, v in want.items() if k != column}
    finally:
        store.close()
