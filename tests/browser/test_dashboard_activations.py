"""Each module's output beside the gradient reaching it (``StepEvent.activations`` and
``StepEvent.activation_grads``), one table on the "Loss & gradients" tab, in a real headless
Chromium against a real `torchscope serve`, with runs recorded by a real training script
(tests/browser/dashboard_train_outputs.py) whose answer is known:

- ``frozen``: frozen first layer, its output needs no gradient: output values, no gradient row;
- ``relu``: never fires (the bias before it is -100): its output is all zeros ("dead" forward),
  and the gradient reaching ``dead``'s output all zeros ("dead" backward);
- ``tanh`` / ``sig``: inputs scaled up / shifted, outputs at their bounds ("saturated"), while
  ``calm`` (a Tanh of small inputs, called twice) is not;
- ``--model transformer``: a six-layer transformer, 59 rows, at 1000 px.

The numbers expected are the recorded ``.tscope`` file's own step event (``torchscope.load``)
and plain PyTorch's: the script's forward hooks on the same model and batch write a reference
before it is watched.  A file recorded before the capture recorded module outputs (no
``activations``: made here by dropping the field from a real recording) still shows the
gradient columns as before, and says the output values are not in it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked, checked_context, module_browser, open_session, recorded, shot  # noqa: F401 - fixtures
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

SCRIPT = Path(__file__).resolve().parent / "dashboard_train_outputs.py"
P04 = Path(__file__).resolve().parents[2] / "examples" / "pitfalls" / "p04_nan_in_forward.py"
STEP = 1
# the modules in the order their forwards start; "frozen" has an output and no gradient
FORWARD = ["", "frozen", "inp", "dead", "relu", "wide", "tanh", "big", "sig", "calm", "head"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("outputs-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("outputs-runs")


@pytest.fixture(scope="module")
def mlp(srv: ServerProc, runs_dir: Path) -> dict[str, Any]:
    """The MLP run: its session id, file, the step event of STEP and PyTorch's reference."""
    import torchscope

    path, ref = runs_dir / "mlp.tscope", runs_dir / "ref.json"
    sid = recorded(srv, path, SCRIPT, "--mode", "full", "--steps", "3", "--ref", str(ref), "--ref-step", str(STEP))
    ev = next(s for s in torchscope.load(path).steps if s["step"] == STEP)
    return {"sid": sid, "path": path, "ev": ev, "ref": json.loads(ref.read_text())}


@pytest.fixture(scope="module")
def old(srv: ServerProc, runs_dir: Path, mlp: dict[str, Any]) -> str:
    """The same run as a file recorded before 1.7: every event as recorded, less ``activations``."""
    import httpx

    from torchscope.sessionfile import SessionFileWriter, iter_events

    path = runs_dir / "old.tscope"
    w = SessionFileWriter(path)
    for e in iter_events(mlp["path"]):
        e = {k: v for k, v in e.items() if k != "activations"}
        if e.get("kind") == "session":
            e["session_id"], e["name"] = "0ld0ut9ut5", "outputs-before-1.7"
        w.append([e])
    w.append_series()
    w.close(fsync=False)
    with open(path, "rb") as f:
        res = httpx.post(srv.url + "/api/sessions/import", files={"file": (path.name, f)}, timeout=120)
    res.raise_for_status()
    return str(res.json()["id"])


@pytest.fixture(scope="module")
def transformer(srv: ServerProc, runs_dir: Path) -> str:
    return recorded(srv, runs_dir / "lm.tscope", SCRIPT, "--model", "transformer", "--mode", "default", "--steps", "1")


@pytest.fixture(scope="module")
def nan_run(srv: ServerProc, runs_dir: Path) -> tuple[str, Path]:
    """P4: a NaN made in the forward, so module outputs are NaN (counted on the steps after the first)."""
    path = runs_dir / "p04.tscope"
    return recorded(srv, path, P04, "--steps", "3"), path


@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


def open_panel(page: Any, srv: ServerProc, sid: str, query: str = "") -> None:
    open_session(page, srv.url, sid, f"?view=gradients{query}")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients;"
                           " return g && (g.acts.modules.length > 0 || g.acts.empty); })()")


