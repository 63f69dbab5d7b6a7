"""Three dashboard gaps a QA pass found, checked in a real headless Chromium against a real
`torchscope serve`, with runs recorded by a real training script (and, where a test needs
losses no script produces on purpose, step events streamed by the real transport).

- No loss chart: the Loss & gradients view now starts with the loss per step, the values the
  run recorded (checked against the server's /steps and /loss and the run's own .tscope file),
  every step of a long run (no sampling that could skip a NaN), NaN/Inf losses marked, steps
  without a loss as gaps, a log axis when the loss spans decades, a click marking the step, and
  new steps drawn while the run goes on.
- The Memory view's "N steps" and its step selector stayed as they were when the page opened
  while a live run added steps (and captured graphs).
- The sessions page had no filter and no sort: with hundreds of runs it is a filter box over
  name / id / status / model / tags and sortable columns, kept through live refreshes.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import forkrun
import pytest
from browser_page import checked_context, chromium, open_session, shot, train_side_by_side
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

TRAIN = Path(__file__).resolve().parent / "dashboard_train.py"
STEPS = 12


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("loss-server")) as s:
        yield s


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("loss-runs")


@pytest.fixture(scope="module")
def runs(srv: ServerProc, recorded: Path) -> dict[str, str]:
    """Session ids of finished real runs of dashboard_train.py (its recording: ``<name>.tscope``)."""
    return train_side_by_side(srv, TRAIN, recorded, {"losses": ["--steps", str(STEPS), "--name", "losses"],
                                                     "schedule": ["--steps", "8", "--name", "schedule", "--schedule"]})


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    with checked_context(browser) as pg:
        yield pg


def gradients(page: Any) -> dict[str, Any]:
    return page.evaluate("window.__torchscope.state().gradients")  # type: ignore[no-any-return]


def wait_loss_points(page: Any, n: int) -> dict[str, Any]:
    """The loss chart's data once it has at least ``n`` points."""
    page.wait_for_function(f"(() => {{ const g = window.__torchscope.state().gradients; return g && g.loss.x.length >= {n}; }})()",
                           timeout=60_000)
    return gradients(page)["loss"]  # type: ignore[no-any-return]


def server_losses(srv: ServerProc, sid: str) -> dict[int, Any]:
    return {ev["step"]: ev.get("loss") for ev in srv.get(f"/api/sessions/{sid}/steps")}  # type: ignore[union-attr]


def click_step(page: Any, chart: str, step: int) -> None:
    """A click on ``chart``'s canvas at ``step``'s x (the chart's own geometry)."""
    geom = page.evaluate(f"window.__torchscope.app.views.gradients.obj.{chart}.geom")
    x = geom["L"] + (step - geom["xmin"]) / (geom["xmax"] - geom["xmin"]) * geom["pw"]
    page.locator(f"[data-testid={chart}] canvas").click(position={"x": x, "y": 60})


# ----------------------------------------------------------------------------- loss chart
def test_the_loss_chart_plots_the_losses_the_run_recorded(page: Any, srv: ServerProc, runs: dict[str, str],
                                                          recorded: Path) -> None:
    from torchscope.session import load

    sid = runs["losses"]
    open_session(page, srv.url, sid, "?view=gradients")
    loss = wait_loss_points(page, STEPS)
    # what the training process wrote to its own file, and what the server sends: the same
    # losses, and the chart plots exactly those, one per step
    in_file = {ev["step"]: ev["loss"] for ev in load(recorded / "losses.tscope").steps}
    assert sorted(in_file) == list(range(STEPS)) and all(isinstance(v, float) and math.isfinite(v) for v in in_file.values())
    assert server_losses(srv, sid) == in_file
    assert srv.get(f"/api/sessions/{sid}/loss") == {"step": list(range(STEPS)), "loss": [in_file[s] for s in range(STEPS)],
                                                    "nonfinite": [], "lr": [[0.01]] * STEPS}
    assert loss["x"] == list(range(STEPS))
    assert loss["y"] == [in_file[s] for s in range(STEPS)]
    assert loss["marks"] == []
    # mse of random targets stays near 1: a linear axis, which must hold every point
    assert loss["axis"]["log"] is False
    assert loss["axis"]["lo"] <= min(in_file.values()) and max(in_file.values()) <= loss["axis"]["hi"]
    # the view's first chart, under a tab that names it
    assert page.locator("button[data-view=gradients]").inner_text() == "Loss & gradients"
    assert page.locator(".view-gradients h2").first.inner_text() == "Loss"
    # a click on a point marks that step across the view and in the URL
    click_step(page, "loss", 7)
    assert gradients(page)["focus"] == 7 and "step=7" in page.url
    shot(page, "loss-chart")


