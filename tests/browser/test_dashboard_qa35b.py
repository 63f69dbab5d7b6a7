"""What the thirty-fifth session's QA (35a) found in the dashboard, the second part, checked in a
real headless Chromium against a real `torchscope serve`, with runs recorded by the repository's
real example, pitfall and training scripts:

- F6: after Enter expanded the selected module, "n" went back to the graph's first module: it
  goes into the expanded module now (its first op), "p" to what ran before it, and Enter on its
  frame collapses it again;
- F7: "diff" on a run with one captured step painted every node the grey of "same": the option
  is disabled there (its title says why), a diff asked by the URL leaves the nodes uncoloured
  and the legend says why; and with a diff's step menu the toolbar was two rows at 1280 px;
- F9: "Path to loss" on an op that does not reach the loss lit its few descendants, silently;
- F5: the details panel took 40 % of a 1024 px window; the activation-gradient axis's decade
  labels ran together ("1e101e111e12") at 1024 px;
- F11: log axes mixed "1e+8" with "10000" and "1000" with "1e4"; a max_norm line lying under
  the clipped norm's line was lost, with nothing in the legend to say where it is;
- F10: the "≡ n" marks pointed the opposite way in the backward column ("0: Conv2d ≡ 4"
  across from "4: Conv2d ≡ 0"), and a Sequential's child read "1 op · 0", as if two counts;
- F14: the first view of a CNN at 1280 × 800 cut the loss and its grad_fn off under the legend.
"""

from __future__ import annotations

import contextlib
import re
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

ACTGRADS = Path(__file__).resolve().parent / "dashboard_train_actgrads.py"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("qa35b-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qa35b-runs")


@pytest.fixture(scope="module")
def cnn(srv: ServerProc, runs_dir: Path) -> str:
    """An nn.Sequential CNN (two Conv-BN-ReLU-MaxPool blocks alike), one step: one captured."""
    return recorded(srv, runs_dir / "cnn.tscope", EXAMPLES / "cnn.py", "--steps", "1", "--server", "none")


@pytest.fixture(scope="module")
def transformer(srv: ServerProc, runs_dir: Path) -> str:
    return recorded(srv, runs_dir / "tf.tscope", EXAMPLES / "transformer.py", "--steps", "1", "--server", "none")


@pytest.fixture(scope="module")
def transformer_full(srv: ServerProc, runs_dir: Path) -> str:
    """Two steps in full mode: both captured, so a diff has a step to compare with."""
    return recorded(srv, runs_dir / "tf-full.tscope", EXAMPLES / "transformer.py", "--steps", "2", "--mode", "full",
                    "--server", "none")


@pytest.fixture(scope="module")
def vanishing(srv: ServerProc, runs_dir: Path) -> str:
    """P3: the gradient reaching the modules' outputs spans a dozen decades at step 0."""
    return recorded(srv, runs_dir / "p03.tscope", EXAMPLES / "pitfalls" / "p03_vanishing_gradients.py")


@pytest.fixture(scope="module")
def actgrads(srv: ServerProc, runs_dir: Path) -> str:
    """Down-scaled layers and a head scaled by 1000: gradients from 1e-4 to 1e5."""
    return recorded(srv, runs_dir / "act.tscope", ACTGRADS, "--mode", "default")


@pytest.fixture(scope="module")
def clipped(srv: ServerProc, runs_dir: Path) -> str:
    """clip_grad_norm_ with a max_norm under every step's norm: clipped on every step."""
    return recorded(srv, runs_dir / "clip.tscope", DASHBOARD_TRAIN, "--steps", "6", "--clip", "0.01", "--name", "clip")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    with checked_context(browser) as pg:
        yield pg


def open_graph(page: Any, srv: ServerProc, sid: str, query: str = "") -> dict[str, Any]:
    """The graph view of ``sid`` once drawn; returns the step's graph as the server sends it."""
    open_session(page, srv.url, sid, f"?view=graph{query}")
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")
    graph_settled(page)
    step = page.evaluate("window.__torchscope.state().graph.step")
    return srv.get(f"/api/sessions/{sid}/graph?step={step}")  # type: ignore[return-value]


def selected(page: Any) -> str:
    return page.evaluate("window.__torchscope.state().graph.selected")  # type: ignore[no-any-return]


def press(page: Any, key: str) -> None:
    """A key, then the select or the layout in the worker it started, drawn."""
    page.keyboard.press(key)
    graph_settled(page)


