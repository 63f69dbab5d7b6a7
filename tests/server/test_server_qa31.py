"""QA round 31, server side: a full disk (a real tmpfs, as root), lone surrogate escapes,
chunked bodies over the limit, requests FastAPI's validation refuses with values JSON cannot
hold.  Real servers (`torchscope serve` on a real port) and real files; no mocks."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProc, fill, tiny_disk, wait_for
from fastapi.testclient import TestClient
from server_helpers import run_frames, session_event, step_event, write_file

from torchscope.server.app import create_app
from torchscope.server.config import MAX_INGEST_BYTES, MAX_OTHER_BYTES, Settings
from torchscope.sessionfile import SessionFileError, encode_frame, file_header, iter_events


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchscope.server.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def request(url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None,
            timeout: float = 20) -> tuple[int, Any]:
    """(status, JSON answer); a server that does not answer within ``timeout`` fails the test."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def chunked(port: int, method: str, path: str, body: bytes, ctype: str) -> tuple[int, Any]:
    """A request whose body is sent chunked (no Content-Length: the limit is found reading it)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.putrequest(method, path)
        conn.putheader("Content-Type", ctype)
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # answered before the end
            for i in range(0, len(body), 1 << 16):
                piece = body[i : i + (1 << 16)]
                conn.send(b"%x\r\n" % len(piece) + piece + b"\r\n")
            conn.send(b"0\r\n\r\n")
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def one_line(detail: object) -> str:
    assert isinstance(detail, str) and detail and "\n" not in detail and len(detail) < 300, detail
    return detail


def no_traceback(log: Path) -> None:
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and "Exception in thread" not in text, text[-3000:]


# ---------------------------------------------------------------------- a full disk


def test_disk_full_fails_the_request_with_507_and_the_server_stores_again_once_space_is_back(
        tmp_path: Path) -> None:
    with tiny_disk(tmp_path / "tiny") as disk:
        srv = ServerProc(disk / "data")
        srv.log = tmp_path / "server.log"  # not on the full disk
        srv.start()
        try:
            assert request(srv.url + "/api/ingest/before/0", "POST", b"".join(run_frames("before", 3)))[0] == 200
            filler = fill(disk)
            frames = run_frames("live", 200, per_frame=1)
            # live ingest: the write fails, that request says why; the writer lives on
            status, body = request(srv.url + "/api/ingest/live/0", "POST", b"".join(frames))
            assert status == 507, body
            assert one_line(body["detail"]).startswith("the server's disk is full")
            assert request(srv.url + "/api/health")[1]["ok"] is True
            # an import: 507 too, and `torchscope open` says so (not "could not reach the server")
            big = write_file(tmp_path / "big.tscope", run_frames("imported", 2000, per_frame=1))
            res = cli("open", str(big), "--no-browser", "--server", srv.url)
            assert res.returncode == 1, res.stdout + res.stderr
            line = res.stderr.strip()
            assert "\n" not in line and "the server's disk is full" in line and "could not reach" not in line, line
            status, body = request(srv.url + "/api/sessions/import", "POST",
                                   *_multipart(big))
            assert status == 507 and one_line(body["detail"]).startswith("the server's disk is full"), body
            # space back: the same server stores again, the same run and the import
            filler.unlink()
            status, body = request(srv.url + "/api/ingest/live/0", "POST", b"".join(frames))
            assert status == 200 and body == {"next_seq": len(frames)}, body
            assert request(srv.url + "/api/ingest/live/0/next")[1] == {"next_seq": len(frames)}
            res = cli("open", str(big), "--no-browser", "--server", srv.url)
            assert res.returncode == 0, res.stdout + res.stderr
            assert request(srv.url + "/api/sessions/imported")[1]["steps"] == 2000
            assert request(srv.url + "/api/sessions/before")[1]["steps"] == 3  # nothing lost before
            assert not list((disk / "data" / "tmp").iterdir())  # no upload left behind
            no_traceback(srv.log)
        finally:
            srv.stop()


def _multipart(path: Path) -> tuple[bytes, dict[str, str]]:
    boundary = "qa31boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{path.name}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + path.read_bytes() + \
        f"\r\n--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def test_health_reports_a_writer_that_stopped_and_writes_fail_at_once(tmp_path: Path) -> None:
    """The writer never should stop (a failed batch fails its jobs only); if it does anyway,
    /api/health says so (503) and a write answers 503 at once instead of waiting forever.
    Stopped here as only a bug could stop it: an item that is no job on its queue."""
    with TestClient(create_app(Settings(data_dir=tmp_path / "data")), base_url="http://127.0.0.1:6150") as client:
        assert client.get("/api/health").json() == {"ok": True, "version": client.get("/api/health").json()["version"]}
        store = client.app.fastapi.state.store  # type: ignore[attr-defined]
        store._jobs.put(object())  # noqa: SLF001 - what no caller can put there: the writer fails on it
        store._writer.join(10)  # noqa: SLF001
        r = client.get("/api/health")
        assert r.status_code == 503 and r.json()["ok"] is False and "writer stopped" in r.json()["error"]
        t0 = time.monotonic()
        r = client.get("/api/ingest/x/0/next")
        assert r.status_code == 503 and "restart the server" in one_line(r.json()["detail"])
        assert time.monotonic() - t0 < 15  # at once, not forever (loose for a loaded machine)


# ---------------------------------------------------------------------- lone surrogates
def test_lone_surrogate_escape_is_refused_with_one_line_everywhere(tmp_path: Path) -> None:
    bad_session = {**session_event("surr"), "name": "\ud800x"}
    path = tmp_path / "surrogate.tscope"
    path.write_bytes(file_header() + encode_frame(0, [bad_session], valid_text=False))  # json.dumps escapes it: "\ud800x"
    # the shared reader refuses it with its one-line error
    with pytest.raises(SessionFileError, match="not valid Unicode"):
        list(iter_events(path))
    # a proper pair of escapes (one character outside the BMP) is text
    ok = tmp_path / "emoji.tscope"
    ok.write_bytes(file_header() + encode_frame(0, [{**session_event("emoji"), "name": "\ud83d\ude00"}]))
    assert next(iter(iter_events(ok)))["name"] == "\U0001f600"
    # the CLI: one line, exit 2, no traceback
    for command in ("info", "doctor"):
        res = cli(command, str(path))
        assert res.returncode == 2, res.stdout + res.stderr
        assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert "not valid Unicode" in res.stderr
    with ServerProc(tmp_path / "data") as srv:
        status, body = request(srv.url + "/api/sessions/import", "POST", *_multipart(path))
        assert status == 400 and "frame holds text that is not valid Unicode" in one_line(body["detail"]), body
        status, body = request(srv.url + "/api/ingest/surr/0", "POST", encode_frame(0, [bad_session], valid_text=False))
        assert status == 400 and "frame holds text that is not valid Unicode" in one_line(body["detail"]), body
        good = encode_frame(0, [session_event("live")])
        assert request(srv.url + "/api/ingest/live/0", "POST", good)[0] == 200
        step = {**step_event(0), "note": "\udfff"}
        status, body = request(srv.url + "/api/ingest/live/0", "POST", encode_frame(1, [step], valid_text=False))
        assert status == 400 and "not valid Unicode" in body["detail"], body
        status, body = request(srv.url + "/api/ingest/emoji/0", "POST",
                               encode_frame(0, [{**session_event("emoji"), "name": "\ud83d\ude00"}]))
        assert status == 200
        assert request(srv.url + "/api/sessions/emoji")[1]["name"] == "\U0001f600"
        assert wait_for(lambda: srv.proc is not None and srv.proc.poll() is None)
        no_traceback(srv.log)


# ---------------------------------------------------------------------- request bodies
def test_chunked_body_over_the_limit_is_413_and_bad_patch_values_are_422(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv:
        assert request(srv.url + "/api/ingest/p1/0", "POST", b"".join(run_frames("p1", 3)))[0] == 200
        status, body = chunked(srv.port, "POST", "/api/ingest/big/0", b"\0" * (MAX_INGEST_BYTES + (1 << 20)),
                               "application/octet-stream")
        assert status == 413 and body["detail"] == f"request body over the {MAX_INGEST_BYTES} byte limit"
        status, body = chunked(srv.port, "PATCH", "/api/sessions/p1",
                               json.dumps({"name": "x" * (MAX_OTHER_BYTES * 3)}).encode(), "application/json")
        assert status == 413 and body["detail"] == f"request body over the {MAX_OTHER_BYTES} byte limit"
        # values FastAPI's own 422 handler could not echo back: NaN, a lone surrogate
        for raw in (b'{"name":NaN}', b'{"name":"\\ud800"}', b'{"name":"ok","nope":NaN}'):
            status, body = request(srv.url + "/api/sessions/p1", "PATCH", raw, {"Content-Type": "application/json"})
            assert status == 422, (raw, body)
            assert body["detail"][0]["loc"][0] == "body" and body["detail"][0]["msg"], body
            assert "input" not in body["detail"][0]
        status, body = request(srv.url + "/api/sessions/p1", "PATCH", b'{"tags":["\\ud800"]}',
                               {"Content-Type": "application/json"})
        assert status == 422 and "not valid Unicode" in one_line(body["detail"]), body
        status, body = request(srv.url + "/api/sessions/p1", "PATCH", b'{"name":"fine"}',
                               {"Content-Type": "application/json"})
        assert status == 200 and body["name"] == "fine"
        no_traceback(srv.log)


# ---------------------------------------------------------------------- the printed URL
def test_serve_prints_a_token_url_that_opens_the_dashboard(tmp_path: Path) -> None:
    """A token with characters a URL gives meaning to (space, &, #, %): the printed link works."""
    from conftest import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "torchscope.server.cli", "serve", "--port", str(port), "--data",
                             str(tmp_path / "data"), "--token", "a b&c#d%"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("torchscope dashboard: "), line
        url = line.split()[2]
        assert url.endswith("?token=a+b%26c%23d%25") or url.endswith("?token=a%20b%26c%23d%25"), url
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)


def test_open_with_a_server_url_holding_a_path_or_a_password_says_what_to_give(tmp_path: Path) -> None:
    small = write_file(tmp_path / "small.tscope", run_frames("small", 3))
    with ServerProc(tmp_path / "data") as srv:
        for bad in (srv.url + "/some/prefix", f"http://user:pw@127.0.0.1:{srv.port}"):
            res = cli("open", str(small), "--no-browser", "--server", bad)
            assert res.returncode == 2, res.stdout + res.stderr
            line = res.stderr.strip()
            assert "\n" not in line and "give the server's base URL" in line and "in use" not in line, line
        res = cli("open", str(small), "--no-browser", "--server", srv.url + "/")
        assert res.returncode == 0, res.stdout + res.stderr
