"""GET /api/sessions/{id}/loss: the loss of every step as columns (what the dashboard's loss
chart plots), checked against the step events the server stores and serves (/steps), for a
live run's frames and for an imported session file (whose series frames give the columns).
In-process API tier: FastAPI TestClient over a real SQLite file, the real codec."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from server_helpers import session_event, step_event

from torchscope.server.app import create_app
from torchscope.server.config import Settings
from torchscope.sessionfile import SessionFileWriter, encode_frame

BASE = "http://127.0.0.1:6150"
NAN, INF = float("nan"), float("inf")
# step -> the loss the step event records; a step missing here has no "loss" key at all
LOSSES: dict[int, Any] = {0: 2.5, 1: 1 / 3, 2: NAN, 3: INF, 4: -INF, 5: None, 7: 0.1 + 0.2, 8: 1e-300, 9: 0.5}


def events(steps: dict[int, Any], rank: int = 0) -> list[dict[str, Any]]:
    """Step events of these losses; every step has micro-batch losses ending with its loss."""
    out = []
    for s in range(10):
        ev = step_event(s, rank)
        del ev["loss"]
        if s in steps:
            ev["loss"] = steps[s]
            if steps[s] is not None:
                ev["losses"] = [0.25, steps[s]]
        out.append(ev)
    return out


def wire(v: Any) -> Any:
    """A float as the API's JSON writes it: NaN and the infinities as strings."""
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(data_dir=tmp_path / "data")), base_url=BASE) as c:
        yield c


def ingest(c: TestClient, sid: str, frames: list[bytes], rank: int = 0) -> None:
    r = c.post(f"/api/ingest/{sid}/{rank}", content=b"".join(frames), headers={"Content-Type": "application/x-tscope-frames"})
    assert r.status_code == 200, r.text


def loss(c: TestClient, sid: str, query: str = "") -> dict[str, Any]:
    r = c.get(f"/api/sessions/{sid}/loss{query}")
    assert r.status_code == 200, r.text
    # valid JSON: no bare NaN / Infinity
    got: dict[str, Any] = json.loads(r.text, parse_constant=lambda const: pytest.fail(f"bare {const} in JSON"))
    # these runs' step events have no optimizer's learning rates (test_learning_rates_per_step has)
    assert got.pop("lr") == [None] * len(got["step"]), got
    return got


def served_losses(c: TestClient, sid: str, rank: int = 0) -> dict[int, Any]:
    """step -> loss of the step events as /steps serves them (absent: None)."""
    return {ev["step"]: ev.get("loss") for ev in c.get(f"/api/sessions/{sid}/steps?rank={rank}&limit=10000").json()}


def check_against_events(c: TestClient, sid: str) -> None:
    got = loss(c, sid)
    assert set(got) == {"step", "loss", "nonfinite"}
    assert got["step"] == list(range(10))
    # every value equals the step event's, to the last bit (1/3, 0.1 + 0.2, 1e-300 included),
    # NaN and the infinities as the API writes them, null where the step has no loss
    assert got["loss"] == [wire(LOSSES.get(s)) for s in range(10)]
    assert dict(zip(got["step"], got["loss"], strict=True)) == served_losses(c, sid)
    assert got["nonfinite"] == [2, 3, 4]


