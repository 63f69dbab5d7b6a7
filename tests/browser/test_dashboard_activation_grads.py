"""The gradient reaching each module's output (``StepEvent.activation_grads``) in the Gradients
view, in a real headless Chromium against a real `torchscope serve`, with runs recorded by a
real training script (tests/browser/dashboard_train_actgrads.py) whose answer is known:

- six down-scaled ``nn.Linear`` in a row: the gradient w.r.t. their outputs shrinks about twenty
  times per layer on its way back (vanishing towards ``inp``), large at ``head``;
- ``dead``: its ReLU never fires, so the gradient reaching its output is all zeros (dead);
- ``shared``: called twice, one row gathering both calls (×2);
- ``--poison-last``: on the last step, ``sqrt`` of the ReLU's zeros makes the gradient reaching
  ``relu``'s output infinite.

The dashboard never showed these statistics.  The numbers expected are read from the recorded
``.tscope`` file itself.  Also three small items a review found: the per-op memory chart's x
axis had no name, the "Chosen parameters" list no hint that Ctrl/⌘-click picks several, and
the sessions list a blank doctor cell for a run without errors or warnings.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import DASHBOARD_TRAIN, checked_context, chromium, contrast, open_session, recorded, shot
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

SCRIPT = Path(__file__).resolve().parent / "dashboard_train_actgrads.py"
# the modules of DeepMLP in the order their forwards start (the session's module list, which
# registration order makes the same here); the capture lists them as their forwards end
FORWARD = ["", "inp", "layers", *[f"layers.{i}" for i in range(6)], "shared", "dead", "relu", "head"]


def port_in_range() -> int | None:
    """A free port of 6270-6279 (this session's range), else None (any free port)."""
    for port in range(6270, 6280):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return None


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("act-server"), port=port_in_range()) as s:
        yield s


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("act-runs")


@pytest.fixture(scope="module")
def full(srv: ServerProc, runs_dir: Path) -> tuple[str, Path]:
    path = runs_dir / "full.tscope"
    return recorded(srv, path, SCRIPT, "--mode", "full", "--steps", "3", "--poison-last"), path


@pytest.fixture(scope="module")
def default(srv: ServerProc, runs_dir: Path) -> str:
    return recorded(srv, runs_dir / "default.tscope", SCRIPT, "--mode", "default", "--steps", "4")


@pytest.fixture(scope="module")
def light(srv: ServerProc, runs_dir: Path) -> str:
    return recorded(srv, runs_dir / "light.tscope", SCRIPT, "--mode", "light", "--steps", "2")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    with checked_context(browser, 1280, 900) as p:
        yield p


def step_event(path: Path, step: int) -> dict[str, Any]:
    from torchscope.sessionfile import iter_events

    return next(e for e in iter_events(path) if e.get("kind") == "step" and e["step"] == step)


def open_panel(page: Any, srv: ServerProc, sid: str, query: str = "") -> None:
    open_session(page, srv.url, sid, f"?view=gradients{query}")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients;"
                           " return g && (g.acts.modules.length > 0 || g.acts.empty); })()")


# The panel's rows as drawn: module, label, each number's text, the flags, the zero column's
# colour and the bar's width, with the theme's colours to compare against.
ROWS = """() => [...document.querySelectorAll('[data-testid=act-row]')].map((r) => ({
  module: r.dataset.module, label: r.querySelector('.act-name').textContent,
  norm: r.querySelector('[data-testid=act-norm]').textContent, max: r.querySelector('[data-testid=act-max]').textContent,
  zeros: r.querySelector('[data-testid=act-zeros]').textContent, flags: r.querySelector('.act-flags').textContent,
  dead: !!r.querySelector('[data-testid=act-dead]'), nonfinite: !!r.querySelector('[data-testid=act-nonfinite]'),
  zerosColor: getComputedStyle(r.querySelector('[data-testid=act-zeros]')).color,
  nameColor: getComputedStyle(r.querySelector('.act-name')).color,
  bar: r.querySelector('.act-bar').getBoundingClientRect().width,
  track: r.querySelector('.act-track').getBoundingClientRect().width }))"""

# the theme's red (--cut) and panel colour as computed rgb() strings
THEME = """() => { const probe = document.createElement('span'); document.body.append(probe);
  probe.style.color = 'var(--cut)'; const cut = getComputedStyle(probe).color;
  probe.style.color = 'var(--panel)'; const panel = getComputedStyle(probe).color; probe.remove();
  return { cut, panel }; }"""


def set_theme(page: Any, theme: str) -> None:
    if page.evaluate("document.documentElement.dataset.theme") != theme:
        page.locator("#theme").click()
    assert page.evaluate("document.documentElement.dataset.theme") == theme