# Each row as drawn: both sides' texts, marks, bars and colours ("" where the cell is not there).
ROWS = """() => [...document.querySelectorAll('[data-testid=act-row]')].map((r) => {
  const q = (s) => r.querySelector(`[data-testid=${s}]`), t = (s) => q(s)?.textContent ?? null;
  const bar = q('act-out-bar');
  return { module: r.dataset.module, label: r.querySelector('.act-name').textContent, title: r.title,
    rms: t('act-out-rms'), range: t('act-out-range'), ozeros: t('act-out-zeros'),
    odead: !!q('act-out-dead'), sat: q('act-out-saturated')?.title ?? null, ononfinite: !!q('act-out-nonfinite'),
    obar: bar ? bar.getBoundingClientRect().width : null, obarColor: bar ? getComputedStyle(bar).backgroundColor : null, obarImage: bar ? getComputedStyle(bar).backgroundImage : null,
    norm: t('act-norm'), max: t('act-max'), zeros: t('act-zeros'), gdead: !!q('act-dead'),
    flags: r.querySelector('.act-flags').textContent, oflags: r.querySelector('.act-oflags')?.textContent ?? null,
    ozerosColor: q('act-out-zeros') ? getComputedStyle(q('act-out-zeros')).color : null,
    nameColor: getComputedStyle(r.querySelector('.act-name')).color }; })"""

THEME_CUT = """() => { const p = document.createElement('span'); document.body.append(p); p.style.color = 'var(--cut)';
  const c = getComputedStyle(p).color; p.remove(); return c; }"""


def range_ends(text: str) -> tuple[float, float]:
    lo, hi = re.split(r"\s*…\s*", text.strip())
    return float(lo), float(hi)


def test_one_row_per_module_of_either_list_in_forward_order(page: Any, srv: ServerProc, mlp: dict[str, Any]) -> None:
    ev = mlp["ev"]
    outs, grads = [a["module"] for a in ev["activations"]], [a["module"] for a in ev["activation_grads"]]
    # the capture lists them as the forwards end (a parent after its children); frozen has no gradient
    assert outs != FORWARD and set(outs) == set(FORWARD) and set(grads) == set(FORWARD) - {"frozen"}
    open_panel(page, srv, mlp["sid"], f"&step={STEP}")
    acts = page.evaluate("window.__torchscope.state().gradients.acts")
    assert acts["step"] == STEP and acts["outputs"] is True and acts["modules"] == FORWARD
    assert acts["outModules"] == FORWARD and acts["gradModules"] == [m for m in FORWARD if m != "frozen"]
    assert page.locator("[data-testid=act-title]").inner_text().startswith("Each module's output and the gradient reaching it")
    assert page.locator("[data-testid=act-out-absent]").is_hidden()
    rows = page.evaluate(ROWS)
    assert [r["module"] for r in rows] == FORWARD
    frozen = rows[1]
    # an output no gradient reached: its values, and "–" on the gradient's side
    assert frozen["rms"] not in ("–", None) and frozen["norm"] == frozen["max"] == "–" and frozen["zeros"] == "–", frozen
    assert "no gradient reached this output" in frozen["title"]
    shot(page, "act-outputs-1280")


