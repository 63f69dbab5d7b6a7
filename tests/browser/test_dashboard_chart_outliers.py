"""The charts' y range on a run that blows up (QA): one finite spike (a loss of 5e27 at one
step) set the loss chart's log axis to 1e-3..1e33, so the loss that stays ~50x higher after it
looked level with the healthy part ("the loss never recovered" was invisible); on a NaN run
the red NaN/Inf dots were a thick bar along the top; on a linear axis one spike flattened the
rest.

Now (TensorBoard's "ignore outliers in chart scaling"): the axis fits the bulk of the values,
the few far outside it are drawn as a triangle at the plot's edge and counted in the chart's
head ("1 point off scale ▲"), the tooltip still gives their true value, an "ignore outliers"
checkbox gives the whole range back (remembered: across redraws, charts and page loads), and
NaN/Inf markers are a thin row of ticks just inside the top edge.

Checked in a real headless Chromium against a real `torchscope serve`, with real runs of
dashboard_train_spike.py (a ReLU MLP whose one corrupted batch, with the lr raised, spikes the
loss once and leaves it ~50x higher), against the losses the script printed.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked, module_browser, open_session, session_id, shot  # noqa: F401 (fixtures)
from conftest import ServerProc, run_script

playwright_sync = pytest.importorskip("playwright.sync_api")

TRAIN = Path(__file__).resolve().parent / "dashboard_train_spike.py"
STEPS, SPIKE = 160, 80
CHART = "window.__torchscope.app.views.gradients.obj"


def js_exp(x: float) -> str:
    """``x.toExponential(3)`` as the page writes it ("8.057e-3", "5.653e+27"): a chart whose
    values leave 1e-3..1e4 writes every one so (dom.js columnFormat)."""
    mantissa, exp = f"{x:.3e}".split("e")
    return f"{mantissa}e{exp[0]}{int(exp[1:])}"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("outlier-server")) as s:
        yield s


@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


def _run(srv: ServerProc, out: Path, name: str, *extra: str) -> tuple[str, list[float]]:
    res = run_script(TRAIN, "--server", srv.url, "--record", str(out / f"{name}.tscope"), "--name", name,
                     "--steps", str(STEPS), "--spike", str(SPIKE), *extra, timeout=240)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1]
    return session_id(srv, name, "finished"), json.loads(line)["losses"]


@pytest.fixture(scope="module")
def spike(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[float]]:
    """A run whose loss spikes once (finite) and then stays ~30-50x higher: (session id, the losses it printed)."""
    sid, losses = _run(srv, tmp_path_factory.mktemp("spike-run"), "spike")
    # the run is what these tests need: finite throughout, one huge step, a plateau far above the healthy part
    assert all(math.isfinite(v) for v in losses) and len(losses) == STEPS
    assert losses[SPIKE] > 1e25 and max(losses[:SPIKE] + losses[SPIKE + 1:]) < 10
    assert 20 < plateau(losses) / healthy(losses) < 80
    return sid, losses


@pytest.fixture(scope="module")
def nan_run(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[float]]:
    """The same run, its corrupted batch overflowing the loss: Inf at the spike, NaN after."""
    sid, losses = _run(srv, tmp_path_factory.mktemp("nan-run"), "nan", "--nan")
    assert all(math.isfinite(v) for v in losses[:SPIKE]) and math.isinf(losses[SPIKE])
    assert all(math.isnan(v) for v in losses[SPIKE + 1:])
    return sid, losses


def healthy(losses: list[float]) -> float:
    """The loss before the spike, once trained (the 20 steps before it)."""
    return statistics.median(losses[SPIKE - 20:SPIKE])


def plateau(losses: list[float]) -> float:
    """The loss it stayed at after the spike."""
    return statistics.median(losses[SPIKE + 5:])


def gradients_view(page: Any, srv: ServerProc, sid: str) -> dict[str, Any]:
    open_session(page, srv.url, sid, "?view=gradients")
    page.wait_for_function(f"(() => {{ const g = window.__torchscope.state().gradients; "
                           f"return g && g.loss.x.length >= {STEPS} && g.steps >= {STEPS}; }})()", timeout=60_000)
    return chart(page, "loss")


def chart(page: Any, name: str) -> dict[str, Any]:
    """A LineChart's state: its axis, geometry, off-scale triangles, NaN/Inf row, head's note and checkbox."""
    return page.evaluate(f"""(() => {{ const c = {CHART}.{name};
      return {{ axis: c.axis, geom: c.geom, offMarks: c.offMarks || [], markRow: c.markRow || null, marks: c.markers.map((m) => m.x),
                note: !c.offNote || c.offNote.hidden ? null : c.offNote.textContent, toggle: !!c.fitLabel && !c.fitLabel.hidden,
                checked: !!c.fitBox?.checked, ms: c.lastDrawMs }}; }})()""")  # type: ignore[no-any-return]


def x_of(c: dict[str, Any], step: float) -> float:
    g = c["geom"]
    return float(g["L"] + (step - g["xmin"]) / (g["xmax"] - g["xmin"]) * g["pw"])


def tooltip(page: Any, testid: str, c: dict[str, Any], step: int) -> str:
    page.locator(f"[data-testid={testid}] canvas").hover(position={"x": x_of(c, step), "y": c["geom"]["T"] + c["geom"]["ph"] / 2})
    tip = page.locator(f"[data-testid={testid}] .chart-tip")
    tip.wait_for(state="visible")
    return tip.inner_text()  # type: ignore[no-any-return]


def pixels(page: Any, testid: str, x0: int, x1: int, y0: int, y1: int) -> list[list[list[int]]]:
    """The canvas's RGBA pixels in [x0, x1) x [y0, y1) (CSS px), rows of columns."""
    return page.evaluate("""([sel, x0, x1, y0, y1]) => {
      const cv = document.querySelector(sel), ctx = cv.getContext("2d"), dpr = window.devicePixelRatio || 1;
      const d = ctx.getImageData(x0 * dpr, y0 * dpr, (x1 - x0) * dpr, (y1 - y0) * dpr);
      const rows = [];
      for (let y = 0; y < d.height; y++) { const row = []; for (let x = 0; x < d.width; x++) { const i = (y * d.width + x) * 4;
        row.push([d.data[i], d.data[i + 1], d.data[i + 2], d.data[i + 3]]); } rows.push(row); }
      return rows; }""", [f"[data-testid={testid}] canvas", x0, x1, y0, y1])  # type: ignore[no-any-return]