def test_rows_in_forward_order_with_the_recorded_numbers(page: Any, srv: ServerProc, full: tuple[str, Path]) -> None:
    sid, path = full
    ev = step_event(path, 1)
    recorded = {a["module"]: a for a in ev["activation_grads"]}
    # the capture's own order is not the forward's (a parent after its children, the root last)
    assert [a["module"] for a in ev["activation_grads"]] != FORWARD and set(recorded) == set(FORWARD)
    open_panel(page, srv, sid, "&step=1")
    acts = page.evaluate("window.__torchscope.state().gradients.acts")
    assert acts["step"] == 1 and acts["note"] == "" and acts["modules"] == FORWARD
    rows = page.evaluate(ROWS)
    assert [r["module"] for r in rows] == FORWARD
    # the heat map's labels: the root named, a numbered module with its type
    assert rows[0]["label"] == "(root)" and rows[3]["label"] == "layers.0 (Linear)" and rows[1]["label"] == "inp"
    for r in rows:
        want = recorded[r["module"]]
        assert float(r["norm"]) == pytest.approx(want["norm"], rel=1e-3), r
        assert float(r["max"]) == pytest.approx(want["max_abs"], rel=1e-3), r
        assert r["zeros"].endswith(f"{round(100 * want['zero_frac'], 1):g} %"), r
        # the dead module alone marked, in red; "×2" where the row gathers two calls
        assert r["dead"] == (want["zero_frac"] >= 0.99) == (r["module"] == "dead"), r
        assert ("×2" in r["flags"]) == (want.get("calls") == 2) == (r["module"] == "shared"), r
        assert not r["nonfinite"]
    theme = page.evaluate(THEME)
    dead = next(r for r in rows if r["module"] == "dead")
    assert dead["zerosColor"] == theme["cut"] and dead["nameColor"] == theme["cut"] and dead["bar"] < 10
    assert rows[1]["zerosColor"] != theme["cut"]
    # vanishing towards the input: each Linear's bar shorter than the next one's (log scale)
    bars = [r["bar"] for r in rows[3:9]]
    assert all(a < b - 5 for a, b in zip(bars, bars[1:], strict=False)), bars
    assert max(r["bar"] for r in rows) <= rows[0]["track"] + 0.5
    shot(page, "act-grads-1280-light")


def test_hover_shows_the_exact_numbers_and_nonfinite_rows_are_red(page: Any, srv: ServerProc, full: tuple[str, Path]) -> None:
    sid, path = full
    open_panel(page, srv, sid, "&step=2")
    ev = step_event(path, 2)
    recorded = {a["module"]: a for a in ev["activation_grads"]}
    for module in ("layers.0", "shared", "dead"):
        page.locator(f"[data-testid=act-row][data-module='{module}']").hover()
        text = page.locator("[data-testid=act-hover]").inner_text()
        want = recorded[module]
        got = dict(re.findall(r"(‖grad_output‖₂|max \|g\||zero fraction) (\S+)", text))
        assert float(got["‖grad_output‖₂"]) == want["norm"] and float(got["max |g|"]) == want["max_abs"], text
        assert float(got["zero fraction"]) == want["zero_frac"], text
        assert ("2 calls gathered" in text) == (module == "shared"), text
    # step 2's relu got an infinite gradient: marked in red with its count, the rest not
    assert recorded["relu"]["norm"] == float("inf")
    rows = {r["module"]: r for r in page.evaluate(ROWS)}
    theme = page.evaluate(THEME)
    assert rows["relu"]["nonfinite"] and rows["relu"]["norm"] == "Infinity" and f"Inf ×{recorded['relu']['inf']}" in rows["relu"]["flags"]
    assert rows["relu"]["nameColor"] == theme["cut"]
    assert [m for m, r in rows.items() if r["nonfinite"]] == ["relu"]
    assert rows["dead"]["dead"]


def test_both_themes_and_widths(browser: Any, srv: ServerProc, full: tuple[str, Path]) -> None:
    sid, _ = full
    for width in (1280, 1920):
        with checked_context(browser, width, 1000) as page:
            open_panel(page, srv, sid, "&step=1")
            for theme in ("light", "dark"):
                set_theme(page, theme)
                page.locator("[data-testid=act-panel]").scroll_into_view_if_needed()
                colours = page.evaluate(THEME)
                # the red of a dead module reads on the panel in either theme (WCAG AA: 4.5)
                assert contrast(colours["cut"], colours["panel"]) >= 4.5, (theme, colours)
                box = page.evaluate("""() => { const b = document.querySelector('[data-testid=act-grads]');
                  const names = [...b.querySelectorAll('.act-name')];
                  return { sw: b.scrollWidth, cw: b.clientWidth, cut: names.filter((n) => n.scrollWidth > n.clientWidth).length }; }""")
                assert box["sw"] <= box["cw"] and box["cut"] == 0, (width, theme, box)
                page.locator("[data-testid=act-panel]").screenshot(path=f"/tmp/h31act/act-grads-{width}-{theme}.png")
            set_theme(page, "light")


