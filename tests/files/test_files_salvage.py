"""One damaged frame in the middle of a file no longer makes the whole file unreadable for the
readers that read it whole (`torchscope info`, the doctor, an import): ``sessionfile.salvage``
keeps the frames before it and says what was dropped, never silently."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXAMPLES, run_script

from torchscope.sessionfile import (
    FLAG_SERIES,
    FRAME_HEADER_SIZE,
    HEADER_SIZE,
    SessionFileError,
    SessionFileWriter,
    index,
    iter_events,
    raw_frames,
    read_frames,
    salvage,
    torn_bytes,
)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session file written by a real training run (full mode: a graph frame every step)."""
    record = tmp_path_factory.mktemp("run") / "mlp.tscope"
    run_script(EXAMPLES / "mlp.py", "--steps", "12", "--server", "none", "--record", str(record), "--mode", "full")
    return record


def _flip(src: Path, dst: Path, pos: int) -> Path:
    data = bytearray(src.read_bytes())
    data[pos] ^= 0xFF
    dst.write_bytes(bytes(data))
    return dst


def test_a_damaged_middle_frame_keeps_the_frames_before_it(real_run: Path, tmp_path: Path) -> None:
    _, frames = index(real_run)
    middle = frames[len(frames) // 2]
    bad = _flip(real_run, tmp_path / "bad.tscope", middle.offset + FRAME_HEADER_SIZE + middle.length // 2)
    found = salvage(bad)
    assert found.frames == frames[: len(frames) // 2]
    assert (found.damage, found.damage_at) == ("frame checksum mismatch", middle.offset)
    assert found.dropped == torn_bytes(bad) == bad.stat().st_size - middle.offset
    assert found.note("bad.tscope") == (
        f"bad.tscope is damaged at byte {middle.offset:,} (frame checksum mismatch): the "
        f"{found.dropped:,} bytes from there to its end were dropped; the {len(found.frames):,} frames before it are read"
    )
    # the events the doctor reads are exactly those of the frames kept
    kept = [ev for evs in read_frames(real_run, [f for f in found.frames if not f.flags & FLAG_SERIES]) for ev in evs]
    assert list(iter_events(bad)) == kept and kept[0]["kind"] == "session"
    assert [len(r) for r in raw_frames(bad)] == [FRAME_HEADER_SIZE + f.length for f in found.frames]


def test_a_broken_header_in_the_middle_is_damage_too(real_run: Path, tmp_path: Path) -> None:
    _, frames = index(real_run)
    middle = frames[len(frames) // 3]
    bad = _flip(real_run, tmp_path / "tag.tscope", middle.offset)  # the frame tag: the chain breaks
    found = salvage(bad)
    assert found.frames == frames[: len(frames) // 3]
    assert (found.damage, found.damage_at) == ("bad frame tag", middle.offset)
    with pytest.raises(SessionFileError, match=f"corrupt at byte {middle.offset}: bad frame tag"):
        index(bad)  # load()'s header walk still refuses it: only the whole-file readers salvage


def test_a_torn_tail_is_still_a_torn_tail(real_run: Path, tmp_path: Path) -> None:
    data = real_run.read_bytes()
    cut = tmp_path / "cut.tscope"
    cut.write_bytes(data[:-100])
    found = salvage(cut)
    assert found.damage is None and found.frames == index(cut)[1]
    assert found.note("cut.tscope") == (
        f"cut.tscope is incomplete: the {found.dropped:,} bytes after its last whole frame were dropped "
        "(the run was killed, or the file was cut short)"
    )
    zeros = tmp_path / "zeros.tscope"
    zeros.write_bytes(data + b"\0" * 4096)
    assert salvage(zeros).damage is None and salvage(zeros).dropped == 4096
    assert salvage(real_run).note("mlp.tscope") is None and salvage(real_run).dropped == 0


def test_nothing_before_the_damage_is_the_reader_error(real_run: Path, tmp_path: Path) -> None:
    bad = _flip(real_run, tmp_path / "first.tscope", HEADER_SIZE + FRAME_HEADER_SIZE + 2)
    found = salvage(bad)
    assert found.frames == [] and found.error("first.tscope") == (
        f"first.tscope is corrupt at byte {HEADER_SIZE}: frame checksum mismatch")


def test_no_flipped_byte_goes_unsaid(tmp_path: Path) -> None:
    """Every byte of every frame but the last flipped in turn: either salvage drops bytes and
    its note says so, or the flip is in a header field outside the checksum and reading the
    frames it kept refuses the file (as before) -- never a silent short read."""
    src = tmp_path / "src.tscope"
    w = SessionFileWriter(src)
    w.append([{"kind": "session", "session_id": "sid", "name": "s", "rank": 0, "params": []}])
    for lo in range(0, 9, 3):
        w.append([{"kind": "step", "step": s, "loss": 1.0} for s in range(lo, lo + 3)])
    w.append([{"kind": "end", "status": "finished", "steps": 9}])
    w.close(fsync=False)
    _, frames = index(src)
    bad = tmp_path / "bad.tscope"
    for pos in range(HEADER_SIZE, frames[-1].offset):
        _flip(src, bad, pos)
        found = salvage(bad)
        # a prefix of the frames (a flipped header field outside the checksum may read differently)
        assert [f.offset for f in found.frames] == [f.offset for f in frames[: len(found.frames)]]
        if found.note("bad.tscope") is not None:
            assert found.dropped > 0
            continue
        with pytest.raises(SessionFileError):
            for _ in read_frames(bad, found.frames):
                pass