def reddish(p: list[int]) -> bool:
    return p[0] > 120 and p[0] - p[1] > 60 and p[0] - p[2] > 60


def bluish(p: list[int]) -> bool:  # the first series' colour, #2563eb
    return p[2] > 150 and p[2] - p[0] > 60


def test_the_loss_axis_fits_the_run_not_its_one_spike(page: Any, srv: ServerProc, spike: tuple[str, list[float]]) -> None:
    sid, losses = spike
    assert srv.get(f"/api/sessions/{sid}/loss")["loss"] == losses  # type: ignore[index]
    c = gradients_view(page, srv, sid)
    axis = c["axis"]
    rest = losses[:SPIKE] + losses[SPIKE + 1:]
    # a log axis (the losses span decades) over every loss but the spike, in whole decades
    assert axis["log"] is True
    assert 10 ** axis["lo"] <= min(rest) and max(rest) <= 10 ** axis["hi"] < losses[SPIKE] / 1e10, axis
    assert axis.get("fit") is True and axis.get("offScale") == 1
    # the divergence story reads: the plateau after the spike sits well above the healthy
    # part, a quarter of the plot's height or more (it was 4 % with the spike in range)
    gap = (math.log10(plateau(losses)) - math.log10(healthy(losses))) / (axis["hi"] - axis["lo"])
    assert gap >= 0.25, (gap, axis)
    # the spike: one ▲ at the top edge at its step, in the line's colour, and the head says so
    assert [(m["x"], m["up"], m["y"]) for m in c["offMarks"]] == [(SPIKE, True, c["geom"]["T"])]
    assert c["note"] == "1 point off scale ▲" and c["toggle"] and c["checked"]
    assert page.locator("[data-testid=loss] .chart-offscale").inner_text() == "1 point off scale ▲"
    px, top = round(c["offMarks"][0]["px"]), round(c["geom"]["T"])
    tri = pixels(page, "loss", px - 1, px + 2, top + 3, top + 5)
    assert any(bluish(p) for row in tri for p in row), tri
    # the tooltip gives its true value (and that it is off the scale); a plateau step's is plain
    # (one notation for the chart's values, the spike's: 4 significant digits with an exponent)
    assert tooltip(page, "loss", c, SPIKE) == f"step {SPIKE}\nloss: {js_exp(losses[SPIKE])} (off scale ▲)"
    assert tooltip(page, "loss", c, SPIKE + 10) == f"step {SPIKE + 10}\nloss: {js_exp(losses[SPIKE + 10])}"
    shot(page, "chart-outliers-loss")


