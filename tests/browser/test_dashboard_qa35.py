"""What the thirty-fifth session's QA (35a) found in the dashboard, looked at as a PyTorch user
would, checked in a real headless Chromium against a real `torchscope serve`, with runs
recorded by the repository's real example and training scripts:

- F2: a node's sub-label was cut in the middle of its tensor shape ("[16, 8, 3…layers.0.self_attn"
  for [16, 8, 32]): the shape stays whole now and only the module path is cut, from its start;
- F4: the loss the training loop computes (ops flagged ``outside_model``) read "(root)", as the
  model's own top-level ops do: "(outside the model)" now, in the graph and the details panel;
- F3: with gradient accumulation the graph holds every micro-batch's forward but the first
  backward's grad_fn nodes only, and said nothing of it: the status line says so now;
- F12: a light run's heat map promised "click a cell to open that step's graph" (it has none);
- F13: the activation panel's "captured steps only: step 0, every 50th step and steps whose
  graph changed" left out the steps captured after a NaN/Inf;
- F11: the learning rate, in force during its step, was drawn as ramps between steps: a step
  line now;
- F8: the sessions list sorted only when the header's text was clicked, not the rest of the cell.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import (
    DASHBOARD_TRAIN,
    checked_context,
    chromium,
    frame,
    graph_settled,
    open_session,
    recorded,
    shot,
)
from conftest import EXAMPLES, ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("qa35-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qa35-runs")


def record(srv: ServerProc, out: Path, name: str, script: Path, *args: str) -> str:
    """The session id of a real run of ``script``, recorded to ``out/<name>.tscope`` and imported."""
    return recorded(srv, out / f"{name}.tscope", script, *args)


@pytest.fixture(scope="module")
def transformer(srv: ServerProc, runs_dir: Path) -> str:
    return record(srv, runs_dir, "transformer", EXAMPLES / "transformer.py", "--steps", "1", "--server", "none")


@pytest.fixture(scope="module")
def accumulation(srv: ServerProc, runs_dir: Path) -> str:
    return record(srv, runs_dir, "accumulation", EXAMPLES / "pitfalls" / "clean_accumulation.py", "--steps", "1")


@pytest.fixture(scope="module")
def nan_run(srv: ServerProc, runs_dir: Path) -> str:
    return record(srv, runs_dir, "p04", EXAMPLES / "pitfalls" / "p04_nan_in_forward.py", "--steps", "5")


@pytest.fixture(scope="module")
def light(srv: ServerProc, runs_dir: Path) -> str:
    return record(srv, runs_dir, "light", DASHBOARD_TRAIN, "--steps", "4", "--mode", "light", "--name", "light")


@pytest.fixture(scope="module")
def schedule(srv: ServerProc, runs_dir: Path) -> str:
    return record(srv, runs_dir, "schedule", DASHBOARD_TRAIN, "--steps", "8", "--schedule", "--name", "schedule")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    with checked_context(browser) as pg:
        yield pg


def open_graph(page: Any, srv: ServerProc, sid: str) -> dict[str, Any]:
    """The graph view of ``sid`` once drawn; returns the step's graph as the server sends it."""
    open_session(page, srv.url, sid, "?view=graph")
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")
    step = page.evaluate("window.__torchscope.state().graph.step")
    return srv.get(f"/api/sessions/{sid}/graph?step={step}")  # type: ignore[return-value]


# The graph's boxes as built and as drawn (the sub-label cut to its box as it is drawn).
ITEMS = """() => window.__torchscope.app.views.graph.obj.scene.items.map((it) => (
  { key: it.key, group: it.group !== undefined, sub: it.sub, fit: it.fitSub ?? null }))"""


