"""The numbers a script logs itself (``torchscope.log(acc=..., val_loss=...)``, as with
``wandb.log``) in the Loss & gradients view, checked in a real headless Chromium against a real
`torchscope serve`, with runs of a real training script (dashboard_train_metrics.py):

- a small chart per logged name, its steps and values those of the run's own file
  (``load(path).metrics()``) and of the server's /metrics, a NaN marked with the loss chart's
  red tick, a metric logged every 3rd step drawn over the loss chart's step range, hover values;
- a run with more names than the view shows at once: the first 8, "show all", a menu that
  focuses one, kept in the URL (``?metric=acc``, ``?metrics=all``) and followed by a deep link;
- a run that logs nothing: no metric chart, a one-line hint only;
- a run streaming to the server: its metric charts grow while the page stays open (no reload),
  and end with the whole recording.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import forkrun
import pytest
from browser_page import checked, module_browser, open_session, recorded, session_id, shot  # noqa: F401
from conftest import ServerProc

from torchscope.session import load

playwright_sync = pytest.importorskip("playwright.sync_api")

SCRIPT = Path(__file__).with_name("dashboard_train_metrics.py")
STEPS = 12
NAN_STEP = 5


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("metrics-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path]]:
    """(session id, recording) of finished runs imported into ``srv``: one logging three
    metrics, one logging eleven, one logging none."""
    out = tmp_path_factory.mktemp("metrics-runs")
    args = {"three": ["--steps", str(STEPS), "--nan-step", str(NAN_STEP)],
            "eleven": ["--steps", "6", "--many", "8", "--name", "eleven"],
            "none": ["--steps", "6", "--no-log", "--name", "none"]}
    return {name: (recorded(srv, out / f"{name}.tscope", SCRIPT, *a), out / f"{name}.tscope") for name, a in args.items()}


def metrics_state(page: Any) -> dict[str, Any]:
    return page.evaluate("window.__torchscope.state().gradients.metrics")  # type: ignore[no-any-return]


def wire(columns: dict[str, dict[str, list[Any]]]) -> dict[str, dict[str, list[Any]]]:
    """A file's metrics as the page's charts give them: NaN/Infinity as the server's JSON writes them."""
    def one(v: Any) -> Any:
        return v if v is None or math.isfinite(v) else "NaN" if math.isnan(v) else "Infinity" if v > 0 else "-Infinity"
    return {n: {"step": c["step"], "value": [one(v) for v in c["value"]]} for n, c in columns.items()}


def open_gradients(page: Any, srv: ServerProc, sid: str, query: str = "") -> None:
    open_session(page, srv.url, sid, "?view=gradients" + query)
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.loss.x.length > 0 && g.steps > 0; })()",
                           timeout=30_000)