def test_the_loss_of_every_step_equals_the_step_events(client: TestClient) -> None:
    evs = events(LOSSES)
    # as a live run's transport sends them: a few steps a frame, over several requests
    frames = [encode_frame(0, [session_event("live")]), *(encode_frame(1 + i // 4, evs[i:i + 4]) for i in range(0, 10, 4))]
    ingest(client, "live", frames[:2])
    assert loss(client, "live")["step"] == [0, 1, 2, 3]
    ingest(client, "live", frames[2:])
    check_against_events(client, "live")


def test_an_imported_files_losses_equal_its_step_events(client: TestClient, tmp_path: Path) -> None:
    """The capture's file stores series frames too (the store takes the loss column from them)."""
    path = tmp_path / "run.tscope"
    w = SessionFileWriter(path)
    w.append([session_event("imported")])
    evs = events(LOSSES)
    w.append(evs[:5])
    w.append(evs[5:])
    w.append([{"kind": "end", "t": 2e9, "status": "finished", "steps": 10}])
    w.append_series()
    w.close(fsync=False)
    r = client.post("/api/sessions/import", files={"file": ("run.tscope", path.read_bytes())})
    assert r.status_code == 200, r.text
    check_against_events(client, "imported")


def test_a_micro_batch_nan_before_a_finite_last_loss_marks_its_step(client: TestClient) -> None:
    """The step's loss is the last micro-batch's; a NaN/Inf of an earlier micro-batch (in the
    event's ``losses``) marks the step as well, its plotted loss staying the finite last one."""
    evs = events({s: 1.0 for s in range(10)})
    evs[6]["losses"] = [NAN, 1.0]
    evs[8]["losses"] = [1.0, -INF, 1.0]
    ingest(client, "micro", [encode_frame(0, [session_event("micro"), *evs])])
    got = loss(client, "micro")
    assert got["loss"] == [1.0] * 10 and got["nonfinite"] == [6, 8]
    assert loss(client, "micro", "?start=7") == {"step": [7, 8, 9], "loss": [1.0] * 3, "nonfinite": [8]}


def test_a_store_of_an_earlier_build_counts_its_micro_batch_nans(tmp_path: Path) -> None:
    """A store written before steps had ``nonfinite_losses`` is reopened by this build: the
    column is added and filled from the stored events, and /loss marks their NaN steps."""
    import sqlite3

    data = tmp_path / "data"
    evs = events({s: 1.0 for s in range(10)})
    evs[3]["losses"] = [INF, NAN, 1.0]
    evs[5]["losses"] = [NAN, 1.0]
    with TestClient(create_app(Settings(data_dir=data)), base_url=BASE) as c:
        ingest(c, "old", [encode_frame(0, [session_event("old"), *evs])])
    with sqlite3.connect(Settings(data_dir=data).db_path) as conn:  # as the earlier build left it
        conn.execute("ALTER TABLE steps DROP COLUMN nonfinite_losses")
    with TestClient(create_app(Settings(data_dir=data)), base_url=BASE) as c:
        got = loss(c, "old")
        assert got["loss"] == [1.0] * 10 and got["nonfinite"] == [3, 5]
        ingest(c, "old", [encode_frame(1, [{**step_event(10), "loss": 2.0, "losses": [NAN, 2.0]}])])
        assert loss(c, "old", "?start=10")["nonfinite"] == [10]


def test_start_and_end_page_the_steps(client: TestClient) -> None:
    ingest(client, "paged", [encode_frame(0, [session_event("paged"), *events(LOSSES)])])
    whole = loss(client, "paged")
    # start and end are inclusive step numbers; the pages of a range join into the whole
    window = loss(client, "paged", "?start=2&end=5")
    assert window == {"step": [2, 3, 4, 5], "loss": ["NaN", "Infinity", "-Infinity", None], "nonfinite": [2, 3, 4]}
    pages = [loss(client, "paged", f"?start={lo}&end={lo + 2}") for lo in range(0, 10, 3)]
    assert [s for p in pages for s in p["step"]] == whole["step"]
    assert [v for p in pages for v in p["loss"]] == whole["loss"]
    assert [s for p in pages for s in p["nonfinite"]] == whole["nonfinite"]
    assert loss(client, "paged", "?start=7")["step"] == [7, 8, 9]
    assert loss(client, "paged", "?end=2") == {"step": [0, 1, 2], "loss": [2.5, 1 / 3, "NaN"], "nonfinite": [2]}
    # a step the run lacks is simply not there
    assert loss(client, "paged", "?start=6&end=6") == {"step": [6], "loss": [None], "nonfinite": []}
    assert loss(client, "paged", "?start=10") == {"step": [], "loss": [], "nonfinite": []}
    assert loss(client, "paged", "?start=5&end=4") == {"step": [], "loss": [], "nonfinite": []}
    # a live run's next request: only the steps after the last one the client has
    ingest(client, "paged", [encode_frame(1, [{**step_event(10), "loss": NAN}, step_event(11)])])
    assert loss(client, "paged", "?start=10") == {"step": [10, 11], "loss": ["NaN", 1 / 12], "nonfinite": [10]}
    assert loss(client, "paged")["step"] == list(range(12))  # not the answer cached before the frame


def test_ranks_and_refusals(client: TestClient) -> None:
    for rank in (0, 1):
        evs = events({s: float(10 * rank + s) for s in range(10)}, rank)
        ingest(client, "dist", [encode_frame(0, [session_event("dist", rank), *evs])], rank=rank)
    assert loss(client, "dist")["loss"] == [float(s) for s in range(10)]
    assert loss(client, "dist", "?rank=1")["loss"] == [float(10 + s) for s in range(10)]
    assert loss(client, "dist", "?rank=2") == {"step": [], "loss": [], "nonfinite": []}
    assert client.get("/api/sessions/nope/loss").status_code == 404
    for bad in ("?start=-1", "?end=x", "?rank=70000"):
        assert client.get(f"/api/sessions/dist/loss{bad}").status_code == 422
    assert "/api/sessions/{session_id}/loss" in client.get("/openapi.json").json()["paths"]


def test_learning_rates_per_step_and_from_a_store_of_an_earlier_build(tmp_path: Path) -> None:
    """``lr``: each step's param-group learning rates as its event recorded them (a warmup, two
    groups, a step without any); a store written before steps had the ``lr`` column is given
    it, filled from the stored events."""
    import sqlite3

    data = tmp_path / "data"
    lrs: list[Any] = [[1e-4 * (s + 1), 1e-3 * (s + 1)] for s in range(10)]
    lrs[6] = None  # (a step event without lr: a watch without optimizer)
    evs = [{**ev, "lr": lr} if lr is not None else ev for ev, lr in zip(events({s: 1.0 for s in range(10)}), lrs, strict=True)]
    with TestClient(create_app(Settings(data_dir=data)), base_url=BASE) as c:
        ingest(c, "sched", [encode_frame(0, [session_event("sched"), *evs])])
        assert c.get("/api/sessions/sched/loss").json()["lr"] == lrs
        assert c.get("/api/sessions/sched/loss?start=8").json()["lr"] == lrs[8:]
    with sqlite3.connect(Settings(data_dir=data).db_path) as conn:  # as the earlier build left it
        conn.execute("ALTER TABLE steps DROP COLUMN lr")
    with TestClient(create_app(Settings(data_dir=data)), base_url=BASE) as c:
        assert c.get("/api/sessions/sched/loss").json()["lr"] == lrs
        ingest(c, "sched", [encode_frame(1, [{**step_event(10), "lr": [0.5, 5.0]}])])
        assert c.get("/api/sessions/sched/loss?start=10").json()["lr"] == [[0.5, 5.0]]
