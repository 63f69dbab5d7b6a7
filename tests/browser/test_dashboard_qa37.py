"""The dashboard's figures against PyTorch's (QA 37b), in a real headless Chromium against a
real `torchscope serve`, with a run recorded by a real training script (dashboard_train_qa37.py:
an MLP, full mode, Adam) and imported.

- A: a collapsed backward module's "saved for backward" (and the memory overlay's value for it)
  was the plain sum of its grad_fn nodes' saved_bytes: a ReLU's output saved by two nodes
  counted twice and the weight.t() each AddmmBackward0 saves counted as activations -- more
  than the whole step's saved activations.  It is the distinct storages its nodes save, less
  the parameters', as plain PyTorch (saved_tensors_hooks) counts them; a single node's details
  say which part of its saved bytes is a parameter.
- B: in full mode a backward group holds grad_fn nodes and the aten kernels they ran: its
  "grad_fn nodes" counted both, and its time added the kernels' durations to the nodes' that
  hold them.  Counted apart now; the time is the nodes'.
- C: a backward kernel's details said "forward op #14 · backward".
- D: the gradients heat map named a module's type for numbered modules only.
- E: the memory legend's "gradients (= parameters)" read as gradients counted as parameters.
- F: the activation-gradient table printed "1.58e-4" above "0.1581": one format a column now.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked, fmt_bytes, module_browser, open_session, recorded, shot  # noqa: F401 - fixtures
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

TRAIN = Path(__file__).resolve().parent / "dashboard_train_qa37.py"
STEP = 1


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("qa37-server")) as s:
        yield s


@pytest.fixture(scope="module")
def run(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The run's session id, PyTorch's reference (module path -> {storage: bytes} saved for
    backward there), the captured graph of STEP, its step event and the module types."""
    out = tmp_path_factory.mktemp("qa37-runs")
    sid = recorded(srv, out / "qa37.tscope", TRAIN, "--ref", str(out / "ref.json"), "--steps", "2", "--mode", "full")
    steps = srv.get(f"/api/sessions/{sid}/steps")
    meta = srv.get(f"/api/sessions/{sid}")
    assert isinstance(steps, list) and isinstance(meta, dict)
    return {"sid": sid, "ref": json.loads((out / "ref.json").read_text()),
            "graph": srv.get(f"/api/sessions/{sid}/graph?step={STEP}"),
            "step": next(s for s in steps if s["step"] == STEP),
            "types": {m["path"]: m["type"] for m in meta["meta"]["modules"]}}


@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


def us_of(text: str) -> float:
    """A duration as the page writes it ("210 µs", "1.5 ms", "2.0 s"), in µs."""
    m = re.fullmatch(r"([\d.]+) (µs|ms|s)", text.strip())
    assert m, text
    return float(m[1]) * {"µs": 1, "ms": 1e3, "s": 1e6}[m[2]]


def shown(text: str) -> float:
    """Half the last digit of a duration as the page writes it (1.5 ms: 50 µs): how far the
    number it rounded can be from the one shown (a step slower than 1 ms reads in 0.1 ms)."""
    m = re.fullmatch(r"[\d]+(?:\.(\d+))? (µs|ms|s)", text.strip())
    assert m, text
    return 0.5 * 10 ** -len(m[1] or "") * {"µs": 1, "ms": 1e3, "s": 1e6}[m[2]]


def under(module: str | None, path: str) -> bool:
    return bool(module) and (module == path or str(module).startswith(path + "."))


def ref_saved(ref: dict[str, dict[str, int]], path: str) -> int:
    """PyTorch's bytes saved for backward in ``path`` and the modules inside it: each storage once."""
    storages: dict[str, int] = {}
    for module, saved in ref.items():
        if under(module, path):
            storages.update(saved)
    return sum(storages.values())


def open_graph(page: Any, srv: ServerProc, sid: str, query: str = "") -> None:
    open_session(page, srv.url, sid, f"?view=graph&step={STEP}{query}")
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")


# The details panel's key-value rows: name -> [value, the name's tooltip].
DETAILS = """() => Object.fromEntries([...document.querySelectorAll('[data-testid=details] table.kv tr')]
  .map((tr) => [tr.querySelector('th').textContent, [tr.querySelector('td').textContent, tr.querySelector('th').title]]))"""