def test_each_logged_metric_is_a_chart_of_the_recorded_values(srv: ServerProc, runs: dict[str, tuple[str, Path]],
                                                              checked: Any) -> None:  # noqa: F811
    page = checked
    sid, path = runs["three"]
    open_gradients(page, srv, sid)
    page.wait_for_function("window.__torchscope.state().gradients.metrics.names.length === 3", timeout=20_000)
    page.locator("[data-testid=user-metrics] h2").scroll_into_view_if_needed()
    shot(page, "metrics-three")
    st = metrics_state(page)
    want = load(path).metrics()
    assert sorted(want) == ["acc", "lr_x10", "val_loss"]
    assert st["names"] == ["acc", "lr_x10", "val_loss"] and st["shown"] == st["names"]
    assert st["visible"] and not st["hint"]
    # every value the run logged, at its step (the NaN one too), as in the file and on the server
    drawn = {n: {"step": c["step"], "value": c["value"]} for n, c in st["charts"].items()}
    assert drawn == wire(want) == srv.get(f"/api/sessions/{sid}/metrics")
    assert want["acc"]["step"] == [e["step"] for e in load(path).steps] == list(range(STEPS))
    assert want["lr_x10"]["step"] == [0, 3, 6, 9]
    assert drawn["val_loss"]["value"][NAN_STEP] == "NaN"
    # the NaN marked as the loss chart marks a NaN loss: a red tick at its step
    assert st["charts"]["val_loss"]["marks"] == [NAN_STEP]
    assert st["charts"]["acc"]["marks"] == [] and st["charts"]["acc"]["title"] == "acc"
    assert st["charts"]["val_loss"]["title"].startswith("val_loss (red ticks at the top: NaN/Inf, at step 5")
    # on the loss chart's steps: lr_x10 (logged up to step 9) spans steps 0 to 11 as the loss does
    loss_x = page.evaluate("window.__torchscope.state().gradients.loss.x")
    assert st["charts"]["lr_x10"]["x"][0] == loss_x[0] == 0 and st["charts"]["lr_x10"]["x"][-1] == loss_x[-1] == STEPS - 1
    # the chart objects themselves, as other views expose theirs
    obj = page.evaluate("""(() => { const c = window.__torchscope.app.views.gradients.obj.metrics.charts.get('val_loss');
        return { x: c.x, y: c.series[0].y.map(String), marks: c.markers.map((m) => m.x) }; })()""")
    assert obj["x"] == list(range(STEPS)) and obj["y"][NAN_STEP] == "NaN" and obj["marks"] == [NAN_STEP]
    # the red tick is drawn: the canvas's pixels at the NaN step's column, at the top, are red
    red = page.evaluate("""(() => { const c = window.__torchscope.app.views.gradients.obj.metrics.charts.get('val_loss');
        const { L, pw, xmin, xmax } = c.geom, dpr = window.devicePixelRatio || 1;
        const x = Math.round(L + (5 - xmin) / (xmax - xmin) * pw), y = c.markRow.top + 2;
        const p = c.canvas.getContext('2d').getImageData(x * dpr, y * dpr, 1, 1).data; return [p[0], p[1], p[2]]; })()""")
    assert red[0] > 150 and red[1] < 80 and red[2] < 80, red
    # hover: the step and the value under the pointer
    canvas = page.locator("[data-testid=metric-chart][data-metric=acc] canvas")
    box = canvas.bounding_box()
    geom = page.evaluate("(() => { const g = window.__torchscope.app.views.gradients.obj.metrics.charts.get('acc').geom; return [g.L, g.pw]; })()")
    canvas.hover(position={"x": geom[0] + geom[1] * 3 / (STEPS - 1), "y": box["height"] / 2})
    tip = page.locator("[data-testid=metric-chart][data-metric=acc] .chart-tip")
    tip.wait_for(state="visible")
    acc3 = want["acc"]["value"][3]
    shown = page.evaluate(f"({acc3}) === 0 ? '0' : ({acc3}).toPrecision(4)")  # (fmtNum's format)
    assert tip.inner_text().split("\n") == ["step 3", f"acc: {shown}"], tip.inner_text()
    assert page.evaluate("window.__torchscope.app.views.gradients.obj.metrics.charts.get('acc').series[0].y[3]") == acc3
    # a click on a point marks its step across the view, as the loss chart's does
    canvas.click(position={"x": geom[0] + geom[1] * 3 / (STEPS - 1), "y": box["height"] / 2})
    page.wait_for_function("window.__torchscope.state().gradients.focus === 3")
    assert "step=3" in page.url


def test_many_metrics_show_eight_then_all_and_one_by_deep_link(srv: ServerProc, runs: dict[str, tuple[str, Path]],
                                                                checked: Any) -> None:  # noqa: F811
    page = checked
    sid, path = runs["eleven"]
    want = wire(load(path).metrics())
    names = sorted(want)
    assert len(names) == 11
    open_gradients(page, srv, sid)
    page.wait_for_function("window.__torchscope.state().gradients.metrics.names.length === 11", timeout=20_000)
    charts = page.locator("[data-testid=metric-charts] [data-testid=metric-chart]")
    assert [charts.nth(i).get_attribute("data-metric") for i in range(charts.count())] == names[:8]
    assert metrics_state(page)["shown"] == names[:8]
    show_all = page.locator("[data-testid=metric-show-all]")
    assert show_all.inner_text() == "show all 11"
    show_all.click()
    page.wait_for_function("window.__torchscope.state().gradients.metrics.shown.length === 11")
    assert charts.count() == 11 and "metrics=all" in page.url
    st = metrics_state(page)
    assert {n: {"step": c["step"], "value": c["value"]} for n, c in st["charts"].items()} == want
    assert show_all.inner_text() == "show the first 8"
    # the menu focuses one name: its chart alone, in the URL
    page.select_option("[data-testid=metric-pick]", "val_loss")
    page.wait_for_function("window.__torchscope.state().gradients.metrics.shown.join() === 'val_loss'")
    assert charts.count() == 1 and charts.first.get_attribute("data-metric") == "val_loss"
    assert "metric=val_loss" in page.url and show_all.is_hidden()
    shot(page, "metrics-focus-one")
    # a deep link to one metric opens it alone
    open_gradients(page, srv, sid, "&metric=m03")
    page.wait_for_function("window.__torchscope.state().gradients.metrics.names.length === 11", timeout=20_000)
    assert metrics_state(page)["shown"] == ["m03"] and charts.count() == 1
    assert page.locator("[data-testid=metric-pick]").input_value() == "m03"
    assert "metric=m03" in page.url
    assert metrics_state(page)["charts"]["m03"] == {**metrics_state(page)["charts"]["m03"], **want["m03"]}
    # back to the default from the menu: the first 8 again, the URL without metric=
    page.select_option("[data-testid=metric-pick]", "")
    page.wait_for_function("window.__torchscope.state().gradients.metrics.shown.length === 8")
    assert "metric" not in parse_qs(urlsplit(page.url).query)