# ----------------------------------------------------------------------------- F2
def test_a_sub_label_keeps_its_tensor_shape_whole(page: Any, srv: ServerProc, transformer: str) -> None:
    graph = open_graph(page, srv, transformer)
    page.evaluate("window.__torchscope.expandAll()")
    graph_settled(page)  # drawn: sub-labels are cut as they are drawn
    shot(page, "qa35-sub-labels")
    items = page.evaluate(ITEMS)
    tensors = {t["id"]: t for t in graph["tensors"]}
    # each op's output shape as the capture recorded it, as the sub-label starts with it
    shapes = {f"o{o['id']}": "[" + ", ".join(map(str, tensors[o["outputs"][0]]["shape"])) + "]"
              for o in graph["ops"] if o.get("outputs") and "shape" in tensors.get(o["outputs"][0], {})}
    ops = [it for it in items if it["fit"] is not None and it["key"] in shapes]  # drawn, with a shape
    assert ops, items
    for it in ops:
        assert it["sub"].startswith(shapes[it["key"]] + " · "), it
    # "[8, 32, 64] · blocks.layers.0.self_attn" and the like are wider than their box
    cut = [it for it in ops if it["fit"] != it["sub"]]
    assert cut, ops
    for it in cut:
        # the shape whole, then the path's end after an ellipsis, or the shape alone
        shape, fit, path = shapes[it["key"]], it["fit"], it["sub"][len(shapes[it["key"]]) + 3:]
        if path.startswith("("):  # "(outside the model)": its short form, "(not in model)" ("(outside)" read
            # as nothing, QA 50b), or cut at its end (QA 36c)
            assert fit == shape or fit.startswith(f"{shape} · (not"), it
            continue
        assert fit == shape or (fit.startswith(f"{shape} · …") and path.endswith(fit[len(shape) + 4:])), it
    assert any(it["fit"].startswith(shapes[it["key"]] + " · …") for it in cut), cut


# ----------------------------------------------------------------------------- F4
def test_the_loss_outside_the_model_is_not_called_root(page: Any, srv: ServerProc, transformer: str) -> None:
    graph = open_graph(page, srv, transformer)
    outside = {f"o{o['id']}" for o in graph["ops"] if "outside_model" in o.get("flags", [])}
    root = {f"o{o['id']}" for o in graph["ops"] if not o["module"] and "outside_model" not in o.get("flags", [])}
    # the loop's cross_entropy, and TinyLM.forward's own `tok(idx) + pos[:t]`
    assert outside and root, graph["ops"]
    page.evaluate("window.__torchscope.expandAll()")
    graph_settled(page)
    subs = {it["key"]: it["sub"] for it in page.evaluate(ITEMS)}
    for k in outside:
        assert subs[k].endswith(" · (outside the model)") or subs[k] == "(outside the model)", (k, subs[k])
    # as drawn: never cut from its start ("…tside the model", QA 36c)
    fits = {it["key"]: it["fit"] for it in page.evaluate(ITEMS) if it["key"] in outside and it["fit"] is not None}
    assert fits and not [f for f in fits.values() if "…t" in f or "…i" in f], fits
    for k in root:
        assert subs[k].endswith("(root)"), (k, subs[k])
    # the loss's grad_fn, made by an op outside the model, says where its op ran
    loss_fn = f"n{graph['root']}"
    assert subs[loss_fn].endswith("(outside the model)"), subs[loss_fn]
    nll = next(f"o{o['id']}" for o in graph["ops"] if o["name"] == "aten::nll_loss_forward")
    assert nll in outside
    page.evaluate(f"window.__torchscope.select({json.dumps(nll)})")
    details = page.locator("[data-testid=details]")
    details.locator("table.kv").first.wait_for()
    module_row = details.locator("table.kv tr", has=page.locator("th", has_text="module")).first
    assert module_row.locator("td").inner_text() == "(outside the model)"
    assert "ran outside the model's forward" in details.inner_text()
    shot(page, "qa35-outside-the-model")
    add = next(k for k in root if graph["ops"][int(k[1:])]["name"] == "aten::add")
    page.evaluate(f"window.__torchscope.select({json.dumps(add)})")
    page.wait_for_function("document.querySelector('[data-testid=details] h3').textContent === 'aten::add'")
    assert module_row.locator("td").inner_text() == "(root)"