def details(page: Any, key: str, title: str) -> dict[str, list[str]]:
    page.evaluate("(k) => window.__torchscope.select(k)", key)
    page.wait_for_function("(t) => document.querySelector('[data-testid=details] .details-title')?.textContent === t", arg=title)
    return page.evaluate(DETAILS)


# The value a collapsed group's box has under the current overlay, and its colour against the
# legend's scale (the same log ramp, from the legend's ends).
GROUP_VALUE = """async (key) => {
  const { logScale, NOTHING } = await import('/static/colors.js');
  const sc = window.__torchscope.app.views.graph.obj.scene, it = sc.byKey.get(key);
  return { value: it.value, color: it.color, expected: logScale([sc.legend.lo, sc.legend.hi], NOTHING).color(it.value) };
}"""


def overlay(page: Any, name: str) -> None:
    page.locator("[data-testid=overlay]").select_option(name)
    page.wait_for_function("(n) => window.__torchscope.app.views.graph.obj.scene.legend?.overlay === n", arg=name)


# ----------------------------------------------------------------------------- A
def test_a_backward_module_saves_its_distinct_activations_once(srv: ServerProc, run: dict[str, Any], page: Any) -> None:
    ref, whole = run["ref"], run["step"]["memory"]["saved"]
    # the reference is the step's own figure: all PyTorch saved, parameters left out
    assert sum({k: v for saved in ref.values() for k, v in saved.items()}.values()) == whole
    open_graph(page, srv, run["sid"])
    for path in ("net", "inp"):
        want = ref_saved(ref, path)
        assert 0 < want <= whole
        rows = details(page, f"g:backward:{path}", path)
        label = next(k for k in rows if k.startswith("saved for backward"))
        value, tip = rows[label]
        # was 69.2 KiB for net, 2.9 times the whole step's saved activations (23.4 KiB)
        assert value.split(" (")[0] == fmt_bytes(want), (path, value, want, whole)
        assert label == "saved for backward (activations)", label
        assert "once" in tip and "parameters left out" in tip, tip
        if path == "net":  # its AddmmBackward0s save weight.t(): said, not counted
            assert "of parameters it saves, not extra memory" in value, value
            assert "module" not in rows  # a Sequential says nothing of itself in print(model)
        else:  # what print(model) shows of it (ModuleInfo.extra_repr)
            assert rows["module"][0] == "Linear(in_features=20, out_features=32, bias=True)", rows
    shot(page, "qa37-group-saved")
    # the memory overlay colours the collapsed group by the same figure
    page.evaluate("window.__torchscope.select(null)")
    overlay(page, "memory")
    got = page.evaluate(GROUP_VALUE, "g:backward:net")
    assert got["value"] == ref_saved(ref, "net") and got["color"] == got["expected"], got


def test_a_node_says_which_of_its_saved_bytes_is_a_parameter(srv: ServerProc, run: dict[str, Any], page: Any) -> None:
    g = run["graph"]
    params = {t["storage"]: t["param"] for t in g["tensors"] if t.get("param")}
    node = next(n for n in g["nodes"] if n["name"] == "AddmmBackward0" and n.get("module") == "net.4")
    in_param = [s for s in node["saved"] if s["storage"] in params]
    assert len(in_param) == 1 and params[in_param[0]["storage"]] == "net.4.weight", node["saved"]
    open_graph(page, srv, run["sid"])
    rows = details(page, f"n{node['id']}", "AddmmBackward0")
    want = f"{fmt_bytes(node['saved_bytes'])} ({fmt_bytes(in_param[0]['nbytes'])} of it net.4.weight, a parameter: not extra memory)"
    assert rows["saved bytes"][0] == want, rows["saved bytes"]
    # and the saved tensor's row names it
    assert "parameter net.4.weight" in page.locator("[data-testid=details] table.tensors").inner_text()