def test_a_run_without_metrics_shows_no_metric_chart_only_a_hint(srv: ServerProc, runs: dict[str, tuple[str, Path]],
                                                                 checked: Any) -> None:  # noqa: F811
    page = checked
    sid, path = runs["none"]
    assert load(path).metrics() == {} and srv.get(f"/api/sessions/{sid}/metrics") == {}
    open_gradients(page, srv, sid)
    hint = page.locator("[data-testid=metrics-hint]")
    hint.wait_for(state="visible", timeout=20_000)
    assert hint.inner_text() == "Log your own numbers with torchscope.log(acc=...)"
    assert page.locator("[data-testid=metric-chart]").count() == 0
    assert page.locator("text=Your metrics (torchscope.log)").is_hidden()
    st = metrics_state(page)
    assert st["names"] == [] and st["charts"] == {} and not st["visible"] and st["hint"]
    shot(page, "metrics-none-hint")
    # one small line: no taller than a line of small text
    assert hint.bounding_box()["height"] <= 24


def test_a_live_run_s_metric_charts_grow_without_reload(tmp_path: Path, checked: Any) -> None:  # noqa: F811
    page = checked
    path = tmp_path / "live.tscope"
    with ServerProc(tmp_path / "data") as srv:
        run = forkrun.spawn([str(SCRIPT), "--server", srv.url, "--record", str(path), "--name", "live-metrics",
                             "--steps", "30", "--sleep", "0.25", "--nan-step", "4"])
        try:
            sid = session_id(srv, "live-metrics", "running")
            open_session(page, srv.url, sid, "?view=gradients")
            page.evaluate("window.__notReloaded = true")
            page.wait_for_function("(window.__torchscope.state().gradients?.metrics.charts.acc?.step.length || 0) >= 2", timeout=60_000)
            first = metrics_state(page)["charts"]["acc"]["step"]
            assert page.evaluate("window.__torchscope.state().gradients.metrics.hint") is False
            n = len(first)
            assert n < 30, "the run ended before the page saw it live: slow it down"
            page.wait_for_function(f"window.__torchscope.state().gradients.metrics.charts.acc.step.length >= {n + 4}", timeout=60_000)
            grown = metrics_state(page)
            assert grown["charts"]["acc"]["step"][:n] == first
            assert page.evaluate("window.__notReloaded") is True  # the same page: no reload
            text, _ = run.communicate(timeout=120)
            assert run.returncode == 0, text[-3000:]
            # the run's end: every step's metrics, the last one's too (logged after its step event)
            page.wait_for_function("document.getElementById('session-status').textContent === 'finished'", timeout=30_000)
            page.wait_for_function("window.__torchscope.state().gradients.metrics.charts.acc.step.length === 30", timeout=30_000)
            page.wait_for_function("window.__torchscope.state().gradients.metrics.charts.val_loss?.step.length === 30", timeout=30_000)
            st = metrics_state(page)
            assert {n: {"step": c["step"], "value": c["value"]} for n, c in st["charts"].items()} == wire(load(path).metrics())
            assert st["charts"]["val_loss"]["marks"] == [4]
            assert page.evaluate("window.__notReloaded") is True
            shot(page, "metrics-live-end")
        finally:
            if run.poll() is None:
                run.kill()
                run.wait(10)