def test_the_toggle_gives_the_whole_range_back_and_is_remembered(page: Any, srv: ServerProc,
                                                                 spike: tuple[str, list[float]]) -> None:
    sid, losses = spike
    fitted = gradients_view(page, srv, sid)["axis"]
    box = page.locator("[data-testid=loss] .chart-fit input")
    assert page.locator("[data-testid=loss] .chart-fit").inner_text(timeout=5000).strip() == "ignore outliers"
    box.uncheck()
    whole = chart(page, "loss")
    # today's whole range: every loss, the spike included, and nothing off scale
    assert whole["axis"].get("fit") is False and whole["axis"].get("offScale") == 0 and whole["offMarks"] == []
    assert 10 ** whole["axis"]["lo"] <= min(losses) and losses[SPIKE] <= 10 ** whole["axis"]["hi"]
    assert whole["note"] is None and whole["toggle"] and whole["checked"] is False
    assert not page.locator("[data-testid=loss] .chart-offscale").is_visible()
    # kept across redraws: a click marking a step redraws the chart, so does a resize
    page.locator("[data-testid=loss] canvas").click(position={"x": x_of(whole, 40), "y": 60})
    page.wait_for_function("window.__torchscope.state().gradients.focus === 40")
    page.set_viewport_size({"width": 1100, "height": 800})
    page.wait_for_function(f"{CHART}.loss.geom.pw !== {whole['geom']['pw']}")
    assert chart(page, "loss")["axis"].get("fit") is False
    # and across page loads (and charts): localStorage
    assert page.evaluate("localStorage.getItem('torchscope-chart-fit')") == "0"
    again = gradients_view(page, srv, sid)
    assert again["axis"].get("fit") is False and again["checked"] is False and again["toggle"]
    page.locator("[data-testid=loss] .chart-fit input").check()
    back = chart(page, "loss")
    assert back["axis"].get("fit") is True and back["axis"]["hi"] == fitted["hi"] and back["note"] == "1 point off scale ▲"
    assert page.evaluate("localStorage.getItem('torchscope-chart-fit')") == "1"


def test_a_linear_chart_fits_its_bulk_too(page: Any, srv: ServerProc, spike: tuple[str, list[float]]) -> None:
    """The chosen parameters' gradient norms (a linear axis): the corrupted batch's gradients
    (3e13 on the biases) left out, the rest of the run in range."""
    sid, _ = spike
    gradients_view(page, srv, sid)
    grads: dict[str, Any] = srv.get(f"/api/sessions/{sid}/grads")  # type: ignore[assignment]
    picked = ["0.bias", "2.bias"]
    cols = [grads["params"].index(p) for p in picked]
    norms = [[grads["norm"][s][p] for s in range(STEPS)] for p in cols]
    assert all(1e12 < n[SPIKE] < 1e20 for n in norms)  # finite and huge at the spike
    rest = [v for n in norms for s, v in enumerate(n) if s != SPIKE]
    assert max(rest) < 100
    page.select_option("[data-testid=param-pick]", [str(p) for p in cols])
    page.wait_for_function(f"{CHART}.lines.series.length === 2")
    c = chart(page, "lines")
    assert c["axis"]["log"] is False
    assert c["axis"]["lo"] <= min(rest) and max(rest) <= c["axis"]["hi"] < min(n[SPIKE] for n in norms), c["axis"]
    assert c["axis"].get("fit") is True and c["axis"].get("offScale") == 2
    assert c["axis"]["hi"] <= 2 * max(rest) + 1  # the rest fills the plot, not a sliver of it
    assert sorted((m["x"], m["up"]) for m in c["offMarks"]) == [(SPIKE, True), (SPIKE, True)]
    assert c["note"] == "2 points off scale ▲"
    page.locator(".view-gradients .chart", has_text="‖grad‖ per step").last.scroll_into_view_if_needed()
    shot(page, "chart-outliers-linear")