# ----------------------------------------------------------------------------- B
def test_b_full_mode_backward_group_counts_nodes_and_kernels_apart(srv: ServerProc, run: dict[str, Any], page: Any) -> None:
    g, backward_us = run["graph"], run["step"]["backward_us"]
    nodes = [n for n in g["nodes"] if under(n.get("module"), "net")]
    kernels = [o for o in g["ops"] if o.get("phase") == "backward" and under(o.get("module"), "net")]
    outside = [o for o in g["ops"] if o.get("phase") == "backward" and not o.get("module")]
    assert nodes and kernels and outside
    node_us = sum(n["dur_us"] for n in nodes)
    assert node_us <= backward_us
    open_graph(page, srv, run["sid"])
    rows = details(page, "g:backward:net", "net")
    # was "grad_fn nodes 40" (14 nodes and 26 kernels) and the nodes' time plus their kernels'
    assert rows["grad_fn nodes"][0] == str(len(nodes)), rows
    assert rows["backward kernels (aten ops)"][0] == str(len(kernels)), rows
    assert us_of(rows["time"][0]) == pytest.approx(node_us, abs=shown(rows["time"][0]) + 1), (rows["time"], node_us, backward_us)
    assert us_of(rows["time"][0]) <= backward_us * 1.01
    # a group of backward kernels alone ("(outside modules)": the loss's backward, detach)
    rows = details(page, "g:backward:(outside modules)", "(outside modules)")
    assert rows["grad_fn nodes"][0] == "0" and rows["backward kernels (aten ops)"][0] == str(len(outside)), rows
    assert us_of(rows["time"][0]) == pytest.approx(sum(o["dur_us"] for o in outside), abs=shown(rows["time"][0]) + 1), rows
    # the collapsed boxes say so too, and the time overlay colours by the same figures
    page.evaluate("window.__torchscope.select(null)")
    subs = {n["key"]: n["sub"] for n in page.evaluate("window.__torchscope.state().graph.nodes") if n["group"]}
    assert subs["g:backward:net"] == f"{len(nodes)} nodes + {len(kernels)} ops", subs
    assert subs["g:backward:(outside modules)"] == f"{len(outside)} ops", subs
    overlay(page, "time")
    got = page.evaluate(GROUP_VALUE, "g:backward:net")
    assert got["value"] == pytest.approx(node_us) and got["value"] <= backward_us and got["color"] == got["expected"], got


# ----------------------------------------------------------------------------- C
def test_c_an_op_is_named_by_its_phase(srv: ServerProc, run: dict[str, Any], page: Any) -> None:
    g = run["graph"]
    kernel = next(o for o in g["ops"] if o.get("phase") == "backward" and o["name"] == "aten::mm")
    fwd = next(o for o in g["ops"] if (o.get("phase") or "forward") == "forward" and o["name"] == "aten::addmm")
    open_graph(page, srv, run["sid"])
    sub = "document.querySelector('[data-testid=details] .details-title + div').textContent"
    for op, want in ((kernel, "aten op run by backward()"), (fwd, "forward op")):
        details(page, f"o{op['id']}", op["name"])
        # was "forward op #14 · backward"
        assert page.evaluate(sub) == f"{want} #{op['id']}", (op, page.evaluate(sub))


# ----------------------------------------------------------------------------- D
def test_d_heat_map_rows_name_every_known_type(srv: ServerProc, run: dict[str, Any], page: Any) -> None:
    types = run["types"]
    open_session(page, srv.url, run["sid"], "?view=gradients")
    page.wait_for_function("document.querySelectorAll('[data-testid=heat-labels] .heat-label:not(.muted)').length >= 4")
    rows = page.locator("[data-testid=heat-labels] .heat-label:not(.muted)").all_inner_texts()
    shot(page, "qa37-heat-labels")
    # "inp" (not numbered) was bare beside "net.0 (Linear)"
    assert rows == [f"{p} ({types[p]})" for p in ("inp", "net.0", "net.2", "net.4")], rows


# ----------------------------------------------------------------------------- E
def test_e_equal_memory_series_are_worded_as_equal_bytes(srv: ServerProc, run: dict[str, Any], page: Any) -> None:
    mem = run["step"]["memory"]
    assert mem["grads"] == mem["params"]  # Adam, every parameter trained: the same bytes
    open_session(page, srv.url, run["sid"], "?view=memory")
    page.wait_for_function("document.querySelector('.chart-legend')?.textContent.includes('gradients')")
    legend = page.locator(".chart-legend").first.inner_text()
    assert "gradients (same bytes as parameters)" in legend and "(=" not in legend, legend


