"""In-process API tier: FastAPI TestClient over a real SQLite file in tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_helpers import graph_event, run_frames, session_event, step_event, write_file

from torchscope.server.app import create_app
from torchscope.server.config import Settings
from torchscope.sessionfile import encode_frame, file_header

BASE = "http://127.0.0.1:6150"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(data_dir=tmp_path / "data")), base_url=BASE) as c:
        yield c


def post(c: TestClient, sid: str, frames: list[bytes] | bytes, rank: int = 0):  # type: ignore[no-untyped-def]
    body = frames if isinstance(frames, bytes) else b"".join(frames)
    return c.post(f"/api/ingest/{sid}/{rank}", content=body,
                  headers={"Content-Type": "application/x-tscope-frames"})


def test_ingest_protocol_in_order_duplicate_and_gap(client: TestClient) -> None:
    frames = run_frames("s1", steps=10)
    assert client.get("/api/ingest/s1/0/next").json() == {"next_seq": 0}
    r = post(client, "s1", frames[:2])
    assert r.status_code == 200 and r.json() == {"next_seq": 2}
    # a resend of frames already stored is ignored
    r = post(client, "s1", frames[:2])
    assert r.status_code == 200 and r.json() == {"next_seq": 2}
    # a gap answers 409 with the seq to rewind to, and stores nothing after the gap
    r = post(client, "s1", frames[4:])
    assert r.status_code == 409 and r.json() == {"next_seq": 2}
    # overlapping resend: duplicates skipped, the rest stored
    r = post(client, "s1", frames[1:])
    assert r.status_code == 200 and r.json() == {"next_seq": len(frames)}
    assert client.get("/api/ingest/s1/0/next").json() == {"next_seq": len(frames)}
    steps = client.get("/api/sessions/s1/steps").json()
    assert [s["step"] for s in steps] == list(range(10))


@pytest.mark.parametrize("body, needle", [
    (b"garbage", "frame 0"),
    (encode_frame(0, [{"kind": "step", "step": 1}])[:-3], "truncated"),
    (encode_frame(0, [{"kind": "step", "step": "one"}]), "step"),
    (encode_frame(0, [{"kind": "graph", "step": 0, "ops": [{"id": 0, "phase": "sideways"}]}]), "phase"),
    (b"", "empty"),
])
def test_bad_frames_answer_400_with_one_line(client: TestClient, body: bytes, needle: str) -> None:
    r = post(client, "s2", body)
    assert r.status_code == 400
    detail = r.json()["detail"]
    assert needle in detail and "\n" not in detail
    assert client.get("/api/ingest/s2/0/next").json() == {"next_seq": 0}
    assert client.get("/api/sessions").json() == []


def test_sessions_list_detail_rename_tag_delete(client: TestClient) -> None:
    post(client, "s3", run_frames("s3", steps=5))
    post(client, "s4", run_frames("s4", steps=2, end=False))
    sessions = {s["id"]: s for s in client.get("/api/sessions").json()}
    assert sessions["s3"]["status"] == "finished" and sessions["s3"]["steps"] == 5
    assert sessions["s3"]["ranks"] == [0] and sessions["s3"]["model"] == "MLP"
    assert sessions["s4"]["status"] == "running"  # heard from just now, no end yet
    detail = client.get("/api/sessions/s3").json()
    assert detail["meta"]["session_id"] == "s3" and detail["rank_info"][0]["steps"] == 5
    r = client.patch("/api/sessions/s3", json={"name": "baseline", "tags": ["lr=1e-3", "good"]})
    assert r.status_code == 200 and r.json()["name"] == "baseline"
    assert client.get("/api/sessions/s3").json()["tags"] == ["lr=1e-3", "good"]
    assert client.patch("/api/sessions/s3", json={"name": ""}).status_code == 422
    for name in ("   ", "\u200b", " \u00a0\u200d "):  # (QA 48d, 48e: accepted, a blank link)
        blank = client.patch("/api/sessions/s3", json={"name": name})
        assert blank.status_code == 422 and "not a space" in blank.json()["detail"], name
    assert client.patch("/api/sessions/s3", json={"name": "  spaced  "}).json()["name"] == "spaced"
    client.patch("/api/sessions/s3", json={"name": "baseline"})
    assert client.patch("/api/sessions/nope", json={"name": "x"}).status_code == 404
    assert client.delete("/api/sessions/s3").json() == {"deleted": "s3"}
    assert client.get("/api/sessions/s3").status_code == 404
    assert client.get("/api/sessions/s3/steps").status_code == 404
    assert [s["id"] for s in client.get("/api/sessions").json()] == ["s4"]
    assert client.delete("/api/sessions/s3").status_code == 404


def test_steps_pagination_and_ranges(client: TestClient) -> None:
    post(client, "s5", run_frames("s5", steps=50))
    page = client.get("/api/sessions/s5/steps?limit=10&offset=20").json()
    assert [s["step"] for s in page] == list(range(20, 30))
    rng = client.get("/api/sessions/s5/steps?start=5&end=7").json()
    assert [s["step"] for s in rng] == [5, 6, 7]
    assert rng[0]["memory"]["live"] == 1005
    assert client.get("/api/sessions/s5/steps?limit=0").status_code == 422
    assert client.get("/api/sessions/s5/steps?start=-1").status_code == 422


def test_graph_by_step_and_filters(client: TestClient) -> None:
    post(client, "s6", run_frames("s6", steps=6, graph_steps=(0, 3)))
    index = client.get("/api/sessions/s6/graphs").json()
    assert [(g["step"], g["ops"], g["signature"]) for g in index] == [(0, 4, "sig-a"), (3, 4, "sig-a")]
    g = client.get("/api/sessions/s6/graph?step=3").json()
    assert g == graph_event(3)
    r = client.get("/api/sessions/s6/graph?step=2")
    assert r.status_code == 404 and "captured steps: 0, 3" in r.json()["detail"]
    enc = client.get("/api/sessions/s6/graph?step=3&module=encoder").json()
    assert {o["module"] for o in enc["ops"]} == {"encoder.0", "encoder.1"}
    assert {n["op"] for n in enc["nodes"]} == {o["id"] for o in enc["ops"]}
    assert all(e[0] in {0, 1, 2} and e[1] in {0, 1, 2} for e in enc["edges"])
    relu = client.get("/api/sessions/s6/graph?step=3&op=relu").json()
    assert [o["id"] for o in relu["ops"]] == [1, 3] and {o["name"] for o in relu["ops"]} == {"aten::relu"}
    # a module prefix matches whole path components only
    assert client.get("/api/sessions/s6/graph?step=3&module=enc").json()["ops"] == []


def test_memory_and_grads_series(client: TestClient) -> None:
    post(client, "s7", run_frames("s7", steps=4))
    mem = client.get("/api/sessions/s7/memory").json()
    # the same columns torchscope.load() builds from the file, via the one series module
    from torchscope.series import memory_series

    assert mem == memory_series([step_event(s) for s in range(4)])
    assert mem["step"] == [0, 1, 2, 3] and mem["live"] == [1000, 1001, 1002, 1003]
    assert mem["peak"] == [2000, 2001, 2002, 2003]
    grads = client.get("/api/sessions/s7/grads?start=1&end=2").json()
    assert grads["params"] == ["fc0.weight", "fc1.weight"] and grads["steps"] == [1, 2]
    assert grads["norm"] == [[1.5, None], [2.5, None]] and grads["none"] == [[1], [1]]


def test_nan_loss_is_served_as_valid_json(client: TestClient) -> None:
    ev = step_event(0)
    ev["loss"] = float("nan")
    post(client, "s8", [encode_frame(0, [session_event("s8"), ev])])
    r = client.get("/api/sessions/s8/steps")
    assert "NaN" in r.text
    import json

    assert json.loads(r.text, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))[0]["loss"] == "NaN"


def test_import_export_round_trip_is_byte_identical(client: TestClient, tmp_path: Path) -> None:
    frames = run_frames("s9", steps=20, graph_steps=(0, 10))
    path = write_file(tmp_path / "run.tscope", frames)
    r = client.post("/api/sessions/import", files={"file": ("run.tscope", path.read_bytes())})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "s9" and r.json()["frames"] == len(frames)
    exported = client.get("/api/sessions/s9/export")
    assert exported.status_code == 200 and exported.content == path.read_bytes()
    # importing the same file again adds nothing
    again = client.post("/api/sessions/import", files={"file": ("run.tscope", path.read_bytes())}).json()
    assert again["new_frames"] == 0
    assert client.get("/api/sessions/s9").json()["steps"] == 20


def test_import_without_end_is_ended_unexpectedly(client: TestClient, tmp_path: Path) -> None:
    frames = run_frames("s10", steps=5, end=False)
    torn = file_header() + b"".join(frames) + frames[-1][:30]  # a killed writer's torn tail
    r = client.post("/api/sessions/import", files={"file": ("killed.tscope", torn)})
    assert r.status_code == 200 and r.json()["frames"] == len(frames)
    assert client.get("/api/sessions/s10").json()["status"] == "ended unexpectedly"


@pytest.mark.parametrize("data, needle", [
    (b"", "empty"),
    (b"PK\x03\x04 a zip file", "not a torchscope session file"),
    (file_header((9, 0)) + encode_frame(0, [session_event("x")]), "newer torchscope"),
    (file_header() + b"FRM1" + b"\x00" * 10, "no complete frame"),
], ids=["empty", "zip", "newer", "torn"])  # (named: an encoded frame's bytes differ between processes)
def test_import_rejects_bad_files_and_leaves_store_untouched(client: TestClient, tmp_path: Path,
                                                             data: bytes, needle: str) -> None:
    post(client, "keep", run_frames("keep", steps=3))
    before = client.get("/api/sessions").json()
    r = client.post("/api/sessions/import", files={"file": ("bad.tscope", data)})
    assert r.status_code == 400 and needle in r.json()["detail"] and "\n" not in r.json()["detail"]
    # the file by the name it was sent with, not where the server keeps it while reading (QA 42b)
    assert "bad.tscope" in r.json()["detail"] and "/" not in r.json()["detail"], r.json()["detail"]
    assert client.get("/api/sessions").json() == before


def test_host_header_rejected(client: TestClient) -> None:
    assert client.get("/api/sessions").status_code == 200
    for host in ("evil.example", "evil.example:6150", "127.0.0.1.evil.example"):
        r = client.get("/api/sessions", headers={"Host": host})
        assert r.status_code == 400 and "DNS rebinding" in r.json()["detail"]
    for host in ("localhost:6150", "127.0.0.1", "[::1]:6150"):
        assert client.get("/api/health", headers={"Host": host}).status_code == 200


def test_a_browser_at_a_refused_host_gets_the_address_to_open(client: TestClient) -> None:
    """A person who opens ``http://0.0.0.0:6150`` (or a name of this machine) reads a page with the
    address this server answers at, not a JSON refusal; the page says no data, and scripts
    still get the JSON (found by QA)."""
    page = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    r = client.get("/", headers={**page, "Host": "0.0.0.0:6150"})
    assert r.status_code == 400 and r.headers["content-type"].startswith("text/html")
    assert 'href="http://127.0.0.1:6150/"' in r.text and "<code>0.0.0.0</code>" in r.text and "DNS rebinding" in r.text
    r = client.get("/sessions/x", headers={**page, "Host": "<b>evil</b>:8080"})
    assert 'href="http://127.0.0.1:8080/"' in r.text and "<b>evil" not in r.text  # the name is text
    assert "DNS rebinding" in client.get("/", headers={"Host": "0.0.0.0:6150"}).json()["detail"]


def test_cross_origin_writes_refused(client: TestClient, tmp_path: Path) -> None:
    """A page of another origin can send writes it cannot read (a form, a no-cors fetch) with
    our Host: the browser's Sec-Fetch-Site / Origin tell them from the dashboard's own."""
    body = b"".join(run_frames("x", 2))
    frames = {"Content-Type": "application/x-tscope-frames"}
    for hostile in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                    {"Origin": "http://evil.example"}, {"Origin": "http://localhost:8000"}, {"Origin": "null"}):
        r = client.post("/api/ingest/x/0", content=body, headers={**frames, **hostile})
        assert r.status_code == 403 and "refused" in r.json()["detail"], hostile
        r = client.post("/api/sessions/import", files={"file": ("x.tscope", file_header() + body)}, headers=hostile)
        assert r.status_code == 403, hostile
        assert client.delete("/api/sessions/x", headers=hostile).status_code == 403
    assert client.get("/api/sessions").json() == []
    assert client.get("/api/sessions", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200  # reads: CORS keeps them
    # the dashboard's own writes, from a browser, and clients that are not browsers
    own = {"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1:6150"}
    assert client.post("/api/ingest/x/0", content=body, headers={**frames, **own}).status_code == 200
    assert client.patch("/api/sessions/x", json={"name": "mine"}, headers={"Origin": "http://127.0.0.1:6150"}).status_code == 200
    assert client.patch("/api/sessions/x", json={"name": "mine"},
                        headers={"Origin": "https://scope.lan", "X-Forwarded-Host": "scope.lan"}).status_code == 200
    assert post(client, "y", run_frames("y", 2)).status_code == 200


def test_empty_token_is_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--token "$TORCHSCOPE_TOKEN"`` with the variable unset: exposed, a token is generated;
    an empty cookie or ``?token=`` never opens the server."""
    monkeypatch.delenv("TORCHSCOPE_TOKEN", raising=False)
    settings = Settings(data_dir=tmp_path / "d", host="0.0.0.0", token="")
    assert settings.token and len(settings.token) >= 20
    assert Settings(data_dir=tmp_path / "d", token="  ").token is None  # on loopback: no token, the Host check
    with TestClient(create_app(settings), base_url="http://192.168.1.5:6150") as c:
        assert c.get("/api/sessions", headers={"Cookie": "torchscope_token="}).status_code == 401
        assert c.get("/api/sessions?token=").status_code == 401