def test_nan_markers_are_a_thin_row_at_the_top(page: Any, srv: ServerProc, nan_run: tuple[str, list[float]]) -> None:
    sid, losses = nan_run
    c = gradients_view(page, srv, sid)
    bad = list(range(SPIKE, STEPS))
    assert c["marks"] == bad
    # the markers: a row of ticks at most 6 px high just inside the top edge (the dots of 8 px
    # at T + 6 made a thick bar over the NaN steps)
    g = c["geom"]
    assert c["axis"]["log"] is True
    x0, x1 = math.floor(x_of(c, SPIKE)) - 3, math.ceil(x_of(c, STEPS - 1)) + 3
    top = int(g["T"])
    band = pixels(page, "loss", x0, x1, top, top + 7)
    below = pixels(page, "loss", x0, x1, top + 7, top + 30)
    for step in bad:  # a tick at every NaN/Inf step
        x = round(x_of(c, step)) - x0
        assert any(reddish(band[y][x + dx]) for y in range(len(band)) for dx in (-1, 0, 1)), step
    reds = sorted({top + 7 + y for y, r in enumerate(below) for p in r if reddish(p)})
    assert reds == [], f"red pixels under the row of markers, at y = {reds} (the plot starts at {top})"
    # no finite loss is far from the rest: the axis is the whole range, as it always was
    finite = losses[:SPIKE]
    assert c["axis"].get("fit") is False and c["offMarks"] == [] and c["note"] is None and not c["toggle"]
    assert c["axis"]["log"] is True and c["axis"]["lo"] == math.floor(math.log10(min(finite)))
    assert c["axis"]["hi"] == math.ceil(math.log10(max(finite)))
    row = c["markRow"]
    assert row["top"] >= g["T"] and row["top"] + row["height"] <= g["T"] + 6
    # their tooltip: the step's loss is NaN
    assert tooltip(page, "loss", c, SPIKE + 3) == f"step {SPIKE + 3}\nloss: NaN"
    assert tooltip(page, "loss", c, SPIKE) == f"step {SPIKE}\nloss: Infinity"
    shot(page, "chart-outliers-nan")


def test_a_long_series_with_a_spike_finds_its_bulk_once_per_data(page: Any, srv: ServerProc, spike: tuple[str, list[float]]) -> None:
    """100,000 steps with one spike and a dip: the bulk range found by selection once per
    setData, not per draw (the same object through draws fitted and not; a new one for new
    data); the two points off scale, one each way. (How fast: benchmarks/bench_dashboard.py.)"""
    open_session(page, srv.url, spike[0], "?view=gradients")
    got = page.evaluate("""async () => {
      const { LineChart } = await import("/static/chart.js");
      const host = document.createElement("div"); host.style.width = "900px"; document.body.append(host);
      const c = new LineChart(host, { title: "long" });
      const n = 100000, x = new Array(n), y = new Array(n);
      for (let i = 0; i < n; i++) { x[i] = i; y[i] = 2 + Math.sin(i / 500) + 0.1 * ((i * 7919) % 13) / 13; }
      y[31337] = 7e27; y[77777] = -5e20;
      c.setData(x, [{ name: "loss", y: y.slice() }]);
      const state = { axis: c.axis, offMarks: (c.offMarks || []).map((m) => [m.x, m.up]), note: c.offNote?.textContent };
      const bulk = c.bulk;
      let kept = 0;
      for (let k = 0; k < 3; k++) { c.fitChoice = true; c.draw(); kept += c.bulk === bulk; c.fitChoice = false; c.draw(); kept += c.bulk === bulk; }
      c.setData(x, [{ name: "loss", y: y.slice() }]);
      return { ...state, kept, renewed: c.bulk !== bulk && !!c.bulk };
    }""")
    assert got["axis"].get("fit") is True and got["axis"].get("offScale") == 2 and got["note"] == "2 points off scale ▲▼"
    assert got["axis"]["lo"] <= 1 and 3.1 <= got["axis"]["hi"] <= 5
    assert sorted(got["offMarks"]) == [[31337, True], [77777, False]]
    assert got["kept"] == 6 and got["renewed"], got


