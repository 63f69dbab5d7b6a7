"""QA round 31c, server side: a file (or a live writer) claiming a stored session id is refused
unless it is that run; slow clients (slowloris) are cut off while the live channel and a slow
but steady upload are not; and the polish: `serve --quiet --verbose`, the package's Python
files under /static, PATCH tags that are not strings, `info` and the import agreeing on a bad
event, Host names compared as DNS compares them.  Real servers (`torchscope serve` on a real
port), real files, the real transport; no mocks."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProc, free_port
from server_helpers import session_event, step_event, write_file

from torchscope.sessionfile import FRAME_HEADER_SIZE, SessionFileWriter, encode_frame, index
from torchscope.transport import Transport


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchscope.server.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def request(url: str, method: str = "GET", body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def multipart(path: Path) -> tuple[bytes, dict[str, str]]:
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{path.name}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + path.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def upload(srv: ServerProc, path: Path) -> tuple[int, Any]:
    body, headers = multipart(path)
    return request(srv.url + "/api/sessions/import", "POST", body, headers)


def one_line(detail: object) -> str:
    assert isinstance(detail, str) and detail and "\n" not in detail and len(detail) < 300, detail
    return detail


def finished_file(path: Path, session_id: str, steps: int, loss: float = 1.0, name: str = "run") -> Path:
    """A finished run's file as the capture's transport writes it: session first, steps a few
    per frame, the end event, and then the series frames of the last steps (after the end)."""
    w = SessionFileWriter(path)
    w.append([session_event(session_id, name=name)])
    for lo in range(0, steps, 4):
        batch = [step_event(s) for s in range(lo, min(lo + 4, steps))]
        for ev in batch:
            ev["loss"] = loss / (ev["step"] + 1)
        w.append(batch)
    w.append([{"kind": "end", "t": 2e9, "status": "finished", "steps": steps}])
    w.append_series()
    w.close(fsync=False)
    return path


def raw_frames(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return [data[f.offset:f.offset + FRAME_HEADER_SIZE + f.length] for f in index(path)[1]]


def export(srv: ServerProc, sid: str) -> bytes:
    with urllib.request.urlopen(srv.url + f"/api/sessions/{sid}/export", timeout=30) as resp:
        return resp.read()


def ingest(srv: ServerProc, sid: str, frames: list[bytes]) -> tuple[int, Any]:
    return request(srv.url + f"/api/ingest/{sid}/0", "POST", b"".join(frames),
                   {"Content-Type": "application/x-tscope-frames"})


# ---------------------------------------------------------------------- one session id, one run
def test_a_different_run_under_a_stored_session_id_is_refused_and_the_stored_one_kept(
        server: ServerProc, tmp_path: Path) -> None:
    stored = finished_file(tmp_path / "first.tscope", "twin", steps=40)
    status, res = upload(server, stored)
    assert status == 200 and res["new_frames"] == res["frames"] == len(raw_frames(stored))
    # another run that got the same id: fewer frames than stored, so no frame of it would come
    # after the stored end; its frames differ from the stored ones
    other = finished_file(tmp_path / "other.tscope", "twin", steps=12, loss=7.0, name="another run")
    status, res = upload(server, other)
    assert status == 409
    assert one_line(res["detail"]) == ("other.tscope: another run with the same session id is already stored "
                                       "(session twin rank 0: its frame 0 differs from the file's)")
    assert export(server, "twin") == stored.read_bytes()
    # `torchscope open` says the server's line, exits non-zero, no traceback
    res_cli = cli("open", str(other), "--port", str(server.port), "--no-browser")
    assert res_cli.returncode == 2 and res_cli.stdout == ""
    assert res_cli.stderr == f"torchscope open: {res['detail']}\n"
    assert export(server, "twin") == stored.read_bytes()


def test_frames_after_a_stored_end_are_refused_and_the_same_file_or_its_grown_copy_still_imports(
        server: ServerProc, tmp_path: Path) -> None:
    whole = finished_file(tmp_path / "run.tscope", "grow", steps=40)
    frames = raw_frames(whole)
    n_series = 3  # the writer's series frames, after the end event's frame
    part = write_file(tmp_path / "part.tscope", frames[:5])  # the file while the run was live
    assert upload(server, part)[1]["new_frames"] == 5
    status, res = upload(server, whole)  # the file once the run had finished: the rest of it
    assert status == 200 and res["new_frames"] == len(frames) - 5
    status, res = upload(server, whole)  # the same file again: nothing new
    assert status == 200 and res["new_frames"] == 0 and res["frames"] == len(frames)

    # the same frames, then a step after the end: no run writes that
    foreign = write_file(tmp_path / "plus.tscope", [*frames, encode_frame(len(frames), [step_event(999)])])
    status, res = upload(server, foreign)
    assert status == 409
    assert one_line(res["detail"]) == ("plus.tscope: another run with the same session id is already stored "
                                       "(session grow rank 0 has ended, and the file goes on after its end)")
    assert export(server, "grow") == whole.read_bytes()
    loss = server.get("/api/sessions/grow/loss")
    assert isinstance(loss, dict) and loss["step"] == list(range(40))

    # a live run whose end reached the server and its last series frames did not: the file
    # brings those (the only frames that may follow an end)
    live = finished_file(tmp_path / "live.tscope", "live-end", steps=20)
    live_frames = raw_frames(live)
    assert ingest(server, "live-end", live_frames[:-n_series])[0] == 200
    status, res = upload(server, live)
    assert status == 200 and res["new_frames"] == n_series
    assert export(server, "live-end") == live.read_bytes()


def test_live_ingest_after_the_end_takes_the_writers_series_frames_and_refuses_anything_else(
        server: ServerProc, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    sid = f"ended-{uuid.uuid4().hex[:8]}"

    def run(path: Path, steps: int, frame_per_step: bool = False) -> Transport:
        t = Transport(str(path), sid, rank=0, server=server.url, flush_interval=0.05)
        t.emit(session_event(sid))
        for s in range(steps):
            t.emit(step_event(s))
            if frame_per_step:
                assert t.flush()
        t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": steps}, timeout=10)
        return t

    first = tmp_path / "first.tscope"
    t = run(first, 30)  # the real transport: its series frames go after the end, to the server too
    assert t.sent_seq == t.writer.seq
    assert export(server, sid) == first.read_bytes()
    assert server.get(f"/api/sessions/{sid}")["status"] == "finished"  # type: ignore[index]
    frames = raw_frames(first)
    assert ingest(server, sid, frames)[0] == 200  # a resend of what is stored: ignored

    status, res = ingest(server, sid, [encode_frame(len(frames), [step_event(99)])])
    assert status == 410
    assert one_line(res["detail"]).startswith(f"session {sid} rank 0 has ended (its end event is stored)")
    assert server.get(f"/api/ingest/{sid}/0/next") == {"next_seq": len(frames)}

    # another run reusing the id, with more frames than the stored one: refused, and its
    # transport says so (once) instead of resending in a loop; the stored run is kept
    capfd.readouterr()
    second = run(tmp_path / "second.tscope", 30, frame_per_step=True)
    assert second.writer.seq > len(frames)
    err = capfd.readouterr().err
    assert err.count("refused the run (HTTP 410") == 1, err
    assert export(server, sid) == first.read_bytes()


# ---------------------------------------------------------------------- slow clients
@contextlib.contextmanager
def raw_connection(port: int, first: bytes = b"") -> Iterator[socket.socket]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        if first:
            sock.sendall(first)
        yield sock
    finally:
        sock.close()


def closed_by_server(sock: socket.socket, wait: float) -> bytes | None:
    """What the server sent before it closed the connection, or None when it is still open
    after ``wait`` seconds."""
    sock.settimeout(wait)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return got


def trickle(sock: socket.socket, stop: threading.Event) -> None:
    while not stop.wait(0.3):
        with contextlib.suppress(OSError):
            sock.sendall(b"X")


def _cut_off_while_a_steady_upload_goes_through(srv: ServerProc, path: Path, idle: socket.socket,
                                                 headers: socket.socket, stalled: socket.socket,
                                                 dripping: socket.socket) -> None:
    """While the slow clients wait: an upload slower than the timeout overall, but steady; then
    each slow client has been cut off (a body answered 408 first)."""
    # an upload that takes longer than the timeout, at a steady pace: it must go through
    body, ctype = multipart(path)
    steady = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    steady.putrequest("POST", "/api/sessions/import")
    steady.putheader("Content-Type", ctype["Content-Type"])
    steady.putheader("Content-Length", str(len(body)))
    steady.endheaders()
    pieces = [body[i:i + len(body) // 6 + 1] for i in range(0, len(body), len(body) // 6 + 1)]
    began = time.monotonic()
    for piece in pieces:
        steady.send(piece)
        time.sleep(0.5)
    answer = steady.getresponse()
    assert answer.status == 200, answer.read()
    assert json.loads(answer.read())["id"] == "steady" and time.monotonic() - began > 2.5

    # by now (3 s, three timeouts) every slow client has been cut off
    assert closed_by_server(idle, 2) == b""
    assert closed_by_server(headers, 2) == b""
    for sock in (stalled, dripping):
        got = closed_by_server(sock, 2)
        assert got is not None and got.startswith(b"HTTP/1.1 408 "), got
        assert b'"the request body came too slowly (a pause over 1 s, or under 500 bytes/s)"' in got
        assert b"\r\nconnection: close\r\n" in got.lower()


def test_slow_clients_are_cut_off_while_the_live_channel_and_a_slow_steady_upload_are_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHSCOPE_READ_TIMEOUT", "1")
    path = finished_file(tmp_path / "steady.tscope", "steady", steps=400)
    with ServerProc(tmp_path / "data") as srv:
        live = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        live.request("GET", "/api/live")
        stream = live.getresponse()
        assert stream.status == 200 and stream.readline() == b": connected\n"

        head = b"POST /api/ingest/slow/0 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\nFRM1"
        stop = threading.Event()
        with raw_connection(srv.port) as idle, \
                raw_connection(srv.port, b"GET /api/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n") as headers, \
                raw_connection(srv.port, head) as stalled, raw_connection(srv.port, head) as dripping:
            threads = [threading.Thread(target=trickle, args=(s, stop), daemon=True) for s in (headers, dripping)]
            for th in threads:
                th.start()
            try:
                _cut_off_while_a_steady_upload_goes_through(srv, path, idle, headers, stalled, dripping)
            finally:
                stop.set()
                for th in threads:
                    th.join()

        # the live channel outlived them all and still carries events
        assert upload(srv, finished_file(tmp_path / "later.tscope", "later", steps=3))[0] == 200
        told = []
        while "later" not in told:  # (the steady import's messages come first)
            line = stream.readline()
            assert line, "the live channel was closed"
            if line.startswith(b"data: "):
                told.append(json.loads(line[6:])["session"])
        live.close()
        assert srv.get("/api/health")["ok"] is True  # type: ignore[index]


# ---------------------------------------------------------------------- polish
def test_serve_refuses_quiet_with_verbose_and_a_bad_read_timeout(tmp_path: Path) -> None:
    args = ("serve", "--port", str(free_port()), "--data", str(tmp_path / "d"))
    res = cli(*args, "--quiet", "--verbose", timeout=20)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == ("torchscope serve: argument --verbose: not allowed with argument --quiet "
                          "(see torchscope serve --help)\n")
    res = cli(*args, env={"TORCHSCOPE_READ_TIMEOUT": "soon"}, timeout=20)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == "torchscope serve: TORCHSCOPE_READ_TIMEOUT='soon': give a number of seconds above 0\n"


def test_static_serves_the_dashboard_not_the_packages_python_files(server: ServerProc) -> None:
    with urllib.request.urlopen(server.url + "/static/app.js", timeout=10) as resp:
        assert resp.status == 200
    for name in ("__init__.py", "__pycache__/__init__.cpython-311.pyc", "graph/../__init__.py"):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(server.url + "/static/" + name, timeout=10)
        assert info.value.code == 404, name


def test_patch_tags_that_are_not_strings_get_a_one_line_422(server: ServerProc, tmp_path: Path) -> None:
    assert upload(server, finished_file(tmp_path / "t.tscope", "tagged", steps=3))[0] == 200
    url = server.url + "/api/sessions/tagged"
    ctype = {"Content-Type": "application/json"}
    status, res = request(url, "PATCH", json.dumps({"tags": ["kept"]}).encode(), ctype)
    assert status == 200 and res["tags"] == ["kept"]
    for tags in ([{"a": 1}], [1], [None], ["ok", ["nested"]]):
        status, res = request(url, "PATCH", json.dumps({"tags": tags}).encode(), ctype)
        assert status == 422 and one_line(res["detail"]) == "tags: every tag must be a string", tags
    assert server.get("/api/sessions/tagged")["tags"] == ["kept"]  # type: ignore[index]


def test_info_refuses_an_event_the_import_refuses_in_the_same_words(server: ServerProc, tmp_path: Path) -> None:
    """`info` reads events with the import's decoder, so a file it summarizes is one the server
    takes (graph frames aside: those it only checksums, as before)."""
    bad = step_event(2)
    bad["loss"] = "x"  # its frame's checksum holds: a bad writer, not damage
    frames = [encode_frame(0, [session_event("bad-event")]), encode_frame(1, [step_event(0), step_event(1)]),
              encode_frame(2, [bad])]
    path = write_file(tmp_path / "bad.tscope", frames)
    status, res = upload(server, path)
    offset = 16 + len(frames[0]) + len(frames[1])
    assert status == 400
    assert one_line(res["detail"]) == f"bad.tscope is corrupt at byte {offset}: invalid step event: loss: Input should be a valid number"
    info = cli("info", str(path))
    assert info.returncode == 2 and info.stdout == ""
    assert info.stderr == f"torchscope info: {res['detail']}\n"


def test_host_names_compare_as_dns_compares_them(server: ServerProc) -> None:
    def status(host: str) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            conn.putrequest("GET", "/api/sessions", skip_host=True)
            conn.putheader("Host", host)
            conn.endheaders()
            return conn.getresponse().status
        finally:
            conn.close()

    port = server.port
    for host in (f"LOCALHOST:{port}", f"localhost.:{port}", "LocalHost.", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert status(host) == 200, host
    for host in ("evil.com.", f"EVIL.com:{port}", "localhost.evil.com", "LOCALHOST.evil.com.", "localhost.."):
        assert status(host) == 400, host
