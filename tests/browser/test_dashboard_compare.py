"""Compare two runs (/compare?a=&b=): the same MLP trained with two learning rates, ticked on
the sessions page and opened with its "Compare" button; every chart holds both runs' per-step
values (loss, total gradient norm, lr, step time, peak and live memory) as the recorded files
have them, on one step axis, a legend naming each run; the facts table sets their facts side
by side; a run still streaming fills in live; an unknown or absent id is one sentence."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import forkrun
import pytest
from browser_page import checked_page, recorded, shot
from conftest import ServerProc

from torchscope.series import total_grad_norm
from torchscope.session import load

playwright_sync = pytest.importorskip("playwright.sync_api")

SCRIPT = Path(__file__).with_name("dashboard_train_compare.py")
STATE = "window.__torchscope.state()"
KEYS = ["loss", "grad_norm", "lr", "step_time", "peak", "live"]


def expected(path: Path, steps: list[int]) -> dict[str, list[Any]]:
    """Each chart's column of the run recorded at ``path``, on the x axis ``steps`` (None where
    the run has no such step), from the file's step events."""
    by = {e["step"]: e for e in load(path).steps}

    def wire(v: Any) -> Any:  # the page's NaN/Inf as the server's JSON writes them
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if v != v else "Infinity" if v > 0 else "-Infinity"
        return v

    get = {"loss": lambda e: e["loss"], "grad_norm": lambda e: total_grad_norm(e["grads"]["norm"]),
           "lr": lambda e: e["lr"][0], "step_time": lambda e: e["duration_us"],
           "peak": lambda e: e["memory"]["peak"], "live": lambda e: e["memory"]["live"]}
    return {k: [wire(f(by[s])) if s in by else None for s in steps] for k, f in get.items()}


def open_compare_through_the_list(page: Any, url: str, a: str, b: str) -> None:
    """The sessions page: tick ``a`` then ``b`` ("compare"), click "Compare"; the compare page, ready."""
    page.goto(url + "/")
    page.locator(f"tr[data-id='{b}']").wait_for()
    assert page.locator("#compare").is_disabled()
    page.locator(f"tr[data-id='{a}'] input[data-testid=compare-pick]").check()
    assert page.locator("#compare").is_disabled()  # one run ticked: nothing to compare yet
    page.locator(f"tr[data-id='{b}'] input[data-testid=compare-pick]").check()
    shot(page, "compare-picked")
    page.locator("#compare").click()
    page.wait_for_url("**/compare?*")
    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    page.evaluate("window.__torchscope.ready")


def test_compare_two_runs_opened_from_the_sessions_page(tmp_path: Path) -> None:
    slow, fast = tmp_path / "slow.tscope", tmp_path / "fast.tscope"
    with ServerProc(tmp_path / "data") as srv, checked_page(1400, 1000) as page:
        a = recorded(srv, slow, SCRIPT, "--name", "lr 0.01", "--lr", "0.01", "--steps", "10", "--log", "acc,only_a")
        b = recorded(srv, fast, SCRIPT, "--name", "lr 0.3", "--lr", "0.3", "--steps", "14", "--log", "acc")
        open_compare_through_the_list(page, srv.url, a, b)
        assert page.url.endswith(f"/compare?a={a}&b={b}"), page.url
        # the doctor's row fills in after the charts (it runs the doctor)
        page.wait_for_function("!document.querySelector('[data-fact=doctor]').textContent.includes('checking')")
        shot(page, "compare-runs")
        got: dict[str, Any] = page.evaluate(STATE)
        started = {sid: srv.get(f"/api/sessions/{sid}")["started_at"] for sid in (a, b)}  # type: ignore[index]
        when = {sid: page.evaluate("(t) => new Date(t * 1000).toLocaleString()", t) for sid, t in started.items()}
        to4 = lambda v: page.evaluate("(v) => v.toPrecision(4)", v)  # noqa: E731 (the page's fmtNum)
        last = {p: load(p).steps[-1]["loss"] for p in (slow, fast)}
        last_text = {p: to4(v) for p, v in last.items()}
    names = [f"lr 0.01 (started {when[a]})", f"lr 0.3 (started {when[b]})"]
    assert got["ids"] == [a, b] and got["rank"] == 0
    # one step axis for both: the longer run's 14 steps; the shorter one's line stops at 10
    steps = list(range(14))
    want = [expected(slow, steps), expected(fast, steps)]
    assert want[0]["loss"][9] is not None and want[0]["loss"][10] is None
    assert want[0]["lr"][0] == 0.01 and want[1]["lr"][0] == 0.3
    for key in KEYS:
        chart = got["charts"][key]
        assert chart["x"] == steps, (key, chart["x"])
        assert [s["name"] for s in chart["series"]] == names, (key, chart["series"])
        assert chart["series"][0]["y"] == want[0][key], (key, chart["series"][0]["y"], want[0][key])
        assert chart["series"][1]["y"] == want[1][key], (key, chart["series"][1]["y"], want[1][key])
        # a colour per run, the same on every chart
        assert [s["color"] for s in chart["series"]] == [got["charts"]["loss"]["series"][k]["color"] for k in (0, 1)]
        assert chart["series"][0]["color"] != chart["series"][1]["color"]
        # the chart's legend names both runs
        assert len(chart["legend"]) == 2 and all(n in t for n, t in zip(names, chart["legend"], strict=True)), (key, chart["legend"])
    assert got["charts"]["grad_norm"]["log"] is True
    # what each run logged with torchscope.log(): a chart per name either logged, the other's line empty
    logged = [load(slow).metrics(), load(fast).metrics()]
    assert sorted(k for k in got["charts"] if k.startswith("metric:")) == ["metric:acc", "metric:only_a"]
    for name in ("acc", "only_a"):
        chart = got["charts"][f"metric:{name}"]
        assert chart["x"] == steps
        lines = {s["name"]: s["y"] for s in chart["series"]}  # (a run that logged none of it: no line)
        assert list(lines) == [names[k] for k in (0, 1) if name in logged[k]], (name, list(lines))
        for k in (0, 1):
            if name in logged[k]:
                by = dict(zip(logged[k][name]["step"], logged[k][name]["value"], strict=True))
                assert lines[names[k]] == [by.get(s) for s in steps], (name, k, lines[names[k]])
    assert got["charts"]["metric:acc"]["series"][1]["y"][13] == pytest.approx(14 * 0.3)
    assert "only_a" not in logged[1] and len(logged[0]["only_a"]["step"]) == 10
    # the page's legend: each run by name and start time
    assert got["legend"] == [f"A: {names[0]}", f"B: {names[1]}"], got["legend"]
    facts = got["facts"]
    assert facts["model"] == ["Sequential", "Sequential"]
    assert facts["optimizer"] == ["SGD", "SGD"]
    assert facts["mode"] == ["default", "default"]
    numel = sum(p["numel"] for p in load(slow).meta["params"])
    assert numel == 8 * 32 + 32 + 32 + 1
    assert facts["params"] == [f"{numel} in 4 tensors"] * 2
    assert facts["torch"] == [load(slow).meta["torch_version"], load(fast).meta["torch_version"]]
    assert facts["steps"] == ["10", "14"]
    assert facts["final_loss"] == [f"{last_text[slow]} (step 9)", f"{last_text[fast]} (step 13)"], facts["final_loss"]
    assert facts["lr0"] == ["0.01", "0.3"], facts["lr0"]
    assert all(t and "checking" not in t for t in facts["doctor"]), facts["doctor"]