def test_a_step_without_them_shows_the_nearest_captured_one(page: Any, srv: ServerProc, default: str) -> None:
    open_panel(page, srv, default, "&step=3")
    acts = page.evaluate("window.__torchscope.state().gradients.acts")
    assert acts["step"] == 0 and acts["modules"] == FORWARD
    note = page.locator("[data-testid=act-step-note]").inner_text()
    assert note.startswith("Step 3 recorded no gradients w.r.t. module outputs (captured steps only:"), note
    assert "showing step 0, the nearest captured step before it" in note, note
    # no step picked: the latest captured one, said so; the menu picks another (and marks it)
    open_panel(page, srv, default)
    assert page.evaluate("window.__torchscope.state().gradients.acts.step") == 0
    assert "the latest captured step" in page.locator("[data-testid=act-step-note]").inner_text()
    assert page.evaluate("[...document.querySelector('[data-testid=act-step]').options].map((o) => o.value)") == ["0"]


def test_a_light_run_says_why_it_has_none(page: Any, srv: ServerProc, light: str) -> None:
    open_panel(page, srv, light)
    empty = page.locator("[data-testid=act-empty]").inner_text()
    assert 'mode="light"' in empty and "records none" in empty and 'mode="full"' in empty, empty
    assert page.locator("[data-testid=act-row]").count() == 0
    page.locator("[data-testid=act-panel]").screenshot(path="/tmp/h31act/act-grads-light-run.png")


def test_a_row_opens_its_module_in_the_graph_at_that_step(page: Any, srv: ServerProc, full: tuple[str, Path]) -> None:
    sid, _ = full
    open_panel(page, srv, sid, "&step=1")
    page.locator("[data-testid=act-row][data-module='layers.3']").click()
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.step === 1 && g.nodes.some((n) => n.hi); })()")
    assert page.evaluate("window.__torchscope.state().view") == "graph"
    mods = page.evaluate("""() => { const v = window.__torchscope.app.views.graph.obj;
      return [...new Set(v.model.leaves.filter((l) => v.highlight.has(l.key)).map((l) => l.module))]; }""")
    assert mods and all(m == "layers.3" or m.startswith("layers.3.") for m in mods), mods


# ----------------------------------------------------------------------------- small items
def test_the_per_op_memory_chart_names_its_x_axis(page: Any, srv: ServerProc, full: tuple[str, Path]) -> None:
    sid, _ = full
    open_session(page, srv.url, sid, "?view=memory&step=1")
    page.wait_for_function("(() => { const m = window.__torchscope.state().memory; return m && m.timeline > 0; })()")
    axis = page.evaluate("window.__torchscope.state().memory.timelineAxis")
    assert axis["xTitle"].startswith("op #"), axis
    page.locator(".view-memory .chart", has_text="live bytes after each recorded op").screenshot(path="/tmp/h31act/memory-op-axis.png")


def test_the_parameter_list_says_ctrl_click_picks_several(page: Any, srv: ServerProc, full: tuple[str, Path]) -> None:
    sid, _ = full
    open_session(page, srv.url, sid, "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps > 0; })()")
    hint = page.locator("[data-testid=param-pick-hint]").inner_text()
    assert "Ctrl-click" in hint and "⌘-click" in hint and "several" in hint, hint
    # placed with the list it is about
    assert page.evaluate("document.querySelector('[data-testid=param-pick-hint]').nextElementSibling.dataset.testid") == "param-pick"


def test_the_sessions_list_says_a_clean_run_has_no_findings(page: Any, srv: ServerProc, runs_dir: Path,
                                                            full: tuple[str, Path]) -> None:
    clean = recorded(srv, runs_dir / "clean.tscope", DASHBOARD_TRAIN, "--steps", "2", "--name", "clean-run")
    deadline = time.monotonic() + 60  # the doctor looks at a run once it ended: "checking…" until then
    while not (listed := {s["id"]: s for s in srv.get("/api/sessions")})[clean]["diagnosed"]:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the clean run was never diagnosed"
        time.sleep(0.2)
    assert listed[clean]["errors"] == listed[clean]["warnings"] == 0
    assert listed[full[0]]["warnings"] > 0  # P3: the gradients vanish through the scaled-down layers
    page.goto(srv.url + "/")
    page.locator(f"tr[data-id='{clean}']").wait_for()
    cell = lambda sid: page.locator(f"tr[data-id='{sid}'] td:nth-child(6)").inner_text()  # noqa: E731 (the doctor column)
    assert cell(clean) == "no errors or warnings"
    assert "warning" in cell(full[0]) and "no errors" not in cell(full[0])
    shot(page, "act-sessions-doctor-cell")
