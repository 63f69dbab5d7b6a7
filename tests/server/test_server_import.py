"""POST /api/sessions/import against a real `torchscope serve`: the upload is streamed to a
temporary file under the data dir and read back frame by frame; the stored session is the
file's, and a bad file leaves the store as it was."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import EXAMPLES, ServerProc, run_script
from server_helpers import frame_of_line

from torchscope.server.client import upload
from torchscope.server.upload import IMPORT_BATCH_BYTES
from torchscope.sessionfile import FLAG_GRAPH, encode_frame, file_header, index, iter_events


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session file written by a real training run: many frames, graphs and steps."""
    record = tmp_path_factory.mktemp("run") / "mlp run.tscope"
    run_script(
        EXAMPLES / "mlp.py", "--steps", "25", "--server", "none", "--record", str(record), "--mode", "full"
    )
    return record


def _post_raw(srv: ServerProc, body: bytes, content_type: str) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        srv.url + "/api/sessions/import", data=body, method="POST", headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _multipart(name: str, data: bytes, field: str = "file") -> tuple[bytes, str]:
    head = (
        f'--b0undary\r\nContent-Disposition: form-data; name="note"\r\n\r\nhello\r\n'
        f'--b0undary\r\nContent-Disposition: form-data; name="{field}"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return head + data + b"\r\n--b0undary--\r\n", "multipart/form-data; boundary=b0undary"


def _upload_dirs(srv: ServerProc) -> list[Path]:
    return list((srv.data / "tmp").glob("*"))


def test_real_run_imported_frame_by_frame_equals_the_file(server: ServerProc, real_run: Path) -> None:
    _, frames = index(real_run)
    events = list(iter_events(real_run))
    steps = [e for e in events if e["kind"] == "step"]
    graphs = [e for e in events if e["kind"] == "graph"]
    assert len(frames) > 10 and len(steps) == 25 and graphs  # a multi-frame file

    res = upload(server.url, real_run)  # the CLI's client: the file streamed as multipart
    assert res["frames"] == res["new_frames"] == len(frames)
    sid = res["id"]
    assert sid == events[0]["session_id"] and res["rank"] == 0
    detail = server.get(f"/api/sessions/{sid}")
    assert isinstance(detail, dict)
    info = detail["rank_info"][0]
    assert detail["steps"] == info["steps"] == len(steps)
    assert info["frames"] == len(frames)
    assert info["events"] == sum(f.n_events for f in frames)  # every record of every frame
    assert info["bytes"] == sum(40 + f.length for f in frames)
    assert info["graphs"] == len(graphs) == sum(1 for f in frames if f.flags & FLAG_GRAPH)
    assert detail["status"] == "finished"
    listed = server.get(f"/api/sessions/{sid}/graphs")
    assert isinstance(listed, list)
    assert [(g["step"], g["ops"], g["nodes"]) for g in listed] == [
        (g["step"], len(g["ops"]), len(g["nodes"])) for g in graphs
    ]
    served = server.get(f"/api/sessions/{sid}/steps?limit=10000")
    assert isinstance(served, list) and [s["step"] for s in served] == [s["step"] for s in steps]
    # each whole, as the file holds it: the store keeps memory and grads apart from the event
    assert served == steps
    with urllib.request.urlopen(server.url + f"/api/sessions/{sid}/export", timeout=30) as resp:
        assert resp.read() == real_run.read_bytes()
    assert _upload_dirs(server) == []  # the temporary upload is gone

    again = upload(server.url, real_run)
    assert again["frames"] == len(frames) and again["new_frames"] == 0


def test_file_damaged_in_the_middle_is_imported_up_to_the_damage(
    server: ServerProc, real_run: Path, tmp_path: Path
) -> None:
    """One flipped byte in the middle: the frames before it are imported, and the answer's
    note says what was dropped (it used to refuse the whole file)."""
    _, frames = index(real_run)
    middle = frames[len(frames) // 2]
    data = bytearray(real_run.read_bytes())
    data[middle.offset + 40 + middle.length // 2] ^= 0xFF  # one payload byte: its CRC fails
    status, body = _post_raw(server, *_multipart("broken run.tscope", bytes(data)))
    assert status == 200, body
    kept = frames[: len(frames) // 2]
    assert body["frames"] == body["new_frames"] == len(kept)
    assert body["note"] == (f"broken run.tscope is damaged at byte {middle.offset:,} (frame checksum mismatch): "
                            f"the {len(data) - middle.offset:,} bytes from there to its end were dropped; "
                            f"the {len(kept)} frames before it are read")
    sid = str(body["id"])
    detail = server.get(f"/api/sessions/{sid}")
    assert isinstance(detail, dict) and detail["status"] == "ended unexpectedly"
    steps = {ev["step"] for ev in iter_events(real_run) if ev["kind"] == "step" and ev.get("step") is not None}
    assert 0 < detail["steps"] < len(steps)
    with urllib.request.urlopen(server.url + f"/api/sessions/{sid}/export", timeout=30) as resp:
        assert resp.read() == bytes(data[: middle.offset])  # the file up to the damage, byte for byte
    assert _upload_dirs(server) == []
    whole = upload(server.url, real_run)  # the undamaged file fills in the rest
    assert whole["new_frames"] == len(frames) - len(kept) and whole.get("note") is None


def _larger_than_a_batch(path: Path) -> Path:
    """A file of incompressible steps, 1.5 import batches long (so it is stored in two)."""
    frames = [encode_frame(0, [{"kind": "session", "session_id": "two-batches", "rank": 0}])]
    while sum(map(len, frames)) < IMPORT_BATCH_BYTES * 3 // 2:
        first = (len(frames) - 1) * 10
        frames.append(
            encode_frame(
                len(frames),
                [
                    {"kind": "step", "step": first + i, "events": [{"what": os.urandom(20_000).hex()}]}
                    for i in range(10)
                ],
            )
        )
    path.write_bytes(file_header() + b"".join(frames))
    return path


def test_file_of_several_batches(server: ServerProc, tmp_path: Path) -> None:
    path = _larger_than_a_batch(tmp_path / "long.tscope")
    _, frames = index(path)
    # a frame of the second batch corrupt (not the last: that would be a torn tail): the first
    # pass finds it before anything is stored
    # (its checksum holds, so salvage keeps it: a record that is not JSON, which no flipped byte makes)
    bad = frames[-2]
    assert bad.offset > IMPORT_BATCH_BYTES
    data = path.read_bytes()
    data = data[: bad.offset] + frame_of_line(bad.seq, b"not json") + data[bad.offset + 40 + bad.length :]
    status, body = _post_raw(server, *_multipart("long.tscope", data))
    assert (
        status == 400
        and body["detail"] == f"long.tscope is corrupt at byte {bad.offset}: frame holds a record that is not JSON"
    )
    assert server.get("/api/sessions") == []

    res = upload(server.url, path)
    assert res["frames"] == len(frames)
    detail = server.get("/api/sessions/two-batches")
    assert isinstance(detail, dict)
    assert detail["steps"] == 10 * (len(frames) - 1) and detail["rank_info"][0]["frames"] == len(frames)
    with urllib.request.urlopen(server.url + "/api/sessions/two-batches/export", timeout=30) as resp:
        assert resp.read() == path.read_bytes()


@pytest.mark.parametrize(
    ("body", "content_type", "needle"),
    [
        (b"\x89TSCOPE\n", "application/octet-stream", "multipart/form-data"),
        (*_multipart("x.tscope", b"data", field="other"), "no 'file' field"),
        (
            b"--b0undary\r\nnot a header line at all",
            "multipart/form-data; boundary=b0undary",
            "not valid multipart",
        ),
        (*_multipart("../../etc/passwd", b""), "passwd is empty"),
    ],
)
def test_bad_uploads_answer_one_line(server: ServerProc, body: bytes, content_type: str, needle: str) -> None:
    status, answer = _post_raw(server, body, content_type)
    assert status == 400 and needle in str(answer["detail"]) and "\n" not in str(answer["detail"])
    assert _upload_dirs(server) == []
    assert server.get("/api/sessions") == []