# ----------------------------------------------------------------------------- F
ACT_COLUMNS = """() => [...document.querySelectorAll('[data-testid=act-row]')].map((r) =>
  [r.querySelector('[data-testid=act-norm]').textContent, r.querySelector('[data-testid=act-max]').textContent])"""


def test_f_activation_table_columns_have_one_format(srv: ServerProc, run: dict[str, Any], page: Any) -> None:
    recorded_grads = run["step"]["activation_grads"]
    for col in ("norm", "max_abs"):  # each column spans both sides of 1e-3 (shrink: x 1e-3)
        vals = [a[col] for a in recorded_grads]
        assert min(vals) < 1e-3 <= max(vals), vals
    open_session(page, srv.url, run["sid"], f"?view=gradients&step={STEP}")
    page.wait_for_function("document.querySelectorAll('[data-testid=act-row]').length >= 6")
    cols = list(zip(*page.evaluate(ACT_COLUMNS), strict=True))
    for col in cols:
        # was "1.581e-4"-style and "0.1581"-style in one column
        assert len({"e" in v for v in col}) == 1, col
        assert all(len(re.sub(r"e.*|[-.]|^0\.0*", "", v)) == 4 for v in col), col  # 4 significant digits each
    by_module = {a["module"]: a for a in recorded_grads}
    rows = page.evaluate("[...document.querySelectorAll('[data-testid=act-row]')].map((r) => r.dataset.module)")
    for module, (norm, mx) in zip(rows, zip(*cols, strict=True), strict=True):
        assert float(norm) == pytest.approx(by_module[module]["norm"], rel=1e-3)
        assert float(mx) == pytest.approx(by_module[module]["max_abs"], rel=1e-3)


# ----------------------------------------------------------------------------- G
def test_g_full_mode_shows_optimizer_step_as_a_group_of_its_own(srv: ServerProc, run: dict[str, Any], page: Any) -> None:
    """Full mode records optimizer.step()'s ops (forty-second session): one collapsed group
    "(optimizer.step())" beside the forward's modules -- a for-loop Adam runs a dozen ops a
    parameter, which loose at the root would bury the model's own -- its details counting them."""
    ops = [o for o in run["graph"]["ops"] if o.get("phase") == "optimizer"]
    assert ops and all(not o.get("module") for o in ops)
    assert {"aten::addcdiv_", "aten::lerp_"} <= {o["name"] for o in ops}  # Adam's update, as torch.optim runs it
    open_graph(page, srv, run["sid"])
    key = "g:optimizer:(optimizer.step())"
    subs = {n["key"]: n["sub"] for n in page.evaluate("window.__torchscope.state().graph.nodes") if n["group"]}
    assert subs.get(key) == f"{len(ops)} ops", subs
    rows = details(page, key, "(optimizer.step())")
    assert rows["ops"][0] == str(len(ops)) and rows["allocated"][0] == fmt_bytes(sum(o["alloc"] for o in ops)), rows
    assert page.locator("[data-testid=details]").inner_text().count("module group · optimizer") == 1
    # one of its ops: what it is, where it ran
    op = ops[-1]
    page.evaluate("(k) => window.__torchscope.select(k)", f"o{op['id']}")
    page.wait_for_function("(t) => document.querySelector('[data-testid=details] .details-title')?.textContent.includes(t)",
                           arg=op["name"].split("::")[-1])
    text = page.locator("[data-testid=details]").inner_text()
    assert "optimizer op (optimizer.step())" in text, text
    shot(page, "graph-optimizer-step")
    # a forward op's module row names the module with its type, as the heat map does (QA 42b: "module 3")
    fwd = next(o for o in run["graph"]["ops"] if o.get("phase") == "forward" and o["name"] == "aten::addmm" and o.get("module"))
    rows = details(page, f"o{fwd['id']}", "aten::addmm")
    assert rows["module"][0] == f"{fwd['module']} ({run['types'][fwd['module']]})", rows["module"]
