"""A file whose run still writes it is "running" from the moment its import lists it.

The import committed the rank as a finished file's (never heard from: "ended unexpectedly") and
recorded contact only afterwards, so a dashboard polling meanwhile saw a live run read as dead
(CI's `test_open_follows_a_file_its_run_is_still_writing` caught the flicker under load).  Checked
at the store, with no poll to time: right after `import_file` returns, before anyone touches it."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from server_helpers import run_frames, write_file

from torchscope.server.store import Store
from torchscope.server.upload import Imports, import_file
from torchscope.sessionfile import decode_frame, encode_frame


def _file_of_this_process(path: Path, session_id: str, steps: int) -> Path:
    """A run without its end whose session event names this process as its writer (alive)."""
    frames = run_frames(session_id, steps=steps, end=False)
    info, events = decode_frame(frames[0])
    events[0].update(pid=os.getpid(), host=socket.gethostname(), started_at=time.time())
    return write_file(path, [encode_frame(info.seq, events), *frames[1:]])


def test_a_file_still_written_is_running_as_soon_as_it_is_listed(tmp_path: Path) -> None:
    store = Store(tmp_path / "store.db")
    try:
        live = import_file(store, _file_of_this_process(tmp_path / "live.tscope", "still-writing", 4), Imports())
        assert live.writing
        (row,) = [s for s in store.sessions() if s["id"] == "still-writing"]
        assert row["status"] == "running", row
        # a file whose writer is gone stays as it was: ended unexpectedly at once
        gone = write_file(tmp_path / "gone.tscope", run_frames("writer-gone", steps=4, end=False))
        assert not import_file(store, gone, Imports()).writing
        (row,) = [s for s in store.sessions() if s["id"] == "writer-gone"]
        assert row["status"] == "ended unexpectedly", row
    finally:
        store.close()
