"""What optimizer.step() did, in the Loss & gradients view: the update-to-weight ratio
(|update| / |weight|) and the weight norm the capture reads in modes default and full on step 0,
every 10th step and the captured steps (docs/capture.md "What the step did with them").

- The "Chosen parameters" chart has a statistic menu (‖grad‖, max |grad|, share of zeros in
  grad, update ÷ weight, ‖weight‖): update ÷ weight is drawn on a log axis through the steps
  that read it (a line, not dots between gaps), with the numbers the recording holds, its
  title saying what it is and how to read it; the choice is kept in the URL.
- The heat map switches between ‖grad‖ and update ÷ weight, a module's ratio the RMS of its
  parameters' ratios weighted by their norms, sqrt(Σ‖Δw‖² / Σ‖w‖²); steps that did not read it
  are "not read", drawn apart from "no gradient".
- A light run (no update statistics) has those menu items disabled, saying why.
- The charts' NaN/Inf markers are a row of ticks at the top, and their titles say so.

Checked in a real headless Chromium against a real `torchscope serve`, with runs of
dashboard_train_update_ratio.py (an MLP under AdamW whose layer ``2`` has a learning rate 1000x
the others') recorded to files and imported, against ``torchscope.load(path).grads()``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked, module_browser, open_session, recorded, shot  # noqa: F401 - fixtures
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

TRAIN = Path(__file__).resolve().parent / "dashboard_train_update_ratio.py"
STEPS = 40
FAST = "2"  # the layer trained at 1000x the others' learning rate
VIEW = "window.__torchscope.state().gradients"
AID = "~1e-3 typical; 1e-1 and up: the learning rate is too high for that parameter; under 1e-5 it barely moves"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("update-ratio-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The default and the light run: session id and ``torchscope.load(path).grads()`` of each."""
    import torchscope

    out = tmp_path_factory.mktemp("update-ratio-runs")
    got: dict[str, dict[str, Any]] = {}
    for mode in ("default", "light"):
        path = out / f"{mode}.tscope"
        truth = out / f"{mode}.truth.json"
        sid = recorded(srv, path, TRAIN, "--mode", mode, "--steps", str(STEPS), "--name", f"ratio-{mode}", "--truth", str(truth))
        got[mode] = {"sid": sid, "grads": torchscope.load(str(path)).grads(), "truth": json.loads(truth.read_text())}
    # the runs are what these tests need: the default run read the ratios on a few steps, the light one on none
    ratio = got["default"]["grads"]["update_ratio"]
    assert 3 <= sum(r is not None for r in ratio) < STEPS
    assert not any(r for r in got["light"]["grads"]["update_ratio"])
    return got


@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


def gradients_view(page: Any, srv: ServerProc, sid: str, query: str = "") -> dict[str, Any]:
    open_session(page, srv.url, sid, f"?view=gradients{query}")
    page.wait_for_function(f"(() => {{ const g = {VIEW}; return g && g.steps >= {STEPS}; }})()")
    return page.evaluate(VIEW)  # type: ignore[no-any-return]


def read_steps(grads: dict[str, Any]) -> list[int]:
    """The indices of the steps that read the update statistics."""
    return [s for s, r in enumerate(grads["update_ratio"]) if r is not None]


def module_ratio(run: dict[str, Any], s: int, module: str) -> float:
    """sqrt(Σ‖Δw‖² / Σ‖w‖²) over the module's parameters at step index ``s``, ‖w‖ before the
    step, as plain PyTorch computed them in the training script (its ``--truth``)."""
    truth = run["truth"][s]
    of = [p for p, owner in enumerate(run["grads"]["modules"]) if owner == module]
    return math.sqrt(sum(truth["update"][p] ** 2 for p in of) / sum(truth["before"][p] ** 2 for p in of))