def test_the_output_numbers_are_the_recorded_ones_and_pytorchs(page: Any, srv: ServerProc, mlp: dict[str, Any]) -> None:
    recorded_outs = {a["module"]: a for a in mlp["ev"]["activations"]}
    grads = {a["module"]: a for a in mlp["ev"]["activation_grads"]}
    ref = mlp["ref"]
    open_panel(page, srv, mlp["sid"], f"&step={STEP}")
    rows = {r["module"]: r for r in page.evaluate(ROWS)}
    for module in FORWARD:
        r, want, torch_ref = rows[module], recorded_outs[module], ref[module]
        # the capture against plain PyTorch (forward hooks on the same model and batch)
        for key in ("norm", "rms", "min", "max", "zero_frac"):
            assert want[key] == pytest.approx(torch_ref[key], rel=1e-5, abs=1e-9), (module, key)
        assert want["numel"] == torch_ref["numel"] and want.get("calls", 1) == torch_ref["calls"], module
        # the page against the capture: rms to 4 digits, the range's ends to 3, zeros in %
        assert float(r["rms"]) == pytest.approx(want["rms"], rel=1e-3, abs=1e-12), r
        lo, hi = range_ends(r["range"])
        assert lo == pytest.approx(want["min"], rel=6e-3, abs=1e-12) and hi == pytest.approx(want["max"], rel=6e-3, abs=1e-12), r
        assert r["ozeros"].endswith(f"{round(100 * want['zero_frac'], 1):g} %"), r
        # the gradient's side as before
        if module in grads:
            assert float(r["norm"]) == pytest.approx(grads[module]["norm"], rel=1e-3, abs=1e-12), r
            assert float(r["max"]) == pytest.approx(grads[module]["max_abs"], rel=1e-3, abs=1e-12), r
    assert rows["calm"]["flags"] == "×2"  # two calls gathered
    # the forward bars: one log scale, longer for a larger rms; an all-zero output a stub in the zero colour
    positive = sorted((m for m in FORWARD if recorded_outs[m]["rms"] > 0), key=lambda m: recorded_outs[m]["rms"])
    widths = [rows[m]["obar"] for m in positive]
    assert widths == sorted(widths) and widths[0] < widths[-1] - 50, list(zip(positive, widths, strict=True))
    assert rows["relu"]["obar"] <= 7 and rows["relu"]["obarColor"] == "rgb(192, 38, 211)"  # colors.js ZERO
    # hover: every number as recorded, full precision, both directions
    for module in ("tanh", "calm", "frozen"):
        page.locator(f"[data-testid=act-row][data-module='{module}']").hover()
        text = page.locator("[data-testid=act-hover]").inner_text()
        forward, backward = text.split(" | ")
        got = dict(re.findall(r"(output rms|min|max|‖output‖₂|zeros|numel) (\S+)", forward))
        got.update(re.findall(r"(‖grad_output‖₂) (\S+)", backward))
        want = recorded_outs[module]
        assert float(got["output rms"]) == want["rms"] and float(got["min"]) == want["min"] and float(got["max"]) == want["max"], text
        assert float(got["‖output‖₂"]) == want["norm"] and int(got["numel"]) == want["numel"], text
        assert ("‖grad_output‖₂" in got) == (module in grads), text
        if module in grads:
            assert float(got["‖grad_output‖₂"]) == grads[module]["norm"], text
        assert ("2 calls gathered" in text) == (module == "calm"), text


def test_dead_and_saturated_outputs_are_marked(page: Any, srv: ServerProc, mlp: dict[str, Any]) -> None:
    recorded_outs = {a["module"]: a for a in mlp["ev"]["activations"]}
    ref = mlp["ref"]
    open_panel(page, srv, mlp["sid"], f"&step={STEP}")
    rows = {r["module"]: r for r in page.evaluate(ROWS)}
    cut = page.evaluate(THEME_CUT)
    # dead forward: the ReLU that never fires (its output all zeros), alone; dead backward: the
    # gradient reaching `dead`'s output, alone
    assert [m for m in FORWARD if rows[m]["odead"]] == ["relu"] and recorded_outs["relu"]["zero_frac"] == 1.0
    assert [m for m in FORWARD if rows[m]["gdead"]] == ["dead"]
    assert rows["relu"]["ozerosColor"] == cut and rows["relu"]["nameColor"] == cut
    assert rows["inp"]["ozerosColor"] != cut and rows["inp"]["nameColor"] != cut
    # saturated: the Tanh and the Sigmoid at their bounds; PyTorch's mean slope there is under a
    # tenth of the largest (tanh 1, sigmoid 1/4), and the calm Tanh's is not
    assert [m for m in FORWARD if rows[m]["sat"]] == ["tanh", "sig"]
    assert ref["tanh"]["slope"] < 0.1 and ref["sig"]["slope"] < 0.025 and ref["calm"]["slope"] > 0.9
    assert ref["tanh"]["min"] == -1.0 and ref["tanh"]["max"] == 1.0
    # the tanh's mean slope is exactly 1 - rms²: the mark says PyTorch's number
    said = float(re.search(r"1 − rms² = (\S+)", rows["tanh"]["sat"])[1])  # type: ignore[index]
    assert said == pytest.approx(ref["tanh"]["slope"], rel=6e-3), rows["tanh"]["sat"]
    # the sigmoid's is bounded above by rms (1 - rms), which it says, and PyTorch's is under it
    bound = float(re.search(r"rms·\(1 − rms\) = (\S+)", rows["sig"]["sat"])[1])  # type: ignore[index]
    assert ref["sig"]["slope"] <= bound * 1.01 and bound < 0.025, rows["sig"]["sat"]
    assert rows["tanh"]["nameColor"] == cut and rows["calm"]["nameColor"] != cut
    assert not any(r["ononfinite"] for r in rows.values())


