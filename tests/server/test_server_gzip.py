"""gzip on a real server: big JSON answers are compressed for a client that accepts it, and
the same bytes come out; the live channel and the export stream are left alone."""

from __future__ import annotations

import gzip
import json
import time
import urllib.error
import urllib.request

from conftest import ServerProc
from server_helpers import graph_event, run_frames, session_event

from torchscope.sessionfile import encode_frame, file_header


def get(srv: ServerProc, path: str, accept_gzip: bool) -> tuple[bytes, dict[str, str]]:
    headers = {"Accept-Encoding": "gzip"} if accept_gzip else {}
    with urllib.request.urlopen(urllib.request.Request(srv.url + path, headers=headers), timeout=30) as resp:
        return resp.read(), {k.lower(): v for k, v in resp.headers.items()}


def ingest(srv: ServerProc, session_id: str, frames: list[bytes]) -> None:
    req = urllib.request.Request(f"{srv.url}/api/ingest/{session_id}/0", data=b"".join(frames), method="POST")
    urllib.request.urlopen(req, timeout=30).read()


def test_big_json_is_gzipped_and_decodes_to_the_same_bytes(server: ServerProc) -> None:
    frames = [encode_frame(0, [session_event("big")]), encode_frame(1, [graph_event(0, n_ops=4000)])]
    ingest(server, "big", frames)
    plain, plain_headers = get(server, "/api/sessions/big/graph?step=0", accept_gzip=False)
    assert "content-encoding" not in plain_headers and len(plain) > 500_000
    packed, headers = get(server, "/api/sessions/big/graph?step=0", accept_gzip=True)
    assert headers.get("content-encoding") == "gzip"
    assert len(packed) < len(plain) / 5
    assert gzip.decompress(packed) == plain
    assert json.loads(plain)["kind"] == "graph"
    # a small answer is not worth it
    _, headers = get(server, "/api/health", accept_gzip=True)
    assert "content-encoding" not in headers


def test_export_stream_is_not_recompressed(server: ServerProc) -> None:
    frames = run_frames("exp", steps=40, graph_steps=(0, 20))
    ingest(server, "exp", frames)
    body, headers = get(server, "/api/sessions/exp/export", accept_gzip=True)
    assert "content-encoding" not in headers  # its frames are zlib already
    assert body == file_header() + b"".join(frames)


def test_live_channel_with_gzip_accepted_still_pushes_at_once(server: ServerProc) -> None:
    req = urllib.request.Request(server.url + "/api/live", headers={"Accept-Encoding": "gzip"})
    resp = urllib.request.urlopen(req, timeout=10)
    try:
        assert resp.headers.get("Content-Encoding") is None
        assert resp.headers.get("Content-Type", "").startswith("text/event-stream")
        assert resp.readline().startswith(b": connected")
        t0 = time.monotonic()
        ingest(server, "live-gz", run_frames("live-gz", steps=3, graph_steps=(1,)))
        kinds: list[str] = []
        while "end" not in kinds:
            line = resp.readline().strip()
            if line.startswith(b"data: "):
                kinds.append(json.loads(line[6:])["kind"])
        # pushed as they happen, not held in a compressor (until the 15 s keepalive flushed it);
        # loose for a loaded machine
        assert time.monotonic() - t0 < 10.0
        assert kinds[0] == "session" and kinds[-1] == "end"
    finally:
        resp.close()


def test_a_step_graph_asked_again_is_answered_without_a_body(server: ServerProc) -> None:
    """The graph view and the memory view both ask for a step's graph (24 MB of JSON on a
    160-layer transformer, downloaded twice: QA 46c).  The answer carries a tag; asked again
    with it, the server answers 304 and no body while the stored graph is the same.  Another
    filter of the same graph is another tag."""
    ingest(server, "tagged", [encode_frame(0, [session_event("tagged")]), encode_frame(1, [graph_event(0, n_ops=200)])])
    body, headers = get(server, "/api/sessions/tagged/graph?step=0", accept_gzip=True)
    tag = headers.get("etag")
    assert tag and headers.get("cache-control") == "no-cache" and gzip.decompress(body)
    req = urllib.request.Request(server.url + "/api/sessions/tagged/graph?step=0", headers={"If-None-Match": tag})
    try:
        urllib.request.urlopen(req, timeout=30)
        raise AssertionError("a tag the server gave out was answered with a body")
    except urllib.error.HTTPError as err:
        assert err.code == 304 and err.read() == b"" and err.headers.get("ETag") == tag
    _, filtered = get(server, "/api/sessions/tagged/graph?step=0&op=addmm", accept_gzip=False)
    assert filtered.get("etag") and filtered["etag"] != tag
    # a stale tag gets the whole answer
    req = urllib.request.Request(server.url + "/api/sessions/tagged/graph?step=0", headers={"If-None-Match": '"0123"'})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200 and json.loads(resp.read())["kind"] == "graph"