def test_the_chart_draws_the_recorded_update_ratio_through_the_steps_that_read_it(
        page: Any, srv: ServerProc, runs: dict[str, dict[str, Any]]) -> None:
    run = runs["default"]
    grads = run["grads"]
    gradients_view(page, srv, run["sid"])
    page.select_option("[data-testid=param-pick]", [str(p) for p in range(len(grads["params"]))])
    menu = page.locator("[data-testid=param-stat]")
    assert menu.count() == 1, "no statistic menu on the chosen parameters' chart"
    assert menu.locator("option").all_inner_texts() == ["‖grad‖", "max |grad|", "share of zeros in grad", "update ÷ weight", "‖weight‖"]
    page.select_option("[data-testid=param-stat]", "update_ratio")
    page.wait_for_function(f"{VIEW}.lines.series.length === {len(grads['params'])} && {VIEW}.stat === 'update_ratio'")
    g = page.evaluate(VIEW)
    lines = g["lines"]
    read = read_steps(grads)
    # x: the steps that read the ratio (QA 53c: the run's last step was a point too, "–" for
    # every line), the x axis still the run's steps
    kept = read
    assert lines["x"] == [grads["steps"][s] for s in kept] and STEPS - 1 not in kept
    geom = page.evaluate("(() => { const g = window.__torchscope.app.views.gradients.obj.lines.geom; return [g.xmin, g.xmax]; })()")
    assert geom == [grads["steps"][0], grads["steps"][STEPS - 1]]
    label = page.locator("[data-testid=param-lines] canvas").first.get_attribute("aria-label") or ""
    assert f"{len(read)} points, step 0 to {grads['steps'][read[-1]]} (of steps 0 to {STEPS - 1})" in label, label
    assert [s["name"] for s in lines["series"]] == grads["params"]
    for p, series in enumerate(lines["series"]):
        want = [grads["update_ratio"][s][p] if grads["update_ratio"][s] is not None else None for s in kept]
        assert series["y"] == pytest.approx(want, rel=1e-12), series["name"]
        # consecutive read steps are adjacent points: one line through them, no gap between
        ys = [series["y"][kept.index(s)] for s in read]
        # (but "4.bias", zero before step 0: no ratio there)
        assert read[0] == 0 and (ys[0] is None) == (series["name"] == "4.bias"), (series["name"], ys[0])
        assert all(v is not None and v > 0 for v in ys[1:])
    assert lines["log"] is True and lines["axis"]["log"] is True
    fast = [p for p, m in enumerate(grads["modules"]) if m == FAST]
    # (not "4.bias": grown from zero by 1e-5 a step, its ratio stays large)
    slow = [p for p in range(len(grads["params"])) if p not in fast and grads["params"][p] != "4.bias"]
    for s in read:
        row = grads["update_ratio"][s]
        assert min(row[p] for p in fast) >= 100 * max(row[p] for p in slow), (s, row)
    # the axis holds every value, the slow layers' 1e-4 and the fast one's 1e-1 alike
    values = [v for s in read for v in grads["update_ratio"][s] if v is not None]
    assert 10 ** lines["axis"]["lo"] <= min(values) and max(values) <= 10 ** lines["axis"]["hi"]
    title = lines["title"]
    assert title.startswith("update ÷ weight per step") and "optimizer.step()" in title and "log scale" in title
    assert AID in title and page.locator("[data-testid=ratio-aid]").inner_text() == AID
    # a line, not dots: the canvas column halfway between two read steps holds the fast
    # parameter's colour (drawn only where a segment joins them)
    first = grads["params"].index(f"{FAST}.weight")
    colour = page.evaluate(f"window.__torchscope.app.views.gradients.obj.lines.series[{first}].color")
    a, b = grads["steps"][read[0]], grads["steps"][read[1]]
    column = page.evaluate(
        """([a, b, colour]) => {
          const ch = window.__torchscope.app.views.gradients.obj.lines, c = ch.canvas, g = ch.geom;
          const dpr = c.width / parseFloat(c.style.width), ctx = c.getContext("2d");
          const x = g.L + (((a + b) / 2 - g.xmin) / (g.xmax - g.xmin)) * g.pw;
          const px = ctx.getImageData(Math.round(x * dpr), Math.round(g.T * dpr), 1, Math.round(g.ph * dpr)).data;
          const want = [1, 3, 5].map((i) => parseInt(colour.slice(i, i + 2), 16));
          let hits = 0;
          for (let i = 0; i < px.length; i += 4) if (want.every((v, k) => Math.abs(px[i + k] - v) < 40)) hits++;
          return hits;
        }""", [a, b, colour])
    assert column > 0
    page.locator("[data-testid=param-lines]").scroll_into_view_if_needed()
    shot(page, "update-ratio-chart")
    # the choice is kept in the URL (a reload, a shared link) and across live reloads
    assert "stat=update_ratio" in page.url
    page.evaluate("window.__torchscope.app.views.gradients.obj.loadGrads()")
    page.wait_for_function(f"{VIEW}.stat === 'update_ratio'")
    again = gradients_view(page, srv, run["sid"], "&stat=weight_norm")
    assert again["stat"] == "weight_norm" and page.locator("[data-testid=param-stat]").input_value() == "weight_norm"
    assert again["lines"]["log"] is True and again["lines"]["title"].startswith("‖weight‖ per step")
    assert "stat=weight_norm" in page.url
    for series in again["lines"]["series"]:
        p = grads["params"].index(series["name"])
        want = [grads["weight_norm"][s][p] if grads["weight_norm"][s] is not None else None for s in kept]
        assert series["y"] == pytest.approx(want, rel=1e-12)