def test_nonfinite_outputs_are_red_with_their_counts(page: Any, srv: ServerProc, nan_run: tuple[str, Path]) -> None:
    import torchscope

    sid, path = nan_run
    ev = next(s for s in torchscope.load(path).steps if s.get("activations") and any(a.get("nan") for a in s["activations"]))
    outs = {a["module"]: a for a in ev["activations"]}
    open_panel(page, srv, sid, f"&step={ev['step']}")
    rows = {r["module"]: r for r in page.evaluate(ROWS)}
    cut = page.evaluate(THEME_CUT)
    assert set(outs) <= set(rows)
    for module, want in outs.items():
        r = rows[module]
        assert r["ononfinite"] == (want.get("nan", 0) + want.get("inf", 0) > 0 or not math.isfinite(want["norm"])), (r, want)
        if want.get("nan"):
            assert f"NaN ×{want['nan']}" in r["oflags"] and r["rms"] == "NaN" and r["nameColor"] == cut, (r, want)
            assert r["obarColor"] == "rgb(127, 29, 29)"  # colors.js NONFINITE
            # hatched: plain, it read as the gradient ramp's top, the largest finite bar (QA 50b)
            assert r["obarImage"].startswith("repeating-linear-gradient"), r["obarImage"]
    geo = page.evaluate(GEOMETRY)
    assert geo["sw"] <= geo["cw"] and geo["cut"] == [] and geo["overlaps"] == [], geo  # "NaN ×1024" whole


def test_a_file_recorded_before_outputs_shows_the_gradient_columns_as_before(page: Any, srv: ServerProc,
                                                                               mlp: dict[str, Any], old: str) -> None:
    grads = {a["module"]: a for a in mlp["ev"]["activation_grads"]}
    open_panel(page, srv, old, f"&step={STEP}")
    acts = page.evaluate("window.__torchscope.state().gradients.acts")
    assert acts["outputs"] is False and acts["outModules"] == [] and acts["modules"] == [m for m in FORWARD if m != "frozen"]
    absent = page.locator("[data-testid=act-out-absent]")
    assert absent.is_visible() and "not in this file" in absent.inner_text(), absent.inner_text()
    assert page.locator("[data-testid=act-note]").inner_text().startswith("The gradient w.r.t. each module's output (grad_output")
    # the six columns of before: module, bar, ‖grad_output‖₂, max |g|, zeros, marks, laid out by the stylesheet
    head = page.evaluate("""() => { const h = document.querySelector('[data-testid=act-grads] .act-head');
      return { cells: [...h.children].map((c) => c.dataset.testid === 'act-axis' ? 'axis' : c.textContent), style: h.getAttribute('style') }; }""")
    assert head == {"cells": ["module (forward order)", "axis", "‖grad_output‖₂", "max |g|", "zeros", ""], "style": None}, head
    assert page.locator("[data-testid=act-grads] [data-testid^=act-out-], [data-testid=act-sides]").count() == 0
    rows = page.evaluate(ROWS)
    assert all(r["rms"] is None for r in rows)
    for r in rows:
        want = grads[r["module"]]
        assert float(r["norm"]) == pytest.approx(want["norm"], rel=1e-3, abs=1e-12), r
        assert float(r["max"]) == pytest.approx(want["max_abs"], rel=1e-3, abs=1e-12), r
        assert r["gdead"] == (r["module"] == "dead"), r
    # and the same texts as the gradient's side of the file with outputs
    cells = "() => [...document.querySelectorAll('[data-testid=act-row]')].map((r) => [r.dataset.module," \
            " ...['act-norm', 'act-max', 'act-zeros'].map((s) => r.querySelector(`[data-testid=${s}]`).textContent)," \
            " r.querySelector('.act-flags').textContent])"
    before = page.evaluate(cells)
    shot(page, "act-outputs-old-file")
    open_panel(page, srv, mlp["sid"], f"&step={STEP}")
    assert [c for c in page.evaluate(cells) if c[0] != "frozen"] == before


GEOMETRY = """() => { const b = document.querySelector('[data-testid=act-grads]');
  const rows = [...b.querySelectorAll('.act-row')];
  const overlaps = [], cut = [];
  for (const r of rows) {
    const cells = [...r.children].filter((c) => c.getBoundingClientRect().width > 0);
    for (let i = 1; i < cells.length; i++) {
      const a = cells[i - 1].getBoundingClientRect(), c = cells[i].getBoundingClientRect();
      if (a.right > c.left + 0.5) overlaps.push([r.dataset.module ?? 'head', i]);
    }
    for (const c of r.querySelectorAll('.act-name, [data-testid=act-out-range], .act-flags, .act-oflags, .num'))
      if (c.scrollWidth > c.clientWidth + 1) cut.push([r.dataset.module ?? 'head', c.className, c.textContent]);
  }
  const ticks = (id) => [...b.querySelectorAll(`[data-testid=${id}] .act-tick`)].map((e) => { const r = e.getBoundingClientRect(); return [r.left, r.right]; });
  return { sw: b.scrollWidth, cw: b.clientWidth, overlaps, cut, out: ticks('act-out-axis'), grad: ticks('act-axis'),
    names: [...b.querySelectorAll('[data-testid=act-row] .act-name')].map((n) => [n.closest('.act-row').dataset.module, n.textContent]) }; }"""


