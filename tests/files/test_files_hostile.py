"""A session file someone sends you is data, never code: every broken, foreign or hostile
file gives one clear ``SessionFileError`` line, and a torn tail (a killed writer) is dropped."""

from __future__ import annotations

import json
import os
import pickle
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import one_line_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchscope.schema import MAX_EVENT_BYTES
from torchscope.session import load
from torchscope.sessionfile import (
    _FRAME,
    FLAG_GRAPH,
    FRAME_HEADER_SIZE,
    FRAME_TAG,
    HEADER_SIZE,
    SessionFileError,
    SessionFileWriter,
    _step_range,
    file_header,
    index,
)

SESSION = {"kind": "session", "session_id": "sid", "name": "hostile", "rank": 0,
           "params": [{"name": "w", "module": ""}]}


def _write(path: Path, n_steps: int = 30, per_frame: int = 5) -> Path:
    w = SessionFileWriter(path)
    w.append([SESSION])
    for lo in range(0, n_steps, per_frame):
        w.append([{"kind": "step", "step": s, "loss": 1.0 / (s + 1), "grads": {"norm": [float(s)]},
                   "memory": {"live": s}} for s in range(lo, min(lo + per_frame, n_steps))])
        w.append([{"kind": "graph", "step": lo, "ops": [{"id": 0, "name": "aten::mm"}]}])
    w.append([{"kind": "end", "status": "finished", "steps": n_steps}])
    w.close()
    return path


def _read_all(path: Path) -> tuple[int, int]:
    """Everything a reader can touch; returns (steps, events)."""
    s = load(path)
    for n in s.graph_steps:
        s.graph(n)
    repr(s)
    return len(s.steps), sum(1 for _ in s.events())


def _one_line_error(path: Path) -> str:
    return one_line_error(_read_all, path)


def _raw_frame(payload: bytes, seq: int, n: int, flags: int = 0, lo: int = -1, hi: int = -1) -> bytes:
    return _FRAME.pack(FRAME_TAG, len(payload), zlib.crc32(payload), seq, n, flags, lo, hi) + payload


def _session_frame(seq: int = 0) -> bytes:
    return _raw_frame(zlib.compress(json.dumps(SESSION).encode()), seq, 1)


def test_files_good_file_reads(tmp_path: Path) -> None:
    assert _read_all(_write(tmp_path / "ok.tscope")) == (30, 1 + 30 + 6 + 1)


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        (b"", "empty"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "not a torchscope session file"),
        (b"step,loss\n0,1.0\n", "not a torchscope session file"),
        (b"\x89TSCOPE", "not a torchscope session file"),  # shorter than the header
        (file_header((2, 0)) + b"\0" * 40, "newer torchscope"),
        (file_header(), "holds no records"),
    ],
)
def test_files_foreign_empty_future(tmp_path: Path, content: bytes, expect: str) -> None:
    p = tmp_path / "f.tscope"
    p.write_bytes(content)
    assert expect in _one_line_error(p)


def test_files_missing_and_directory(tmp_path: Path) -> None:
    assert "no such file" in _one_line_error(tmp_path / "nope.tscope")
    assert "directory" in _one_line_error(tmp_path)


def test_files_torn_tail_is_dropped_at_every_cut(tmp_path: Path) -> None:
    src = _write(tmp_path / "src.tscope", n_steps=15).read_bytes()
    _, frames = index(tmp_path / "src.tscope")
    first_end = frames[0].offset + FRAME_HEADER_SIZE + frames[0].length
    cut = tmp_path / "cut.tscope"
    complete_before: list[int] = []
    for size in range(len(src) - 1, -1, -1):
        cut.write_bytes(src[:size])
        if size < first_end:
            _one_line_error(cut)  # not even the session record survived
            continue
        s = load(cut)
        steps = [e["step"] for e in s.steps]
        assert steps == list(range(len(steps)))  # a prefix, in order
        assert s.status == "ended unexpectedly" or size == len(src)
        complete_before.append(len(steps))
    assert complete_before[0] == 15 and complete_before[-1] == 0


def test_files_zero_filled_tail_is_a_torn_tail(tmp_path: Path) -> None:
    p = _write(tmp_path / "z.tscope")
    with open(p, "ab") as f:
        f.write(b"\0" * 4096)  # what a crashed file system can leave after the last write
    assert _read_all(p)[0] == 30