def test_a_chart_writes_its_values_in_one_notation(page: Any, srv: ServerProc, runs: dict[str, dict[str, Any]]) -> None:
    """QA 53c: a value was written by its own size, so one chart read "6.00e-4" at one point and
    "0.001200" at the next; the two param groups' lrs here (1e-5 and 1e-2) read "1.00e-5" beside
    "0.01000".  A chart's read-out and its description now write every value alike."""
    gradients_view(page, srv, runs["default"]["sid"])
    tip = page.locator("[data-testid=lr] .chart-tip")
    page.locator("[data-testid=lr] canvas").focus()
    page.keyboard.press("Home")
    tip.wait_for(state="visible")
    assert tip.inner_text().split("\n") == ["step 0", "param group 0: 1.000e-5", "param group 1: 1.000e-2"]
    label = page.locator("[data-testid=lr] canvas").get_attribute("aria-label") or ""
    assert "param group 0: from 1.000e-5 to 1.000e-5" in label and "param group 1: from 1.000e-2 to 1.000e-2" in label, label


def test_the_heat_map_shows_update_over_weight_per_module(page: Any, srv: ServerProc,
                                                           runs: dict[str, dict[str, Any]]) -> None:
    run = runs["default"]
    grads = run["grads"]
    g = gradients_view(page, srv, run["sid"])
    assert g.get("heat", {}).get("stat") == "norm", "no heat map statistic"
    assert page.locator("[data-testid=heat-stat] option").all_inner_texts() == ["‖grad‖", "update ÷ weight"]
    page.select_option("[data-testid=heat-stat]", "update_ratio")
    page.wait_for_function(f"{VIEW}.heat.stat === 'update_ratio'")
    g = page.evaluate(VIEW)
    cells = g["heat"]["cells"]
    assert sorted(cells) == ["0", "2", "4"]
    read = set(read_steps(grads))
    for module, row in cells.items():
        for s, v in enumerate(row):
            if s not in read:
                assert v == "not read", (module, s, v)
            else:
                assert v == pytest.approx(module_ratio(run, s, module), rel=1e-5), (module, s)
    for s in read:
        assert cells[FAST][s] >= 100 * max(cells["0"][s], cells["4"][s]), s
        # the file's ‖Δw‖ (1.15) is plain PyTorch's; "4.bias" was zero before step 0: no ratio, yet it moved
        assert grads["update_norm"][s] == pytest.approx(run["truth"][s]["update"], rel=1e-5), s
    bias = grads["params"].index("4.bias")
    assert grads["update_ratio"][0][bias] is None and run["truth"][0]["update"][bias] > 0
    legend = g["legend"]
    assert "update ÷ weight" in legend and "sqrt(Σ‖Δw‖² / Σ‖w‖²)" in legend
    assert "not read that step" in legend and "grey = no gradient" in legend
    assert "‖grad‖" not in legend
    assert "heat=update_ratio" in page.url
    # a cell not read is drawn apart from one with no gradient (grey) and from a value
    geom = g["geom"]
    colours = page.evaluate(
        """([geom, steps]) => {
          const c = document.querySelector("[data-testid=heatmap]"), ctx = c.getContext("2d");
          const dpr = c.width / parseFloat(c.style.width);
          return steps.map((s) => Array.from(ctx.getImageData(Math.round((geom.L + s * geom.cellW + 1) * dpr),
                                                              Math.round(3 * dpr), 1, 1).data).slice(0, 3));
        }""", [geom, [1, 10]])
    grey = page.evaluate("""(() => { const c = document.createElement('canvas').getContext('2d');
      c.fillStyle = getComputedStyle(document.documentElement).getPropertyValue('--node-none').trim(); c.fillRect(0, 0, 1, 1);
      return Array.from(c.getImageData(0, 0, 1, 1).data).slice(0, 3); })()""")
    panel = page.evaluate("""(() => { const c = document.createElement('canvas').getContext('2d');
      c.fillStyle = getComputedStyle(document.documentElement).getPropertyValue('--panel').trim(); c.fillRect(0, 0, 1, 1);
      return Array.from(c.getImageData(0, 0, 1, 1).data).slice(0, 3); })()""")
    assert colours[0] == panel and colours[0] != grey and colours[1] not in (grey, panel), colours
    heat = page.locator("[data-testid=heatmap]")
    row = g["modules"].index(FAST)
    heat.hover(position={"x": geom["L"] + 2 + geom["cellW"], "y": row * geom["cellH"] + 6})
    assert page.locator("[data-testid=heat-hover]").inner_text().startswith(f"{FAST} (Linear) · step 1 · update ÷ weight not read")
    heat.hover(position={"x": geom["L"] + 2 + 10 * geom["cellW"], "y": row * geom["cellH"] + 6})
    said = page.locator("[data-testid=heat-hover]").inner_text()
    assert said.startswith(f"{FAST} (Linear) · step 10 · update ÷ weight "), said
    assert float(said.split("update ÷ weight ")[1].split(" ")[0]) == pytest.approx(cells[FAST][10], rel=1e-3)
    page.locator("[data-testid=heatmap]").scroll_into_view_if_needed()
    shot(page, "update-ratio-heat")
    # back to ‖grad‖: the norms, every step
    page.select_option("[data-testid=heat-stat]", "norm")
    page.wait_for_function(f"{VIEW}.heat.stat === 'norm'")
    norms = page.evaluate(VIEW)["heat"]["cells"][FAST]
    assert all(isinstance(v, float) and v > 0 for v in norms) and "heat=" not in page.url