def expect_selected(page: Any, key: str) -> None:
    """The graph's selection becomes ``key`` (a wrong one times out and fails, saying what it is)."""
    with contextlib.suppress(playwright_sync.TimeoutError):
        page.wait_for_function(f"window.__torchscope.state().graph.selected === {key!r}", timeout=15_000)
    assert selected(page) == key


# ----------------------------------------------------------------------------- F6
def test_n_after_enter_walks_into_the_module_it_expanded(page: Any, srv: ServerProc, cnn: str) -> None:
    graph = open_graph(page, srv, cnn)
    relu = next(f"o{o['id']}" for o in graph["ops"] if o["module"] == "2")  # 2: ReLU, one op
    page.evaluate("window.__torchscope.select('g:forward:2')")
    page.wait_for_function("window.__torchscope.state().graph.selected === 'g:forward:2'")
    page.evaluate("document.activeElement && document.activeElement.blur()")  # the keys from no text field
    press(page, "Enter")
    page.wait_for_function("window.__torchscope.state().graph.expanded.includes('forward:2')")
    graph_settled(page)
    assert selected(page) == "g:forward:2"  # a frame now, in no place of the n / p order
    press(page, "n")
    expect_selected(page, relu)  # the expanded module's first op, not the graph's first module
    press(page, "n")
    expect_selected(page, "g:forward:3")
    # from the frame, "p" goes to what ran before the module
    page.evaluate("window.__torchscope.select('g:forward:2')")
    expect_selected(page, "g:forward:2")
    graph_settled(page)
    press(page, "p")
    expect_selected(page, "g:forward:1")
    # Enter on the frame of an expanded module collapses it
    page.evaluate("window.__torchscope.select('g:forward:2')")
    expect_selected(page, "g:forward:2")
    graph_settled(page)
    press(page, "Enter")
    page.wait_for_function("!window.__torchscope.state().graph.expanded.includes('forward:2')")
    shot(page, "qa35b-keys-after-enter")


# ----------------------------------------------------------------------------- F7
DIFF_OPTION = "(() => { const o = document.querySelector('[data-testid=overlay] option[value=diff]'); return { disabled: o.disabled, title: o.title }; })()"


def test_no_diff_with_one_captured_step(page: Any, srv: ServerProc, cnn: str) -> None:
    assert [g["step"] for g in srv.get(f"/api/sessions/{cnn}/graphs")] == [0]  # type: ignore[union-attr]
    open_graph(page, srv, cnn)
    opt = page.evaluate(DIFF_OPTION)
    assert opt["disabled"] and "only one step is captured" in opt["title"], opt
    # asked by a URL all the same: the nodes keep the phase's colours, and the legend says why
    phase = {n["key"]: n["color"] for n in page.evaluate("window.__torchscope.state().graph.nodes")}
    open_graph(page, srv, cnn, "&overlay=diff")
    page.wait_for_function("window.__torchscope.state().graph.overlay === 'diff'")
    page.wait_for_function("document.querySelector('[data-testid=legend]').textContent.includes('no other step')")
    graph_settled(page)
    nodes = page.evaluate("window.__torchscope.state().graph.nodes")
    assert {n["key"]: n["color"] for n in nodes} == phase
    legend = page.locator("[data-testid=legend]").inner_text()
    assert "same" not in legend.split("\n"), legend  # no "same" swatch
    shot(page, "qa35b-diff-one-step")


def test_the_toolbar_stays_one_row_with_the_diff_menu_at_1280(page: Any, srv: ServerProc, transformer_full: str) -> None:
    open_graph(page, srv, transformer_full)
    assert not page.evaluate(DIFF_OPTION)["disabled"]  # two captured steps: a diff to choose
    page.locator("[data-testid=overlay]").select_option("diff")
    diff_menu = page.locator("[aria-label='diff against step']")
    diff_menu.wait_for(state="visible")
    assert diff_menu.locator("option").all_inner_texts() == ["diff vs step 1"]
    tops = page.evaluate("""() => Array.from(document.querySelector(".view-graph .toolbar").children)
        .filter((e) => e.offsetParent !== null).map((e) => e.getBoundingClientRect().top)""")
    assert max(tops) - min(tops) < 10, tops  # one row
    shot(page, "qa35b-diff-toolbar-1280")