# ----------------------------------------------------------------------------- F3
def test_gradient_accumulation_says_whose_backward_is_drawn(page: Any, srv: ServerProc, accumulation: str) -> None:
    graph = open_graph(page, srv, accumulation)
    # what the capture holds: 4 micro-batches' forward ops, the first backward's nodes
    assert sorted({o["micro"] for o in graph["ops"]}) == [0, 1, 2, 3]
    assert graph["micro"] == 0 and {n["micro"] for n in graph["nodes"]} == {0}
    status = page.evaluate("window.__torchscope.state().graph.status")
    assert "4 micro-batches: forward ops of all, backward (grad_fn) of micro-batch 0." in status, status
    assert page.locator(".graph-status").is_visible()
    shot(page, "qa35-accumulation")


def test_one_micro_batch_adds_no_note(page: Any, srv: ServerProc, transformer: str) -> None:
    open_graph(page, srv, transformer)
    assert "micro-batch" not in page.evaluate("window.__torchscope.state().graph.status")


# ----------------------------------------------------------------------------- F12
def test_a_light_runs_heat_map_promises_no_graph(page: Any, srv: ServerProc, light: str, schedule: str) -> None:
    open_session(page, srv.url, light, "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps >= 4 && g.geom; })()",
                           timeout=60_000)
    g = page.evaluate("window.__torchscope.state().gradients")
    assert "open that step's graph" not in g["legend"], g["legend"]
    assert "click a cell to mark its step (a light run captures no graph)" in g["legend"], g["legend"]
    # and a click does what it says: the step marked, the view kept
    geom = g["geom"]
    page.locator("[data-testid=heatmap]").click(position={"x": geom["L"] + 2.5 * geom["cellW"], "y": geom["cellH"] / 2})
    page.wait_for_function("window.__torchscope.state().gradients.focus === 2")
    assert page.evaluate("window.__torchscope.state().view") == "gradients" and "step=2" in page.url
    shot(page, "qa35-light-heat-map")
    # a run with graphs still opens them
    open_session(page, srv.url, schedule, "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps >= 8; })()",
                           timeout=60_000)
    assert "click a cell to open that step's graph" in page.evaluate("window.__torchscope.state().gradients.legend")


# ----------------------------------------------------------------------------- F13
def test_the_activation_note_names_every_reason_a_step_was_captured(page: Any, srv: ServerProc, nan_run: str) -> None:
    captured = [g["step"] for g in srv.get(f"/api/sessions/{nan_run}/graphs")]  # type: ignore[union-attr]
    losses = srv.get(f"/api/sessions/{nan_run}/loss")["loss"]  # type: ignore[index]
    sample_every = 50  # the pitfall scripts' watch(): the default
    # steps captured neither as step 0 nor by the schedule: after a NaN (every loss is one)
    assert all(isinstance(v, str) or math.isnan(v) for v in losses), losses
    assert [s for s in captured if s and s % sample_every], captured
    open_session(page, srv.url, nan_run, "?view=gradients")
    page.wait_for_function("document.querySelector('[data-testid=act-step-note]') && "
                           "!document.querySelector('[data-testid=act-step-note]').hidden", timeout=60_000)
    note = page.locator("[data-testid=act-step-note]").inner_text()
    assert f"Step {captured[-1]}, the latest captured step" in note, note
    assert "every 50 steps" in note and "NaN/Inf" in note, note
    assert "every 50th step and steps whose graph changed" not in note


# ----------------------------------------------------------------------------- F11
# The lr chart's pixels at (x, y) in chart coordinates: the canvas's own RGBA.
PIXEL = """([x, y]) => { const c = window.__torchscope.app.views.gradients.obj.lr.canvas, d = window.devicePixelRatio || 1;
  return [...c.getContext('2d').getImageData(Math.round(x * d), Math.round(y * d), 1, 1).data]; }"""