@pytest.mark.parametrize("width", [1000, 1280, 1920])
def test_the_table_fits_narrow_and_wide_windows(module_browser: Any, srv: ServerProc, mlp: dict[str, Any],  # noqa: F811
                                                width: int) -> None:
    with checked_context(module_browser, width, 900) as page:
        open_panel(page, srv, mlp["sid"], f"&step={STEP}")
        page.locator("[data-testid=act-panel]").scroll_into_view_if_needed()
        page.wait_for_timeout(150)
        geo = page.evaluate(GEOMETRY)
        assert geo["sw"] <= geo["cw"], geo  # no sideways scrolling
        assert geo["overlaps"] == [] and geo["cut"] == [], geo
        assert [n for _, n in geo["names"]] == [n or "(root)" for n in FORWARD], geo["names"]  # short names whole
        for ticks in (geo["out"], geo["grad"]):
            assert len(ticks) >= 2 and all(b[0] >= a[1] + 4 for a, b in zip(ticks, ticks[1:], strict=False)), geo
        page.locator("[data-testid=act-panel]").screenshot(path=str(page_shot_dir() / f"act-outputs-{width}.png"))


def page_shot_dir() -> Path:
    from conftest import ARTIFACTS

    d = ARTIFACTS / "screenshots"
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_a_transformers_sixty_rows_stay_readable_at_1000(module_browser: Any, srv: ServerProc,  # noqa: F811
                                                         transformer: str) -> None:
    with checked_context(module_browser, 1000, 800) as page:
        open_panel(page, srv, transformer)
        acts = page.evaluate("window.__torchscope.state().gradients.acts")
        modules = acts["modules"]
        assert len(modules) >= 55 and acts["outModules"] == modules, len(modules)
        page.locator("[data-testid=act-panel]").scroll_into_view_if_needed()
        page.wait_for_timeout(150)
        geo = page.evaluate(GEOMETRY)
        assert geo["sw"] <= geo["cw"] and geo["overlaps"] == [] and geo["cut"] == [], geo
        # every name keeps the module's own (last) name, whatever of its path it gave up
        for module, label in geo["names"]:
            own = module.rsplit(".", 1)[-1] if module else "(root)"
            path = label.split(" (")[0] if module else label
            assert path.endswith(own) and (path == module or path.startswith("….") or not module), (module, label)
        # a long table keeps its column names in view: the header row sticks to the view's top
        # (found and scrolled in one call: the panel may be drawn again meanwhile -- a live refetch --,
        # and a located row of the old drawing is gone)
        page.evaluate("() => [...document.querySelectorAll('[data-testid=act-row]')].pop().scrollIntoView({ block: 'nearest' })")
        page.wait_for_timeout(100)
        top = page.evaluate("""() => { const v = document.querySelector('[data-testid=act-grads]').closest('.view').getBoundingClientRect();
          const h = [...document.querySelectorAll('[data-testid=act-grads] .act-head')].pop().getBoundingClientRect();
          return { view: v.top, head: h.top, headBottom: h.bottom }; }""")
        assert abs(top["head"] - top["view"]) <= 1, top
        # and a row's full path on hover
        row = page.locator("[data-testid=act-row][data-module='blocks.layers.5.self_attn']")
        row.hover()
        assert page.locator("[data-testid=act-hover]").inner_text().startswith("blocks.layers.5.self_attn · output rms ")
        shot(page, "act-outputs-transformer-1000")


def test_schema_js_names_the_output_fields() -> None:
    from test_dashboard_schema import js_fields

    from torchscope import schema

    fields = js_fields()
    assert "activations" in fields["step"]
    read = {"module", "norm", "rms", "min", "max", "zero_frac", "numel", "nan", "inf", "calls"}  # what the panel reads
    assert read <= set(fields["ActivationStats"]) <= set(schema.ActivationStats.__annotations__), fields["ActivationStats"]