def test_files_flipped_bytes_are_reported(tmp_path: Path) -> None:
    p = _write(tmp_path / "src.tscope", n_steps=10)
    src = p.read_bytes()
    _, frames = index(p)
    last = frames[-1].offset
    bad = tmp_path / "flip.tscope"
    reported = 0
    # every byte of every frame but the last (a damaged last frame is a torn tail by design)
    for pos in range(HEADER_SIZE, last):
        data = bytearray(src)
        data[pos] ^= 0x5A
        bad.write_bytes(bytes(data))
        try:
            _read_all(bad)
        except SessionFileError as exc:
            assert "\n" not in str(exc)
            reported += 1
            continue
        raise AssertionError(f"flipped byte at {pos} went unnoticed")
    assert reported == last - HEADER_SIZE


def test_files_oversized_counts(tmp_path: Path) -> None:
    p = tmp_path / "big.tscope"
    payload = zlib.compress(b"{}")
    huge = _FRAME.pack(FRAME_TAG, 1 << 31, zlib.crc32(payload), 1, 1, 0, -1, -1) + payload + b"x" * 100
    many = _FRAME.pack(FRAME_TAG, len(payload), zlib.crc32(payload), 1, 1 << 30, 0, -1, -1) + payload + b"x" * 100
    for frame in (huge, many):
        p.write_bytes(file_header() + _session_frame() + frame)
        assert "size limits" in _one_line_error(p)


def test_files_decompression_bomb_is_bounded(tmp_path: Path) -> None:
    comp = zlib.compressobj(1)
    chunk = b" " * (1 << 20)
    payload = b"".join(comp.compress(chunk) for _ in range(MAX_EVENT_BYTES // len(chunk) + 2)) + comp.flush()
    p = tmp_path / "bomb.tscope"
    p.write_bytes(file_header() + _session_frame() + _raw_frame(payload, 1, 1) + _session_frame(2))
    assert "size limits" in _one_line_error(p)


class _Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch PWNED",))


def test_files_pickle_is_never_unpickled(tmp_path: Path) -> None:
    p = tmp_path / "pickle.tscope"
    for payload in (pickle.dumps(_Boom()), pickle.dumps({"kind": "step", "step": 0})):
        p.write_bytes(file_header() + _session_frame() + _raw_frame(zlib.compress(payload), 1, 1))
        old = os.getcwd()
        os.chdir(tmp_path)
        try:
            assert "not JSON" in _one_line_error(p)
        finally:
            os.chdir(old)
        assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(
    ("record", "expect"),
    [
        (b"[" * 100_000, "not JSON"),
        (b'{"kind": "step", "step": 1, "loss": "high"}', "'loss'"),
        (b'{"kind": "step", "step": 1.5}', "'step'"),
        (b'{"kind": "format-c"}', "unknown record kind"),
        (b'{"step": 3}', "without a kind"),
        (b'{"kind": "session", "session_id": 7}', "session_id"),
        (b'{"kind": "step", "step": 1, "grads": {"nan": ["x"]}}', "'grads'"),
    ],
    ids=["deep", "loss-type", "step-type", "kind", "no-kind", "session-id", "nested"],
)
def test_files_records_are_validated(tmp_path: Path, record: bytes, expect: str) -> None:
    p = tmp_path / "bad.tscope"
    try:
        lo, hi = _step_range([json.loads(record)])
    except (ValueError, RecursionError, AttributeError):
        lo = hi = -1
    p.write_bytes(file_header() + _session_frame() + _raw_frame(zlib.compress(record), 1, 1, 0, lo, hi))
    assert expect in _one_line_error(p)


def test_files_header_must_match_payload(tmp_path: Path) -> None:
    step = zlib.compress(json.dumps({"kind": "step", "step": 5}).encode())
    p = tmp_path / "lie.tscope"
    for flags, lo, hi in ((FLAG_GRAPH, 5, 5), (0, 7, 7)):
        p.write_bytes(file_header() + _session_frame() + _raw_frame(step, 1, 1, flags, lo, hi) + _session_frame(2))
        assert "does not match" in _one_line_error(p)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=600), keep=st.integers(min_value=0, max_value=3))
def test_files_random_bytes_never_crash(tmp_path: Path, data: bytes, keep: int) -> None:
    """Any bytes after a valid prefix either read or give a SessionFileError, nothing else."""
    good = _write(tmp_path / "g.tscope").read_bytes()
    _, frames = index(tmp_path / "g.tscope")
    cut = frames[keep].offset
    p = tmp_path / "r.tscope"
    p.write_bytes(good[:cut] + data)
    try:
        _read_all(p)
    except SessionFileError as exc:
        assert "\n" not in str(exc)


def test_files_frame_struct_is_documented_size() -> None:
    assert struct.calcsize("<8sHHI") == HEADER_SIZE == 16 and FRAME_HEADER_SIZE == 40