# ----------------------------------------------------------------------------- F9
def reaches(graph: dict[str, Any]) -> dict[int, bool]:
    """Whether each op's output flows (op to op, through tensor ids) into the op that made the loss."""
    ops = sorted(graph["ops"], key=lambda o: o["id"])
    loss = next(n for n in graph["nodes"] if n["id"] == graph["root"])["op"]
    producer: dict[int, int] = {}
    users: dict[int, set[int]] = {o["id"]: set() for o in ops}
    for o in ops:
        for t in o.get("inputs", []):
            if t in producer and producer[t] != o["id"]:
                users[producer[t]].add(o["id"])
        for t in o.get("outputs", []):
            producer[t] = o["id"]
    res: dict[int, bool] = {}
    for o in reversed(ops):  # users come later
        res[o["id"]] = o["id"] == loss or any(res[u] for u in users[o["id"]])
    return res


def test_path_to_loss_says_when_an_op_does_not_reach_the_loss(page: Any, srv: ServerProc, transformer: str) -> None:
    graph = open_graph(page, srv, transformer)
    reach = reaches(graph)
    stray = [o for o in graph["ops"] if not reach[o["id"]]]
    assert stray, "an op of the causal mask's, which nn.MultiheadAttention with is_causal=True does not read"
    note, button = page.locator("[data-testid=path-note]"), page.locator("[data-testid=path-to-loss]")
    page.evaluate(f"window.__torchscope.select('o{stray[0]['id']}')")
    button.click()
    note.wait_for(state="visible")
    assert note.inner_text().startswith("This op does not reach the loss"), note.inner_text()
    shot(page, "qa35b-path-does-not-reach")
    button.click()  # the highlight off: the note goes with it
    note.wait_for(state="hidden")
    # an op on the way to the loss: highlighted, nothing to say
    on_path = next(o for o in graph["ops"] if reach[o["id"]] and o["name"] == "aten::embedding")
    page.evaluate(f"window.__torchscope.select('o{on_path['id']}')")
    page.wait_for_function("document.querySelector('[data-testid=details] h3').textContent === 'aten::embedding'")
    page.locator("[data-testid=path-to-loss]").click()
    page.wait_for_function("window.__torchscope.state().graph.nodes.some((n) => n.hi)")
    assert page.locator("[data-testid=path-note]").is_hidden()


# ----------------------------------------------------------------------------- F5
def test_the_details_panel_leaves_the_graph_room_at_1024(browser: Any, srv: ServerProc, cnn: str) -> None:
    with checked_context(browser, 1024, 768) as page:
        open_graph(page, srv, cnn)
        width = page.locator("[data-testid=details]").bounding_box()["width"]
        assert width <= 0.3 * 1024, width
        shot(page, "qa35b-details-1024")


TICKS = """() => [...document.querySelectorAll('[data-testid=act-axis] .act-tick')].map((e) => {
  const r = e.getBoundingClientRect(); return { text: e.textContent, left: r.left, right: r.right }; })"""


def one_format(labels: list[str]) -> bool:
    """Every label a plain number ("0.01", "1000"), or every one a power of ten ("1e-4")."""
    return all(re.fullmatch(r"1e-?\d+", t) for t in labels) or all(re.fullmatch(r"[0-9.]+", t) for t in labels)


def test_activation_axis_labels_stay_apart_at_1024(browser: Any, srv: ServerProc, vanishing: str) -> None:
    with checked_context(browser, 1024, 768) as page:
        open_session(page, srv.url, vanishing, "?view=gradients")
        for attempt in range(3):
            page.locator("[data-testid=act-axis] .act-tick").first.wait_for()
            try:
                page.locator("[data-testid=act-axis]").scroll_into_view_if_needed()
                break
            except playwright_sync.Error:  # redrawn meanwhile (the doctor's finding event refreshes the view)
                if attempt == 2:
                    raise
        frame(page)
        ticks = page.evaluate(TICKS)
        assert len(ticks) >= 3, ticks
        for a, b in zip(ticks, ticks[1:], strict=False):
            assert b["left"] >= a["right"] + 4, ticks  # a gap between each two labels
        assert one_format([t["text"] for t in ticks]), ticks
        shot(page, "qa35b-act-axis-1024")


def test_log_axes_label_their_decades_in_one_format(page: Any, srv: ServerProc, actgrads: str) -> None:
    open_session(page, srv.url, actgrads, "?view=gradients")
    page.locator("[data-testid=act-axis] .act-tick").first.wait_for()
    page.wait_for_function("window.__torchscope.state().gradients?.totalAxis?.labels.length > 1")
    act = [t["text"] for t in page.evaluate(TICKS)]
    assert len(act) >= 3 and one_format(act), act  # was "1e-4, 0.01, 1, 100, 1e4"
    total = page.evaluate("window.__torchscope.state().gradients.totalAxis")
    assert total["log"] and one_format(total["labels"]), total  # was "1e+5, 1e+6"