def _hex(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def test_the_learning_rate_is_drawn_as_a_step_line(page: Any, srv: ServerProc, schedule: str) -> None:
    """The head's param group warms up 0.025, 0.05, 0.075, 0.1 over steps 0-3: between steps 0
    and 1 the line holds 0.025 (in force during step 0), then rises at step 1."""
    open_session(page, srv.url, schedule, "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.lr.x.length >= 8; })()",
                           timeout=60_000)
    page.locator("[data-testid=lr]").scroll_into_view_if_needed()
    frame(page)  # the chart redrawn (its ResizeObserver) before its pixels are read
    chart = page.evaluate("""() => { const c = window.__torchscope.app.views.gradients.obj.lr;
      return { geom: c.geom, axis: c.axis, series: c.series.map((s) => ({ y: s.y, color: s.color })) }; }""")
    geom, axis, head = chart["geom"], chart["axis"], chart["series"][1]
    assert head["y"][:4] == [pytest.approx(0.025), pytest.approx(0.05), pytest.approx(0.075), pytest.approx(0.1)]
    assert axis["log"] is False

    def xy(step: float, lr: float) -> tuple[float, float]:
        x = geom["L"] + (step - geom["xmin"]) / (geom["xmax"] - geom["xmin"]) * geom["pw"]
        return x, geom["T"] + geom["ph"] - (lr - axis["lo"]) / (axis["hi"] - axis["lo"]) * geom["ph"]

    want, bg = _hex(head["color"]), page.evaluate(PIXEL, [1, 1])[:3]  # the line's colour, the chart's panel

    def ink(x: float, y: float) -> float:
        """How much of the series' colour the pixel at (x, y) holds over the panel: 1 on the
        line, less where antialiasing blends its edge, 0 off it (the pixel projected on the
        panel -> colour segment)."""
        p = page.evaluate(PIXEL, [x, y])[:3]
        d = [c - b for c, b in zip(want, bg, strict=True)]
        return sum((q - b) * e for q, b, e in zip(p, bg, d, strict=True)) / sum(e * e for e in d)

    def inked(x: float, y: float) -> bool:  # the line within a pixel or two of (x, y)
        return max(ink(x + dx, y + dy) for dx in (-1, 0, 1) for dy in (-2, -1, 0, 1, 2)) > 0.5

    for s in (0, 1, 2):
        lo, hi = head["y"][s], head["y"][s + 1]
        assert inked(*xy(s + 0.5, lo)), f"no level line at {lo} between steps {s} and {s + 1}"
        assert not inked(*xy(s + 0.5, (lo + hi) / 2)), f"a ramp from step {s} to {s + 1}"
        assert inked(*xy(s + 1, (lo + hi) / 2)), f"no rise at step {s + 1}"
    shot(page, "qa35-lr-steps")


# ----------------------------------------------------------------------------- F8
def test_a_sessions_header_sorts_from_anywhere_in_its_cell(page: Any, srv: ServerProc, light: str,
                                                            schedule: str) -> None:
    page.goto(srv.url + "/")
    page.locator(f"tr[data-id='{light}']").wait_for()
    for key in ("name", "started", "doctor"):
        th = page.locator(f"th[data-sort={key}]")
        cell, button = th.bounding_box(), th.locator("button").bounding_box()
        assert cell["width"] > button["width"] + 40, (cell, button)  # room beside the text
        # a click in the cell's right part, well clear of the button
        page.mouse.click(cell["x"] + cell["width"] - 10, cell["y"] + cell["height"] / 2)
        page.wait_for_function(f"location.search.includes('sort={key}')", timeout=5_000)
        assert page.locator(f"th[data-sort={key}]").get_attribute("aria-sort") is not None
        # and the pointer says the cell is a control
        assert page.evaluate(f"getComputedStyle(document.querySelector('th[data-sort={key}]')).cursor") == "pointer"
    # again on the same cell: the order reverses
    before = page.url
    th = page.locator("th[data-sort=doctor]")
    cell = th.bounding_box()
    page.mouse.click(cell["x"] + cell["width"] - 10, cell["y"] + cell["height"] / 2)
    page.wait_for_function(f"location.href !== {json.dumps(before)}")
    assert ("dir=asc" in before) != ("dir=asc" in page.url)
    # the button itself still sorts, once (its click reaches the cell: not twice, a no-op)
    before = page.url
    page.locator("th[data-sort=name] button").click()
    page.wait_for_function(f"location.href !== {json.dumps(before)} && location.search.includes('sort=name')")
    before = page.url
    page.locator("th[data-sort=name] button").click()
    page.wait_for_function(f"location.href !== {json.dumps(before)}")
    assert ("dir=asc" in before) != ("dir=asc" in page.url)
    shot(page, "qa35-sessions-sorted")