def test_token_required_when_exposed(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "d", host="0.0.0.0")
    token = settings.token
    assert token and len(token) >= 20
    with TestClient(create_app(settings), base_url="http://192.168.1.5:6150") as c:
        assert c.get("/api/health").status_code == 200  # liveness only, no data
        assert c.get("/api/sessions").status_code == 401
        assert c.get("/api/sessions").json()["detail"].startswith("this torchscope server needs its token")
        # a browser opening the address without it gets a page that says what to do, not JSON
        page = c.get("/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
        assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
        assert "needs its token" in page.text and "?token=" in page.text
        assert c.get("/api/ingest/s/0/next").status_code == 401
        wrong = c.get("/api/sessions", headers={"Authorization": "Bearer wrong"})
        assert wrong.status_code == 401 and "not this torchscope server's" in wrong.json()["detail"]
        assert c.get("/api/sessions", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert c.get(f"/api/sessions?token={token}").status_code == 200
        r = post(c, "s", run_frames("s", 2), rank=0)
        assert r.status_code == 401
        r = c.post("/api/ingest/s/0", content=b"".join(run_frames("s", 2)),
                   headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200
        # a page opened with ?token= sets a cookie that later requests carry
        page = c.get(f"/?token={token}")
        assert page.status_code == 200 and token in page.text  # the page's own calls carry it
        assert c.get("/api/sessions").status_code == 200  # now via the cookie


def test_body_limit(client: TestClient) -> None:
    r = client.patch("/api/sessions/x", content=b"x" * 100_000, headers={"Content-Type": "application/json"})
    assert r.status_code == 413


def test_html_routes_and_static(client: TestClient) -> None:
    post(client, "s11", run_frames("s11", steps=1))
    for path in ("/", "/sessions/s11"):
        r = client.get(path)
        assert r.status_code == 200 and "torchscope" in r.text
    assert client.get("/static/api.js").status_code == 200
    assert client.get("/static/../server/store.py").status_code == 404
    assert client.get("/static/%2e%2e/%2e%2e/pyproject.toml").status_code == 404
    assert client.get("/sessions/..%2f..%2fetc").status_code in (404, 422)
    # nothing served loads from a CDN: FastAPI's /docs page (swagger from jsdelivr) is off,
    # its schema is there
    assert client.get("/docs").status_code == 404 and client.get("/redoc").status_code == 404
    assert "/api/sessions" in client.get("/openapi.json").json()["paths"]


def test_multi_rank_session(client: TestClient) -> None:
    for rank in (0, 1):
        frames = [encode_frame(0, [session_event("dist", rank), *[step_event(s, rank) for s in range(3)]])]
        assert post(client, "dist", frames, rank=rank).status_code == 200
    s = client.get("/api/sessions/dist").json()
    assert s["ranks"] == [0, 1] and [r["steps"] for r in s["rank_info"]] == [3, 3]
    assert [x["rank"] for x in client.get("/api/sessions/dist/steps?rank=1").json()] == [1, 1, 1]
    one = client.get("/api/sessions/dist/export?rank=1")
    assert one.status_code == 200 and one.headers["content-disposition"].endswith('.rank1.tscope"')


def test_diagnostics_cached_and_counted(client: TestClient) -> None:
    ev = step_event(0)
    ev["loss"] = float("nan")
    ev["grads"]["nan"] = [3, 0]
    post(client, "dx", [encode_frame(0, [session_event("dx"), ev, step_event(1)])])
    r = client.get("/api/sessions/dx/diagnostics")
    assert r.status_code == 200
    findings = r.json()
    assert isinstance(findings, list)
    summary = next(s for s in client.get("/api/sessions").json() if s["id"] == "dx")
    assert summary["errors"] == sum(1 for f in findings if f.get("severity") == "error")
    assert summary["warnings"] == sum(1 for f in findings if f.get("severity") == "warning")
    assert client.get("/api/sessions/dx/diagnostics").json() == findings  # served from the cache


def test_a_step_is_served_whole_with_its_non_finite_gradients(client: TestClient) -> None:
    """The store keeps a step's memory and grads in columns of their own and no longer twice (in
    the event too): /steps puts them back, every number as written, NaN/Infinity as the strings
    the browser parses, and /grads reads the same columns as floats again."""
    import json

    ev = step_event(0)
    ev["grads"] = {"norm": [float("nan"), 0.1 + 0.2], "nan": [3, 0], "inf": [0, 0], "none": [],
                   "clip": {"norm": float("inf"), "max_norm": 1.0, "norm_type": 2.0}}
    ev["memory"] = {"live": 1000, "peak": 2**40 + 1, "params": 400, "grads": 400}
    post(client, "s9", [encode_frame(0, [session_event("s9"), ev, step_event(1)])])
    served = json.loads(client.get("/api/sessions/s9/steps").text)
    expected = json.loads(json.dumps(ev).replace("NaN", '"NaN"').replace("Infinity", '"Infinity"'))
    assert served[0] == expected and served[0]["grads"]["norm"][1] == 0.1 + 0.2
    assert served[1] == step_event(1)
    grads = json.loads(client.get("/api/sessions/s9/grads").text)
    assert grads["norm"][0][0] == "NaN" and grads["norm"][0][1] == 0.1 + 0.2
