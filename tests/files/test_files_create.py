"""A session file is never seen empty: its writer puts the header in a file beside it and
renames that over the path, so `torchscope open` of a run that has just started -- or a test
polling a live file -- reads a header or no file at all, never "is empty, not a torchscope
session file" (what CI once hit when a poll caught the moment between open and write)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import one_line_error

from torchscope.sessionfile import (
    HEADER_SIZE,
    SessionFileError,
    SessionFileWriter,
    check_file_header,
    index,
    iter_events,
    salvage,
)


def _poll_headers(proc: subprocess.Popen[bytes], path: Path) -> None:
    """Read ``path``'s header over and over while ``proc`` runs: every read that found the file
    found a header (and there were plenty of reads)."""
    reads, bad = 0, []
    while proc.poll() is None:
        try:
            data = path.read_bytes()[:HEADER_SIZE]
        except FileNotFoundError:
            continue
        reads += 1
        try:
            check_file_header(data, path.name)
        except SessionFileError as e:
            bad.append(str(e))
    assert proc.returncode == 0
    assert reads > 100 and not bad, (reads, len(bad), bad[:1])


def test_a_reader_never_sees_a_new_file_without_its_header(tmp_path: Path) -> None:
    path = tmp_path / "run.tscope"
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys\nfrom torchscope.sessionfile import SessionFileWriter\n"
        "for _ in range(3000):\n    SessionFileWriter(sys.argv[1])._f.close()\n"), str(path)])
    _poll_headers(writer, path)  # (the old writer: ~40% of reads were empty)
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


WATCHING = """
import sys, torch, torchscope
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for k in range(int(sys.argv[2])):  # a notebook running its watch cell again: the same record path
    with torchscope.watch(model, opt, server=None, record=sys.argv[1]):
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
"""


def test_a_watched_runs_file_has_its_header_from_the_moment_its_name_exists(tmp_path: Path) -> None:
    """``watch()`` reserves its record path before its writer thread makes the file: that
    reservation was an empty file (O_EXCL) -- CI's poll of a run just started read it (stop 42)."""
    script, path = tmp_path / "run.py", tmp_path / "run.tscope"
    script.write_text(WATCHING)
    _poll_headers(subprocess.Popen([sys.executable, str(script), str(path), "20"]), path)
    assert sorted(os.listdir(tmp_path)) == ["run.py", "run.tscope"]


def test_a_pipe_is_said_to_be_one_and_never_waited_on(tmp_path: Path) -> None:
    """``torchscope info <(cat run.tscope)`` read as "63 holds no complete frame (truncated or
    corrupt)", and a pipe with no writer hung ``info``/``doctor``/``open`` (QA 36c): a pipe is
    told as such at once, by every reader, and the CLI exits 2 with that one line."""
    fifo = tmp_path / "run.tscope"
    os.mkfifo(fifo)
    for read in (iter_events, index, salvage):
        msg = one_line_error(lambda p, read=read: list(read(p)) if read is iter_events else read(p), fifo)
        assert msg == f"{fifo} is a pipe, not a session file: save it to a file and give that", msg
    res = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "info", str(fifo)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "is a pipe, not a session file" in res.stderr and "Traceback" not in res.stderr