def test_the_learning_rate_chart_plots_each_param_groups_schedule(page: Any, srv: ServerProc, runs: dict[str, str],
                                                                   recorded: Path) -> None:
    """Two param groups (the head's lr 10x) under a linear warmup over 4 steps: a line per
    group, the values the run recorded -- the schedule as the optimizer followed it."""
    from torchscope.session import load

    sid = runs["schedule"]
    warm = [min(1.0, (i + 1) / 4) for i in range(8)]
    expected = [[pytest.approx(0.01 * f, rel=1e-12), pytest.approx(0.1 * f, rel=1e-12)] for f in warm]
    in_file = [ev["lr"] for ev in load(recorded / "schedule.tscope").steps]
    assert in_file == expected
    assert srv.get(f"/api/sessions/{sid}/loss")["lr"] == in_file  # type: ignore[index]
    open_session(page, srv.url, sid, "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.lr.x.length >= 8; })()",
                           timeout=60_000)
    lr = gradients(page)["lr"]
    assert lr["x"] == list(range(8))
    assert [s["name"] for s in lr["series"]] == ["param group 0", "param group 1"]
    assert [[s["y"][i] for s in lr["series"]] for i in range(8)] == in_file
    assert lr["log"] is False and "as in force during the step" in lr["title"]  # 0.0025 to 0.1: not two decades
    page.locator("[data-testid=lr]").scroll_into_view_if_needed()
    assert page.locator("[data-testid=lr] canvas").is_visible()
    shot(page, "lr-chart")
    # a run whose one group's lr never changes: one line, named lr
    open_session(page, srv.url, runs["losses"], "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.lr.x.length >= 1; })()",
                           timeout=60_000)
    assert [s["name"] for s in gradients(page)["lr"]["series"]] == ["lr"]


def _stream(srv: ServerProc, tmp_path: Path, name: str, steps: dict[int, dict[str, Any]]) -> str:
    """A finished session streamed by the real transport with these step events' fields
    (``steps``: step -> extra fields).  Returns its id."""
    from torchscope.transport import Transport

    sid = f"{name}-{int(time.time() * 1000)}"
    t = Transport(str(tmp_path / f"{name}.tscope"), sid, rank=0, server=srv.url)
    t.emit({"kind": "session", "schema": [1, 0], "session_id": sid, "name": name, "started_at": time.time(),
            "rank": 0, "world_size": 1, "model": "Net", "modules": [],
            "params": [{"name": "w.weight", "module": "w", "shape": [2], "numel": 2, "requires_grad": True}]})
    for s, extra in steps.items():
        t.emit({"kind": "step", "step": s, "rank": 0, "t": time.time(), "duration_us": 1000,
                "grads": {"norm": [1.0], "nan": [0], "inf": [0], "none": []}, **extra})
    t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": len(steps)})
    return sid


def test_nan_and_inf_losses_are_marked_missing_ones_are_gaps_and_decades_are_log(
        page: Any, srv: ServerProc, tmp_path: Path) -> None:
    nan, inf = float("nan"), float("inf")
    losses: dict[int, Any] = {0: 10.0, 1: 3.0, 2: 1.0, 3: nan, 4: inf, 5: None, 6: 0.1, 7: 0.03, 9: 0.01, 10: 0.001}
    steps = {s: {"loss": v, "losses": [v]} if v is not None else {} for s, v in losses.items()}
    # a non-finite micro-batch loss, the last one finite: the step's plotted loss is the last
    # micro-batch's, and the step is marked as well
    steps[8] = {"loss": 0.02, "losses": [-inf, 0.02]}
    sid = _stream(srv, tmp_path, "nonfinite-loss", dict(sorted(steps.items())))
    sent = server_losses(srv, sid)
    assert sent[3] == "NaN" and sent[4] == "Infinity" and sent[5] is None  # the server's JSON for them
    open_session(page, srv.url, sid, "?view=gradients")
    loss = wait_loss_points(page, 11)
    assert loss["x"] == list(range(11))
    assert loss["y"] == [10.0, 3.0, 1.0, "NaN", "Infinity", None, 0.1, 0.03, 0.02, 0.01, 0.001]
    assert loss["marks"] == [3, 4, 8]
    # 10 down to 0.001: four decades on a log axis, holding every finite loss
    assert loss["axis"]["log"] is True and loss["axis"]["lo"] <= -3 and loss["axis"]["hi"] >= 1
    assert "log scale" in loss["title"]
    shot(page, "loss-chart-nonfinite")
    # a step missing from the run: a gap between its neighbours, not a line across it
    gap = _stream(srv, tmp_path, "missing-step", {0: {"loss": 1.0}, 1: {"loss": 0.9}, 5: {"loss": 0.5}, 6: {"loss": 0.4}})
    open_session(page, srv.url, gap, "?view=gradients")
    loss = wait_loss_points(page, 5)
    assert loss["x"] == [0, 1, 2, 5, 6] and loss["y"] == [1.0, 0.9, None, 0.5, 0.4]
    assert loss["axis"]["log"] is False
    shot(page, "loss-chart-gap")