def test_a_light_run_says_it_has_no_update_statistics(page: Any, srv: ServerProc,
                                                      runs: dict[str, dict[str, Any]]) -> None:
    run = runs["light"]
    # asked for by the URL all the same (a link from another run): ‖grad‖, not an empty chart
    g = gradients_view(page, srv, run["sid"], "&stat=update_ratio&heat=update_ratio")
    assert g.get("stat") == "norm" and g.get("heatStat") == "norm" and g["lines"]["series"]
    assert "stat=" not in page.url and "heat=" not in page.url
    items = page.evaluate("""[...document.querySelectorAll('[data-testid=param-stat] option, [data-testid=heat-stat] option')]
      .map((o) => ({ menu: o.parentElement.dataset.testid, value: o.value, text: o.textContent, disabled: o.disabled, title: o.title }))""")
    off = {(i["menu"], i["value"]): i for i in items if i["disabled"]}
    assert set(off) == {("param-stat", "update_ratio"), ("param-stat", "weight_norm"), ("heat-stat", "update_ratio")}
    for item in off.values():
        assert "not recorded in light mode" in item["text"]
        assert item["title"].startswith("Not recorded: mode light reads no update statistics"), item
    # the other statistics stay (light reads max |grad| and the zeros on step 0 and every 10th step)
    page.select_option("[data-testid=param-stat]", "max_abs")
    page.wait_for_function(f"{VIEW}.stat === 'max_abs'")
    lines = page.evaluate(VIEW)["lines"]
    assert lines["x"] == [0, 10, 20, 30] and lines["title"].startswith("max |grad| per step")
    page.locator("[data-testid=param-stat]").scroll_into_view_if_needed()
    shot(page, "update-ratio-light")


