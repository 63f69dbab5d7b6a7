"""Fuzz the ingest protocol and the REST API: random bytes, mutated valid frames, random
query parameters.  The server answers 4xx (never 5xx) and keeps serving."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import run_frames

from torchscope.server.app import create_app
from torchscope.server.config import Settings

VALID = b"".join(run_frames("fz", steps=6, graph_steps=(0, 3)))
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with tempfile.TemporaryDirectory() as d, \
            TestClient(create_app(Settings(data_dir=Path(d))), base_url="http://127.0.0.1") as c:
        assert c.post("/api/ingest/fz/0", content=VALID).status_code == 200
        yield c


def _still_serving(c: TestClient) -> None:
    assert c.get("/api/health").json()["ok"] is True
    assert c.get("/api/sessions/fz/steps?limit=2").status_code == 200


@FUZZ
@given(body=st.binary(min_size=1, max_size=2000))
def test_random_bytes_ingest(client: TestClient, body: bytes) -> None:
    r = client.post("/api/ingest/rnd/0", content=body)
    assert r.status_code in (200, 400, 409), r.text
    if r.status_code == 400:
        assert "\n" not in r.json()["detail"]


@FUZZ
@given(data=st.data())
def test_mutated_valid_frames(client: TestClient, data: st.DataObject) -> None:
    body = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(body) - 1))
        body[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(body)))
    sid = data.draw(st.sampled_from(["mut", "fz"]))
    r = client.post(f"/api/ingest/{sid}/0", content=bytes(body[:cut]))
    assert r.status_code in (200, 400, 409), r.text
    _still_serving(client)


_params = st.dictionaries(
    st.sampled_from(["rank", "start", "end", "limit", "offset", "step", "micro", "module", "op", "token"]),
    st.one_of(st.integers(-2**70, 2**70).map(str), st.text(max_size=20), st.just("")),
    max_size=5)


@FUZZ
@given(path=st.sampled_from(["/api/sessions", "/api/sessions/fz", "/api/sessions/fz/steps",
                             "/api/sessions/fz/graphs", "/api/sessions/fz/graph", "/api/sessions/fz/memory",
                             "/api/sessions/fz/grads", "/api/sessions/fz/export", "/api/sessions/nope/graph",
                             "/api/ingest/fz/0/next"]),
       params=_params)
def test_random_query_params(client: TestClient, path: str, params: dict[str, str]) -> None:
    r = client.get(path, params=params)
    assert r.status_code < 500, (path, params, r.text)


@FUZZ
@given(sid=st.text(min_size=1, max_size=300), rank=st.text(max_size=12))
def test_random_path_segments(client: TestClient, sid: str, rank: str) -> None:
    from urllib.parse import quote

    for url in (f"/api/sessions/{quote(sid, safe='')}", f"/api/ingest/{quote(sid, safe='')}/{quote(rank, safe='')}/next"):
        r = client.get(url)
        assert r.status_code < 500, (url, r.text)


@FUZZ
@given(body=st.one_of(st.binary(max_size=300),
                      st.dictionaries(st.text(max_size=10),
                                      st.one_of(st.none(), st.integers(), st.text(max_size=30),
                                                st.lists(st.text(max_size=5), max_size=5)), max_size=4)))
def test_random_patch_bodies(client: TestClient, body: object) -> None:
    if isinstance(body, bytes):
        r = client.patch("/api/sessions/fz", content=body, headers={"Content-Type": "application/json"})
    else:
        r = client.patch("/api/sessions/fz", json=body)
    assert r.status_code < 500, r.text


@FUZZ
@given(data=st.binary(max_size=3000))
def test_random_imports(client: TestClient, data: bytes) -> None:
    r = client.post("/api/sessions/import", files={"file": ("x.tscope", data)})
    assert r.status_code in (200, 400), r.text
    _still_serving(client)