# ----------------------------------------------------------------------------- F11
def test_a_max_norm_under_the_clipped_line_names_its_value(page: Any, srv: ServerProc, clipped: str) -> None:
    clip = srv.get(f"/api/sessions/{clipped}/grads")["clip"]  # type: ignore[index]
    assert clip and all(c and c["norm"] > c["max_norm"] == 0.01 for c in clip), clip  # clipped at every step
    open_session(page, srv.url, clipped, "?view=gradients")
    page.wait_for_function("window.__torchscope.state().gradients?.total.length === 3")
    legend = page.locator("[data-testid=total-norm] .legend-item").all_inner_texts()
    assert legend == ["after clip_grad_norm_", "before clip_grad_norm_", "max_norm (= 0.01)"], legend
    shot(page, "qa35b-max-norm-legend")


# ----------------------------------------------------------------------------- F10
GROUPS = """() => window.__torchscope.app.views.graph.obj.scene.items.filter((it) => it.group !== undefined)
  .map((it) => ({ key: it.key, label: it.label, sub: it.sub }))"""


def test_repeat_marks_and_sub_labels_of_a_sequential(page: Any, srv: ServerProc, cnn: str) -> None:
    open_graph(page, srv, cnn)
    groups = {g["key"]: g for g in page.evaluate(GROUPS)}
    # the second block's modules name the first's, in both columns
    for phase in ("forward", "backward"):
        for k, first in ((4, 0), (5, 1), (6, 2), (7, 3)):
            assert groups[f"g:{phase}:{k}"]["label"].endswith(f"≡ {first}"), groups[f"g:{phase}:{k}"]
            assert "≡" not in groups[f"g:{phase}:{first}"]["label"], groups[f"g:{phase}:{first}"]
    # a top-level child's sub-label is its count alone: its path is the label's own name
    assert groups["g:forward:0"]["sub"] == "1 op" and groups["g:backward:0"]["sub"] == "3 nodes", groups
    assert not [g for g in groups.values() if re.search(r" · \d+$", g["sub"])], groups
    shot(page, "qa35b-repeat-marks")
    # a backward group of a default-mode run holds no kernels: what they allocated is unknown, not "0 B" (QA 42b)
    page.evaluate("window.__torchscope.select('g:backward:0')")
    page.wait_for_function("document.querySelector('[data-testid=details] .details-title')?.textContent === '0'")
    rows = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('[data-testid=details] table.kv tr')]
      .map((tr) => [tr.querySelector('th').textContent, tr.querySelector('td').textContent]))""")
    assert rows["allocated"] == "not recorded (full mode records the backward's ops)", rows


# ----------------------------------------------------------------------------- F14
ON_SCREEN = """(keys) => { const v = window.__torchscope.app.views.graph.obj, c = v.canvas;
  const canvas = c.canvas.getBoundingClientRect(), legend = v.legend.getBoundingClientRect();
  return { canvas: [canvas.top, canvas.bottom], legend: legend.top, boxes: keys.map((k) => {
    const b = v.scene.byKey.get(k).box;
    return [canvas.top + c.ty + b[1] * c.scale, canvas.top + c.ty + (b[1] + b[3]) * c.scale]; }) }; }"""


def test_the_first_view_shows_the_loss_above_the_legend(page: Any, srv: ServerProc, cnn: str) -> None:
    graph = open_graph(page, srv, cnn)
    root = next(n for n in graph["nodes"] if n["id"] == graph["root"])
    last_op = max(o["id"] for o in graph["ops"])
    assert root["op"] == last_op  # the loss (nll_loss_forward) ran last
    frame(page)  # a refit the canvas's ResizeObserver queued
    graph_settled(page)
    r = page.evaluate(ON_SCREEN, [f"o{last_op}", f"n{root['id']}"])
    assert r["canvas"][1] <= r["legend"] + 1, r  # the legend is under the canvas
    for top, bottom in r["boxes"]:
        assert r["canvas"][0] <= top and bottom <= r["canvas"][1], r  # whole, above the legend
    assert page.evaluate("window.__torchscope.app.views.graph.obj.canvas.scale") >= 0.45  # and labelled
    shot(page, "qa35b-first-view")