def test_a_live_run_fills_in_on_the_compare_page(tmp_path: Path) -> None:
    done = tmp_path / "done.tscope"
    with ServerProc(tmp_path / "data") as srv, checked_page() as page:
        a = recorded(srv, done, SCRIPT, "--name", "finished run", "--steps", "6")
        p = forkrun.spawn([str(SCRIPT), "--server", srv.url, "--record", str(tmp_path / "live.tscope"),
                           "--name", "live run", "--steps", "16", "--sleep", "0.4"])
        try:
            deadline = time.monotonic() + 60
            b = None
            while b is None and time.monotonic() < deadline:  # the live run's first steps are on the server
                b = next((s["id"] for s in srv.get("/api/sessions") if s["name"] == "live run" and s["steps"] >= 2), None)  # type: ignore[union-attr]
                time.sleep(0.1)
            assert b is not None
            page.goto(f"{srv.url}/compare?a={a}&b={b}")
            page.wait_for_function("window.__torchscope && window.__torchscope.ready")
            page.evaluate("window.__torchscope.ready")
            first = page.evaluate(STATE)["charts"]["loss"]["series"]
            assert len(first) == 2
            live_before = [v for v in first[1]["y"] if v is not None]
            assert 2 <= len(live_before) < 16, live_before
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out[-3000:]
            # no reload: the live channel's steps redraw the page until the run's 16 are in
            page.wait_for_function(f"{STATE}.charts.loss.series[1].y.filter((v) => v !== null).length === 16", timeout=30_000)
            page.wait_for_function(f"{STATE}.facts.steps[1] === '16'", timeout=30_000)
            got = page.evaluate(STATE)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    steps = list(range(16))
    assert got["charts"]["loss"]["x"] == steps
    assert got["charts"]["loss"]["series"][1]["y"] == expected(tmp_path / "live.tscope", steps)["loss"]
    assert got["charts"]["step_time"]["series"][1]["y"] == expected(tmp_path / "live.tscope", steps)["step_time"]


def test_an_unknown_or_absent_session_is_one_sentence(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv, checked_page() as page:
        a = recorded(srv, tmp_path / "one.tscope", SCRIPT, "--steps", "3")
        for query, words in ((f"?a={a}&b=no-such-run", 'No session "no-such-run" on this server.'),
                             ("?a=gone-1&b=gone-2", 'No session "gone-1" or "gone-2" on this server.'),
                             (f"?a={a}", "Pick two sessions to compare")):
            page.goto(f"{srv.url}/compare{query}")
            page.wait_for_function("window.__torchscope && window.__torchscope.ready")
            page.evaluate("window.__torchscope.ready")
            fatal = page.locator("#fatal")
            assert fatal.count() == 1, query
            text = fatal.inner_text()
            assert text.startswith(words) and text.endswith("All sessions") and "\n" not in text, (query, text)
            assert fatal.locator("a").get_attribute("href") == "/"
            assert page.locator("canvas").count() == 0  # no empty charts under it
        shot(page, "compare-missing")