AXIS_LABELS = """async (ys) => {
  const { LineChart } = await import("/static/chart.js");
  const host = document.createElement("div"); host.style.width = "600px"; document.body.append(host);
  const c = new LineChart(host, { title: "axis" });
  c.setData(ys.map((_, i) => i), [{ name: "y", y: ys }]);
  const labels = c.axis.labels.slice();
  host.remove();
  return labels;
}"""


@pytest.mark.parametrize("ys, exponents", [
    ([0.001, 0.001, 0.0005, 0.0015, 0.001], False),  # a learning rate with warm-up and decay
    ([1e-5, 3e-5, 5e-5, 2e-5], True),
    ([10_000.0, 60_000.0, 150_000.0, 90_000.0], True),
    ([0.5, 1.25, 2.0, 0.75], False),
], ids=["lr", "tiny", "large", "plain"])
def test_one_axis_writes_its_numbers_one_way(page: Any, srv: ServerProc, spike: tuple[str, list[float]],
                                             ys: list[float], exponents: bool) -> None:
    """Exponents on every label of an axis or on none (QA 42b: "5.0e-4 / 0.0010 / 0.0015"), with
    as many digits on each: the labels tell the steps apart and read alike."""
    open_session(page, srv.url, spike[0], "?view=gradients")
    labels = page.evaluate(AXIS_LABELS, ys)
    assert len(labels) >= 3, labels
    nonzero = [x for x in labels if float(x) != 0]
    assert {"e" in x for x in nonzero} == {exponents}, labels
    assert len({len(x.lstrip("-").split("e")[0]) for x in nonzero}) == 1, labels  # as many digits on each
    values = [float(x) for x in labels]
    assert values == sorted(values) and len(set(values)) == len(values), labels


LEGEND = """async ([a, b]) => {
  const { LineChart } = await import("/static/chart.js");
  const host = document.createElement("div"); host.style.width = "600px"; document.body.append(host);
  const c = new LineChart(host, { title: "clip" });
  c.setData(a.map((_, i) => i), [{ name: "after clipping", y: a }, { name: "before clipping", y: b }]);
  const text = [...host.querySelectorAll(".chart-legend")].map((e) => e.textContent).join(" ");
  host.remove();
  return text;
}"""


def test_a_series_equal_to_the_last_bits_is_said_to_be_the_same(page: Any, srv: ServerProc, spike: tuple[str, list[float]]) -> None:
    """QA 42b: a gradient norm before clipping (float32) and after it (float64) when clipping did
    nothing differ in the last bits; drawn one over the other they read as one purple line."""
    open_session(page, srv.url, spike[0], "?view=gradients")
    after = [0.9281618, 0.75, 1.2]
    before = [float(f"{v:.7g}") * (1 + 3e-8) for v in after]
    assert before != after
    assert "before clipping (same values as after clipping)" in page.evaluate(LEGEND, [after, before])
    apart = [v * 1.001 for v in after]  # a thousandth apart: drawn as two lines, named as two
    assert "(same" not in page.evaluate(LEGEND, [after, apart])


def test_a_long_flat_series_stays_a_solid_line(page: Any, srv: ServerProc, spike: tuple[str, list[float]]) -> None:
    """More points than pixel columns: each column's values are joined to the next column's in
    one path.  A stroke per column, unjoined, drew a flat line as a row of faint dots, and a slow
    one without its width and dashes (QA 46c: a 5,000-step run's memory chart)."""
    open_session(page, srv.url, spike[0], "?view=gradients")
    got = page.evaluate("""async () => {
      const { LineChart } = await import("/static/chart.js");
      const host = document.createElement("div"); host.style.width = "700px"; document.body.append(host);
      const c = new LineChart(host, { title: "long flat" });
      const n = 5000, x = [], flat = [], slow = [];
      for (let i = 0; i < n; i++) { x.push(i); flat.push(2); slow.push(1 + i / n); }
      c.setData(x, [{ name: "flat", y: flat }, { name: "slow", y: slow }]);
      const { L, pw, T, ph } = c.geom, { lo, hi } = c.axis, dpr = window.devicePixelRatio || 1;
      const row = Math.round((T + ph * (hi - 2) / (hi - lo)) * dpr);
      const ctx = c.canvas.getContext("2d");
      const px = ctx.getImageData(0, row - 1, c.canvas.width, 3).data, w = c.canvas.width;
      const bg = ctx.getImageData(2, 2, 1, 1).data;
      let solid = 0, cols = 0;
      for (let col = Math.ceil((L + 4) * dpr); col < Math.floor((L + pw - 4) * dpr); col++) {
        cols++;
        let best = 0; // the darkest of the three rows around the line, against the background
        for (let r = 0; r < 3; r++) {
          const k = 4 * (r * w + col);
          best = Math.max(best, Math.abs(px[k] - bg[0]) + Math.abs(px[k + 1] - bg[1]) + Math.abs(px[k + 2] - bg[2]));
        }
        solid += best > 300; // a full-strength line; the old strokes were about half as dark
      }
      host.remove();
      return { solid, cols };
    }""")
    assert got["cols"] > 500 and got["solid"] >= 0.95 * got["cols"], got


