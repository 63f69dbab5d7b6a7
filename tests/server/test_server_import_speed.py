"""The one-pass import (server/upload.py ``import_file``): a session file as the capture writes
it (format 1.1: step frames, graph frames, series frames) is read once into a staging database
and committed whole.  Checked against a real `torchscope serve`: what it stores equals what the
same frames stored by live ingest give, nothing shows before the commit, a bad frame late in a
big file leaves the store and the upload directory as they were, a second import adds only the
frames the store lacks, and `torchscope open` on a terminal shows the server's progress."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProc, http_json
from server_helpers import frame_of_line, graph_event, session_event, step_event

from torchscope.server.client import ClientError, upload
from torchscope.server.upload import IMPORT_BATCH_BYTES
from torchscope.sessionfile import FLAG_SERIES, FRAME_HEADER_SIZE, SessionFileWriter, index
from torchscope.transport import _SERIES_ROWS


def capture_file(path: Path, session_id: str, steps: int, per_frame: int = 25, rank: int = 0) -> Path:
    """A session file written as the capture's transport writes it: a flush of ``per_frame``
    steps per frame, a graph frame for every 500th step, series frames once ``_SERIES_ROWS``
    steps wait for them and at the end (after the end event)."""
    w = SessionFileWriter(path)
    w.append([session_event(session_id, rank, name=f"run of rank {rank}", n_params=2)])
    for lo in range(0, steps, per_frame):
        w.append([step_event(s, rank, captured=s % 500 == 0) for s in range(lo, min(lo + per_frame, steps))])
        for s in range(lo, min(lo + per_frame, steps)):
            if s % 500 == 0:
                w.append([graph_event(s, rank)])
        if w.series_pending >= _SERIES_ROWS:
            w.append_series()
    w.append([{"kind": "end", "t": 2e9, "status": "finished", "steps": steps}])
    w.append_series()
    w.close(fsync=False)
    return path


def _post_frames(srv: ServerProc, session_id: str, frames: list[bytes]) -> None:
    """The frames sent as a live run's transport sends them (a few per request)."""
    for i in range(0, len(frames), 7):
        req = urllib.request.Request(srv.url + f"/api/ingest/{session_id}/0", data=b"".join(frames[i:i + 7]),
                                     method="POST", headers={"Content-Type": "application/x-tscope-frames"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200


def _raw_frames(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return [data[f.offset:f.offset + FRAME_HEADER_SIZE + f.length] for f in index(path)[1]]


def _stored(srv: ServerProc, sid: str, steps: int) -> dict[str, Any]:
    """Everything the dashboard reads of a session (times of contact aside)."""
    detail = srv.get(f"/api/sessions/{sid}")
    assert isinstance(detail, dict)
    with urllib.request.urlopen(srv.url + f"/api/sessions/{sid}/export", timeout=30) as resp:
        exported = resp.read()
    return {
        "steps": srv.get(f"/api/sessions/{sid}/steps?limit=10000"),
        "memory": srv.get(f"/api/sessions/{sid}/memory"),
        "grads": srv.get(f"/api/sessions/{sid}/grads?max_steps={steps}"),
        "graphs": srv.get(f"/api/sessions/{sid}/graphs"),
        "graph": srv.get(f"/api/sessions/{sid}/graph?step=500"),
        "ranks": [{k: v for k, v in r.items() if k != "last_seen"} for r in detail["rank_info"]],
        "meta": detail["meta"], "name": detail["name"], "model": detail["model"], "status": detail["status"],
        "export": exported,
    }


def _upload_dirs(srv: ServerProc) -> list[Path]:
    return list((srv.data / "tmp").glob("*"))


@pytest.fixture(scope="module")
def run_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return capture_file(tmp_path_factory.mktemp("run") / "run.tscope", "speedrun", 3000)


def test_import_stores_what_live_ingest_of_the_same_frames_stores(server: ServerProc, run_file: Path,
                                                                  tmp_path: Path) -> None:
    # the import takes the steps' columns from the file's series frames; live ingest of the
    # same frames (a few per request, never covering a series record exactly) computes them
    _, infos = index(run_file)
    assert sum(1 for f in infos if f.flags & FLAG_SERIES) > 10  # series frames, as the capture writes them
    res = upload(server.url, run_file)
    assert res["frames"] == res["new_frames"] == len(infos) and res["id"] == "speedrun"
    imported = _stored(server, "speedrun", 3000)

    live = ServerProc(tmp_path / "live-data").start()
    try:
        _post_frames(live, "speedrun", _raw_frames(run_file))
        ingested = _stored(live, "speedrun", 3000)
    finally:
        live.stop()
    assert imported["ranks"][0]["steps"] == 3000 and len(imported["memory"]["step"]) == 3000
    assert imported["export"] == run_file.read_bytes()
    for key in imported:
        assert imported[key] == ingested[key], key


def test_import_in_progress_is_listed_and_shows_nothing_until_committed(server: ServerProc,
                                                                        tmp_path: Path) -> None:
    path = capture_file(tmp_path / "big run.tscope", "bigrun", 40_000, per_frame=50)
    total = sum(FRAME_HEADER_SIZE + f.length for f in index(path)[1])
    result: dict[str, Any] = {}
    uploader = threading.Thread(target=lambda: result.update(upload(server.url, path)))
    uploader.start()
    seen: list[dict[str, Any]] = []
    while uploader.is_alive():
        listed = http_json(server.url + "/api/ingest/imports")
        assert isinstance(listed, list)
        if listed and listed[0]["stage"] == "reading":
            # the event loop answers while the import runs in its thread, and the session is
            # not there before the whole file is read (then one transaction stores it)
            assert http_json(server.url + "/api/sessions") == []
        seen.extend(listed)
    uploader.join()
    assert any(s["stage"] == "reading" for s in seen), "the import never showed in /api/ingest/imports"
    assert {s["name"] for s in seen} == {"big run.tscope"} and {s["total"] for s in seen} == {total}
    assert all(0 <= s["done"] <= total for s in seen)
    assert [s["done"] for s in seen] == sorted(s["done"] for s in seen)  # it only moves on
    assert http_json(server.url + "/api/ingest/imports") == []
    assert result["frames"] == len(index(path)[1])
    detail = server.get("/api/sessions/bigrun")
    assert isinstance(detail, dict) and detail["steps"] == 40_000 and detail["status"] == "finished"
    assert _upload_dirs(server) == []  # the upload and its staging database are gone


def test_bad_frame_late_in_a_big_file_stores_nothing(server: ServerProc, tmp_path: Path) -> None:
    path = capture_file(tmp_path / "late.tscope", "late", 40_000, per_frame=50)
    _, infos = index(path)
    bad = infos[-3]  # read after many staged batches
    assert bad.offset > 2 * IMPORT_BATCH_BYTES
    # a record that is not JSON, its checksum right: refused, not salvaged (a flipped byte would be)
    data = path.read_bytes()
    broken = tmp_path / "broken.tscope"
    broken.write_bytes(data[: bad.offset] + frame_of_line(bad.seq, b"not json")
                       + data[bad.offset + FRAME_HEADER_SIZE + bad.length :])
    upload(server.url, capture_file(tmp_path / "other.tscope", "other", 100))
    server.get("/api/sessions/other/diagnostics")  # the doctor's counts in the list, settled
    before = server.get("/api/sessions")

    with pytest.raises(ClientError, match=f"corrupt at byte {bad.offset}: frame holds a record that is not JSON"):
        upload(server.url, broken)
    assert server.get("/api/sessions") == before
    with pytest.raises(urllib.error.HTTPError):
        server.get("/api/sessions/late")
    assert _upload_dirs(server) == [] and http_json(server.url + "/api/ingest/imports") == []
    assert upload(server.url, path)["new_frames"] == len(infos)  # the good file after it: all of it


def test_second_import_adds_only_the_frames_the_store_lacks(server: ServerProc, run_file: Path,
                                                            tmp_path: Path) -> None:
    _, infos = index(run_file)
    half = tmp_path / "half.tscope"  # the file as a killed run left it: whole frames, up to the middle
    cut = infos[len(infos) // 2]
    half.write_bytes(run_file.read_bytes()[:cut.offset])
    first = upload(server.url, half)
    assert first["frames"] == first["new_frames"] == len(infos) // 2
    assert server.get("/api/sessions/speedrun")["status"] == "ended unexpectedly"  # type: ignore[index]

    second = upload(server.url, run_file)
    assert second["frames"] == len(infos) and second["new_frames"] == len(infos) - len(infos) // 2
    whole = _stored(server, "speedrun", 3000)
    assert whole["export"] == run_file.read_bytes() and whole["status"] == "finished"
    assert [s["step"] for s in whole["steps"]] == list(range(3000))
    assert whole["memory"]["step"] == list(range(3000))
    assert upload(server.url, run_file)["new_frames"] == 0


def test_a_second_rank_joins_the_session_its_first_rank_made(server: ServerProc, tmp_path: Path) -> None:
    upload(server.url, capture_file(tmp_path / "r0.tscope", "ddp", 600))
    res = upload(server.url, capture_file(tmp_path / "r1.tscope", "ddp", 400, rank=1))
    assert res["rank"] == 1 and res["new_frames"] == res["frames"]
    detail = server.get("/api/sessions/ddp")
    assert isinstance(detail, dict)
    assert detail["ranks"] == [0, 1] and [r["steps"] for r in detail["rank_info"]] == [600, 400]
    assert detail["name"] == "run of rank 0" and detail["meta"]["rank"] == 0  # rank 0 describes the run
    steps = server.get("/api/sessions/ddp/steps?rank=1&limit=10000")
    assert isinstance(steps, list) and [s["rank"] for s in steps] == [1] * 400
    assert server.get("/api/sessions/ddp/memory?rank=1")["step"] == list(range(400))  # type: ignore[index]


def _on_a_terminal(cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd`` with its stderr on a pseudo-terminal (a person watching); its stdout and
    stderr as one text."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: the command ended
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(60), out.decode("utf-8", "replace")


def test_open_on_a_terminal_shows_the_server_storing_the_file(server: ServerProc, tmp_path: Path) -> None:
    path = capture_file(tmp_path / "long run.tscope", "longrun", 40_000, per_frame=50)
    assert path.stat().st_size > 1 << 20  # big enough for the bars
    code, out = _on_a_terminal([sys.executable, "-m", "torchscope.server.cli", "open", str(path),
                                "--port", str(server.port), "--no-browser"])
    assert code == 0, out
    size = f"{sum(FRAME_HEADER_SIZE + f.length for f in index(path)[1]) / 2**20:.1f}"
    assert f"storing [{'#' * 30}] {size}/{size} MiB" in out  # the server's progress, to the end
    assert out.rstrip().endswith("/sessions/longrun")
    assert server.get("/api/sessions/longrun")["steps"] == 40_000  # type: ignore[index]