def test_a_long_runs_loss_is_plotted_at_every_step_with_every_nan(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """5,000 steps: every one plotted, from one /loss answer of a few bytes a step (not the
    step events, of a few KB each, which the chart sampled over 2,000 steps: every 8th here,
    so the NaN at step 3333 and the Inf at 4001 were never fetched)."""
    n = 5000
    losses: dict[int, Any] = {s: 1.0 / (s + 1) for s in range(n)}
    losses[3333], losses[4001] = float("nan"), float("inf")
    sid = _stream(srv, tmp_path, "long-loss", {s: {"loss": v, "losses": [v]} for s, v in losses.items()})
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url))
    open_session(page, srv.url, sid, "?view=gradients")
    loss = wait_loss_points(page, n)
    assert loss["x"] == list(range(n))
    assert loss["y"] == [{3333: "NaN", 4001: "Infinity"}.get(s, 1.0 / (s + 1)) for s in range(n)]
    assert loss["marks"] == [3333, 4001]
    assert loss["axis"]["log"] is True and "log scale" in loss["title"] and "one step in" not in loss["title"]
    # no step event was asked for: the loss came from /loss
    assert [u for u in asked if "/loss" in u] and not [u for u in asked if "/steps" in u]
    shot(page, "loss-chart-long")


# ----------------------------------------------------------------------------- live run
def memory(page: Any) -> dict[str, Any]:
    return page.evaluate("window.__torchscope.state().memory")  # type: ignore[no-any-return]