def test_a_chart_reads_to_a_screen_reader_and_walks_with_the_keyboard(page: Any, srv: ServerProc,
                                                                    spike: tuple[str, list[float]]) -> None:
    """The canvas charts were pictures alone: nothing for a screen reader to say, nothing a
    keyboard could reach.  Now the canvas is an image labelled with each line's range and last
    value, and the arrow keys (Home, End, Page Up / Down) move the tooltip's read-out over the
    points, a live region a screen reader says aloud; Enter marks the step as a click does."""
    sid, losses = spike
    gradients_view(page, srv, sid)
    canvas = page.locator("[data-testid=loss] canvas")
    tip = page.locator("[data-testid=loss] .chart-tip")
    assert canvas.get_attribute("role") == "img" and canvas.get_attribute("tabindex") == "0"
    assert tip.get_attribute("role") == "status" and tip.get_attribute("aria-live") == "polite"
    label = canvas.get_attribute("aria-label") or ""
    assert f": {STEPS} points, step 0 to {STEPS - 1}. " in label and label.endswith("Arrow keys read the points."), label

    def read(key: str) -> tuple[int, str]:
        page.keyboard.press(key)
        tip.wait_for(state="visible")
        head, value = tip.inner_text().split("\n", 1)
        return int(head.removeprefix("step ")), value.removeprefix("loss: ")

    canvas.focus()
    step, last = read("End")
    assert step == STEPS - 1 and math.isclose(float(last), losses[-1], rel_tol=1e-3)
    assert read("ArrowLeft")[0] == STEPS - 2
    assert read("Home")[0] == 0 and read("ArrowLeft")[0] == 0  # held at the ends
    assert read("PageDown")[0] == STEPS // 10
    # the label's numbers are the tooltip's: the spike is the top of the range, the last step's the last value
    page.keyboard.press("Home")
    for _ in range(SPIKE):
        page.keyboard.press("ArrowRight")
    spike_step, top = read("ArrowRight")
    assert spike_step == SPIKE + 1
    step, top = read("ArrowLeft")
    assert step == SPIKE and top.endswith(" (off scale ▲)")
    assert f"loss: from {js_exp(min(losses))} to {top.removesuffix(' (off scale ▲)')}, last {last}." in label, label
    page.keyboard.press("Enter")
    page.wait_for_function(f"window.__torchscope.state().gradients.focus === {SPIKE}")
    canvas.blur()
    tip.wait_for(state="hidden")
    # the heat map is a picture too: labelled with its size and the largest modules at the last step
    grads: dict[str, Any] = srv.get(f"/api/sessions/{sid}/grads")  # type: ignore[assignment]
    per_module: dict[str, float] = {}
    for name, norm in zip(grads["params"], grads["norm"][-1], strict=True):
        module = name.rsplit(".", 1)[0]
        per_module[module] = per_module.get(module, 0.0) + norm * norm
    top = max(per_module, key=lambda m: per_module[m])
    heat = page.locator("[data-testid=heatmap]").get_attribute("aria-label") or ""
    assert heat.startswith(f"gradient norm per module (rows) and step (columns): {len(per_module)} modules, "
                           f"steps 0 to {STEPS - 1}. largest at step {STEPS - 1}: {top} ("), heat  # "0 (Linear)"
    assert heat.endswith("Hover a cell to read it.") and "NaN or Inf" not in heat