def test_the_nan_markers_are_named_as_drawn(page: Any, srv: ServerProc, runs: dict[str, dict[str, Any]]) -> None:
    """The NaN/Inf markers are a thin row of ticks at the top: the titles said "red dots"."""
    g = gradients_view(page, srv, runs["default"]["sid"])
    titles = page.locator(".view-gradients .chart-title").all_inner_texts()
    total = page.locator("[data-testid=total-norm] .chart-title").inner_text()
    assert total == "‖grad‖₂ of all parameters together, per step (log scale; red ticks at the top: NaN/Inf)"
    assert g["lines"]["title"] == "‖grad‖ per step (red ticks at the top: NaN/Inf)"
    assert "red ticks at the top: a NaN/Inf loss" in g["loss"]["title"]
    assert not [t for t in titles if "red dots" in t], titles


def test_a_run_from_before_the_update_statistics_says_so(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """A default-mode run whose steps carry no update statistics (recorded by a torchscope
    before format 1.7): the items are disabled too, their tooltip saying why."""
    import time

    from torchscope.transport import Transport

    sid = f"old-{int(time.time() * 1000)}"
    t = Transport(str(tmp_path / "old.tscope"), sid, rank=0, server=srv.url)
    t.emit({"kind": "session", "schema": [1, 6], "session_id": sid, "name": "old", "started_at": time.time(),
            "rank": 0, "world_size": 1, "mode": "default", "model": "Net", "modules": [],
            "params": [{"name": n, "module": n.rsplit(".", 1)[0], "shape": [2], "numel": 2, "requires_grad": True}
                       for n in ("a.weight", "b.weight")]})
    for s in range(STEPS):
        t.emit({"kind": "step", "step": s, "rank": 0, "t": time.time(), "duration_us": 1000,
                "grads": {"norm": [1.0, 0.5], "nan": [0, 0], "inf": [0, 0], "none": []}})
    t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": STEPS})
    deadline = time.monotonic() + 20
    while srv.get(f"/api/sessions/{sid}")["status"] != "finished" and time.monotonic() < deadline:  # type: ignore[index]
        time.sleep(0.2)
    g = gradients_view(page, srv, sid, "&heat=update_ratio")
    assert g.get("heatStat") == "norm" and g["heat"]["stat"] == "norm"
    off = page.evaluate("""[...document.querySelectorAll('[data-testid=param-stat] option, [data-testid=heat-stat] option')]
      .filter((o) => o.disabled).map((o) => [o.value, o.textContent, o.title])""")
    assert sorted(v for v, _, _ in off) == ["max_abs", "update_ratio", "update_ratio", "weight_norm", "zero_frac"]
    for value, text, title in off:
        assert text.endswith("— not recorded"), text
        if value in ("update_ratio", "weight_norm"):
            assert "a recording from a torchscope before format 1.7 has none" in title, title
