"""A session file is never seen empty: its writer puts the header in a file beside it and
renames that over the path, so `torchscope open` of a run that has just started -- or a test
polling a live file -- reads a header or no file at all, never "is empty, not a torchscope
session file" (what CI once hit when a poll caught the moment between open and write)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from torchscope.sessionfile import (
    HEADER_SIZE,
    SessionFileError,
    SessionFileWriter,
    check_file_header,
    iter_events,
)


def test_a_reader_never_sees_a_new_file_without_its_header(tmp_path: Path) -> None:
    path = tmp_path / "run.tscope"
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys\nfrom torchscope.sessionfile import SessionFileWriter\n"
        "for _ in range(3000):\n    SessionFileWriter(sys.argv[1])._f.close()\n"), str(path)])
    reads, bad = 0, []
    while writer.poll() is None:
        try:
            data = path.read_bytes()[:HEADER_SIZE]
        except FileNotFoundError:
            continue
        reads += 1
        try:
            check_file_header(data, path.name)
        except SessionFileError as e:
            bad.append(str(e))
    assert writer.returncode == 0
    assert reads > 100 and not bad, (reads, len(bad), bad[:1])  # (the old writer: ~40% of reads)
    assert sorted(os.listdir(tmp_path)) == ["run.tscope"]  # no file beside it left over


def test_a_record_path_through_a_symlink_writes_the_file_it_points_to(tmp_path: Path) -> None:
    real, link = tmp_path / "runs" / "real.tscope", tmp_path / "latest.tscope"
    real.parent.mkdir()
    real.write_bytes(b"an older run")
    link.symlink_to(real)
    w = SessionFileWriter(link)
    w.append([{"kind": "session", "session_id": "sid", "name": "s", "rank": 0, "params": []}])
    w.close()
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert [e["kind"] for e in iter_events(real)] == ["session"]
    assert sorted(os.listdir(real.parent)) == ["real.tscope"]