def test_a_live_run_grows_the_memory_step_count_its_selector_and_the_loss(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    proc = forkrun.spawn([str(TRAIN), "--server", srv.url, "--record", str(tmp_path / "live.tscope"),
                          "--steps", "60", "--sleep", "0.2", "--name", "live-memory", "--hold", "2"])
    try:
        deadline = time.monotonic() + 120
        sess = None
        while time.monotonic() < deadline and sess is None:
            sess = next((s for s in srv.get("/api/sessions") if s["name"] == "live-memory" and s["steps"] >= 1), None)  # type: ignore[union-attr]
            time.sleep(0.1)
        assert sess is not None, "the live session never appeared"
        open_session(page, srv.url, sess["id"], "?view=memory")
        page.wait_for_function("window.__torchscope.state().memory?.options.length >= 1", timeout=60_000)
        m0 = memory(page)
        n0 = int(m0["info"].split()[0])
        chosen = m0["options"][0]
        page.select_option("[data-testid=memory-step]", str(chosen))  # the user's choice, to be kept
        # the count and the selector follow the run while it goes on (dashboard_train.py captures every other step)
        page.wait_for_function(f"""(() => {{ const m = window.__torchscope.state().memory;
            return parseInt(m.info) >= {n0 + 6} && m.options.length > {len(m0['options'])}; }})()""", timeout=60_000)
        assert srv.get(f"/api/sessions/{sess['id']}")["status"] == "running"  # type: ignore[index]
        m = memory(page)
        assert m["info"] == f"{m['steps']} steps"  # the label says what the chart holds
        assert m["options"] == sorted(m["options"]) and m["selected"] == str(chosen)
        # the loss chart, opened mid-run, draws the steps that arrive after it
        page.click("button[data-view=gradients]")
        first = len(wait_loss_points(page, 1)["x"])
        loss = wait_loss_points(page, first + 5)
        assert loss["x"] == list(range(len(loss["x"])))
        assert srv.get(f"/api/sessions/{sess['id']}")["status"] == "running"  # type: ignore[index]
        shot(page, "live-loss")
    finally:
        proc.wait(timeout=120)
    assert proc.returncode == 0
    # once finished, every loss the run recorded is on the chart
    end = time.monotonic() + 20
    while time.monotonic() < end and srv.get(f"/api/sessions/{sess['id']}")["status"] != "finished":  # type: ignore[index]
        time.sleep(0.2)
    want = server_losses(srv, sess["id"])
    assert len(want) == 60
    page.wait_for_function("window.__torchscope.state().gradients.loss.x.length >= 60", timeout=30_000)
    assert gradients(page)["loss"]["y"] == [want[s] for s in range(60)]


# ----------------------------------------------------------------------------- sessions page
ROWS = "Array.from(document.querySelectorAll('#sessions tr[data-id]')).map((r) => r.querySelector('a.session-link').textContent)"


def rows(page: Any) -> list[str]:
    return page.evaluate(ROWS)  # type: ignore[no-any-return]


def test_sessions_filter_and_sort_survive_live_refreshes(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    from torchscope.transport import Transport

    made: dict[str, str] = {}

    def session(name: str, model: str, steps: int) -> str:
        sid = f"run{len(made)}x{int(time.time() * 1000)}"  # an id that none of the names holds
        t = Transport(str(tmp_path / f"{name}.tscope"), sid, rank=0, server=srv.url)
        t.emit({"kind": "session", "schema": [1, 0], "session_id": sid, "name": name, "started_at": time.time(),
                "rank": 0, "world_size": 1, "model": model, "modules": [], "params": []})
        for s in range(steps):
            t.emit({"kind": "step", "step": s, "rank": 0, "t": time.time(), "duration_us": 1000})
        t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": steps})
        made[name] = sid
        return sid

    for name, model, steps in (("alpha-sweep", "ResNet", 3), ("beta", "GPT", 9), ("gamma-sweep", "ResNet", 1), ("Delta", "MLP", 5)):
        session(name, model, steps)
    req = urllib_request(f"{srv.url}/api/sessions/{made['beta']}", {"tags": ["baseline"]})
    assert json.loads(req)["tags"] == ["baseline"]
    page.goto(srv.url + "/")
    page.wait_for_selector("a.session-link")
    everything = rows(page)
    assert {"alpha-sweep", "beta", "gamma-sweep", "Delta"} <= set(everything)
    # the filter matches names, models, tags and ids, in any case; the rest are hidden
    box = page.locator("[data-testid=filter]")
    box.fill("resnet")
    assert rows(page) == ["gamma-sweep", "alpha-sweep"]  # newest first, as the server lists them
    assert page.locator("#shown").inner_text() == f"2 of {len(everything)} sessions"
    box.fill("BASELINE")
    assert rows(page) == ["beta"]
    box.fill(made["Delta"].upper())
    assert rows(page) == ["Delta"]
    box.fill("sweep resnet")  # every word must match
    assert set(rows(page)) == {"alpha-sweep", "gamma-sweep"}
    # a column header sorts; a second click reverses
    page.click("th[data-sort=steps] button")
    assert rows(page) == ["alpha-sweep", "gamma-sweep"]  # 3 steps, then 1
    assert page.locator("th[data-sort=steps]").get_attribute("aria-sort") == "descending"
    page.click("th[data-sort=steps] button")
    assert rows(page) == ["gamma-sweep", "alpha-sweep"]
    box.fill("")
    page.click("th[data-sort=name] button")
    names = rows(page)
    assert [n for n in names if n in made] == ["alpha-sweep", "beta", "Delta", "gamma-sweep"] and len(names) == len(everything)
    assert "sort=name" in page.url and "dir=asc" in page.url
    # a live refresh (a new run arrives) keeps the filter and the sort: the matching run joins
    # in its sorted place, the other stays hidden
    box.fill("sweep")
    session("epsilon-other", "ResNet", 2)
    session("aardvark-sweep", "ResNet", 2)
    page.wait_for_function(f"{ROWS}.includes('aardvark-sweep')")
    assert rows(page) == ["aardvark-sweep", "alpha-sweep", "gamma-sweep"]
    assert box.input_value() == "sweep"
    box.fill("no such session")
    assert rows(page) == [] and page.locator("#no-match").inner_text() == 'No session matches "no such session".'
    # a reload (or a shared link) keeps them
    page.reload()
    page.wait_for_selector("#no-match")
    assert page.locator("[data-testid=filter]").input_value() == "no such session"
    shot(page, "sessions-filtered")


def test_an_import_under_a_filter_still_says_what_it_did(page: Any, srv: ServerProc, runs: dict[str, str],
                                                        recorded: Path, tmp_path: Path) -> None:
    """The import message stays, with its link, through the list refresh that follows it."""
    copy = tmp_path / "again.tscope"
    copy.write_bytes((recorded / "losses.tscope").read_bytes())
    page.goto(srv.url + "/?q=losses")
    page.wait_for_selector("a.session-link")
    assert rows(page) == ["losses"]
    page.set_input_files("[data-testid=file-input]", str(copy))
    page.wait_for_selector("#note a.imported")
    # nothing was imported: the message says so, with the link to the run it already has
    assert page.locator("#note").inner_text().startswith(
        "again.tscope: nothing new to import, open again.tscope (already here: the same run)")
    assert rows(page) == ["losses"] and page.locator("[data-testid=filter]").input_value() == "losses"


def urllib_request(url: str, body: dict[str, Any]) -> bytes:
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="PATCH", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read()  # type: ignore[no-any-return]
