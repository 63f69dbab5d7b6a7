"""The Graph view's diff against ANOTHER run's captured step ("why did my change make it
worse?"), in a real headless Chromium against a real `torchscope serve`, on two real training
runs streamed to it: run A, an MLP with nn.ReLU, and run B, the changed model (nn.GELU, and one
more nn.Linear in the middle), both in the default mode.

- The diff's run menu (in the legend bar) offers B beside "this run"; chosen, the legend counts what is added,
  changed and removed against B's step as Python counts it from the two recorded .tscope files
  with the page's rule (a leaf is "phase|module|label", and its sub-label: output shape, where
  it ran, an AccumulateGrad's parameter), and every op and grad_fn node is coloured so;
- the choice is kept in the URL (diffrun=, diffstep=): a reload shows the same diff;
- the compare page (/compare?a=&b=) links "Compare graphs" to A's graph with that diff.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from browser_page import checked, module_browser, open_session, shot, train_side_by_side  # noqa: F401 (fixtures)
from conftest import ServerProc

from torchscope.session import load

playwright_sync = pytest.importorskip("playwright.sync_api")

SCRIPT = Path(__file__).with_name("dashboard_train_graphdiff.py")
GRAPH = "window.__torchscope.state().graph"
LEGEND = "[data-testid=legend]"
RUN_MENU = "[data-testid=diff-run]"
STEP_MENU = "[aria-label='diff against step']"
# the page's colours of a diff (frontend/graph/scene.js DIFF_COLORS)
COLOURS = {"added": "#16a34a", "changed": "#d97706", "same": "#9ca3af"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProc, dict[str, str], dict[str, Path]]]:
    """The server, the runs' session ids and their recorded files, by name: "relu" (run A), "gelu"
    (run B) and "short" (run A's model for one step: one captured graph)."""
    tmp = tmp_path_factory.mktemp("graph-diff-runs")
    with ServerProc(tmp / "data") as srv:
        ids = train_side_by_side(srv, SCRIPT, tmp, {"relu": ["--name", "relu"], "gelu": ["--name", "gelu", "--changed"],
                                                    "short": ["--name", "short", "--steps", "1"]})
        yield srv, ids, {n: tmp / f"{n}.tscope" for n in ids}


# ----------------------------------------------------------------------------- the rule, in Python
# A leaf of a GraphEvent as frontend/graph/model.js's buildModel makes it -- ops in id order, then
# grad_fn nodes in backward order -- and its sub-label as frontend/graph/scene.js's leafSub: the
# diff (frontend/graph/diff.js) matches leaves in that order, so the order is the page's too.
def backward_order(nodes: list[dict[str, Any]], edges: list[list[int]]) -> list[dict[str, Any]]:
    indeg = {n["id"]: 0 for n in nodes}
    out: dict[int, list[int]] = {n["id"]: [] for n in nodes}
    for a, b, *_ in edges:  # [from, to, input_nr]
        if a in out and b in indeg:
            out[a].append(b)
            indeg[b] += 1
    by_id = {n["id"]: n for n in nodes}
    ready = sorted((n for n in nodes if indeg[n["id"]] == 0),
                   key=lambda n: (n["order"] if n.get("order") is not None else 1e12) * 1e6 + n["id"])
    res: list[dict[str, Any]] = []
    while len(res) < len(ready):
        n = ready[len(res)]
        res.append(n)
        for b in out[n["id"]]:
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(by_id[b])
    return res + [n for n in nodes if n not in res]


def leaves(ev: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key, "phase|module|label", sub-label) of each leaf of the graph event ``ev``."""
    tensors = {t["id"]: t for t in ev.get("tensors", [])}
    ops = sorted(ev.get("ops", []), key=lambda o: o["id"])
    by_id = {o["id"]: o for o in ops}

    def sub(op: dict[str, Any] | None, module: str) -> str:
        t = tensors.get((op.get("outputs") or [None])[0]) if op else None
        shape = "[" + ", ".join(map(str, t.get("shape") or [])) + "]" if t else None
        where = module or ("(outside the model)" if op and "outside_model" in (op.get("flags") or []) else "(root)")
        return f"{shape} · {where}" if shape else where

    res = []
    for o in ops:
        phase = o.get("phase") or "forward"
        module = o.get("module") or ("(outside modules)" if phase == "backward" else "")
        name = o.get("name") or "?"
        res.append((f"o{o['id']}", f"{phase}|{module}|{name.removeprefix('aten::')}", sub(o, module)))
    for n in backward_order(ev.get("nodes", []), ev.get("edges", [])):
        param = n.get("param")
        module = n.get("module") or (param[:max(0, param.rfind("."))] if param else "")
        label = ("torch.compile region" if n.get("name") == "CompiledFunctionBackward"
                 else f"{n['name']} (autocast cast)" if n.get("autocast_cast") else n.get("name") or "?")
        res.append((f"n{n['id']}", f"backward|{module}|{label}", param if param else sub(by_id.get(n.get("op")), module)))
    return res


def diff(mine: dict[str, Any], other: dict[str, Any]) -> tuple[dict[str, str], int]:
    """Each leaf of ``mine`` marked "added" / "changed" / "same" against ``other``, and how many
    of ``other``'s leaves none took (removed): the exact matches first, over all leaves, then
    the leaves left take the signatures left as "changed" (QA 41a: in one pass, a leaf with no
    exact match took the slot a later leaf's exact match needed)."""
    full = Counter(f"{s}|{sub}" for _, s, sub in leaves(other))
    sig = Counter(s for _, s, _ in leaves(other))
    marks, rest = {}, []
    for key, s, sub in leaves(mine):
        if full[f"{s}|{sub}"] > 0:
            full[f"{s}|{sub}"] -= 1
            sig[s] -= 1
            marks[key] = "same"
        else:
            rest.append((key, s))
    for key, s in rest:
        if sig[s] > 0:
            sig[s] -= 1
            marks[key] = "changed"
        else:
            marks[key] = "added"
    return marks, sum(max(v, 0) for v in sig.values())


def expected_legend(files: dict[str, Path], step: int, other_step: int, mine: str = "relu", other: str = "gelu") -> tuple[str, dict[str, str]]:
    """The legend's line of run ``mine``'s step against run ``other``'s, and each leaf's mark."""
    marks, removed = diff(dict(load(files[mine]).graph(step)), dict(load(files[other]).graph(other_step)))
    n = Counter(marks.values())
    return f"vs {other} step {other_step}: {n['added']} added, {n['changed']} changed, {removed} removed", marks


# ----------------------------------------------------------------------------- the page
def open_graph(page: Any, srv: ServerProc, sid: str, query: str = "") -> None:
    open_session(page, srv.url, sid, f"?view=graph{query}")
    page.wait_for_function(f"(() => {{ const g = {GRAPH}; return g && g.nodes.length > 0; }})()")


def wait_legend(page: Any, text: str) -> str:
    page.wait_for_function("(t) => document.querySelector('[data-testid=legend]').innerText.includes(t)", arg=text)
    return str(page.locator(LEGEND).inner_text())


def colours(page: Any) -> dict[str, str]:
    """Each leaf's diff mark as the canvas colours it, every module expanded."""
    page.evaluate("window.__torchscope.expandAll()")
    nodes = page.evaluate(f"{GRAPH}.nodes")
    by_colour = {c: m for m, c in COLOURS.items()}
    return {n["key"]: by_colour.get(n["color"], n["color"]) for n in nodes}


def test_the_diff_against_another_run_counts_what_python_counts(checked: Any, runs: Any) -> None:  # noqa: F811
    srv, ids, files = runs
    page = checked
    a_steps, b_steps = (load(files[n]).graph_steps for n in ("relu", "gelu"))
    assert a_steps == b_steps == [0, 2], (a_steps, b_steps)  # sample_every=2 of 3 steps
    open_graph(page, srv, ids["relu"])
    page.locator("[data-testid=overlay]").select_option("diff")
    wait_legend(page, "vs step 2")  # this run's other captured step first, as ever
    # the run menu: this run, then the other run with a captured graph
    menu = page.locator(RUN_MENU)
    menu.wait_for(state="visible")
    options = menu.locator("option").all_inner_texts()
    assert options[0] == "this run" and sorted(options[1:]) == ["gelu", "short"], options
    menu.select_option(ids["gelu"])
    legend, marks = expected_legend(files, 0, 0)  # B's step of the same number as the one shown
    # the two models differ, in all three ways: ReLU is no GELU, module 2's Linear now has 32
    # outputs, and B's module 3 is not in A
    counts = [int(n) for n in re.findall(r"(\d+) (?:added|changed|removed)", legend)]
    assert len(counts) == 3 and min(counts) > 0, legend
    got = wait_legend(page, legend)
    assert page.locator(STEP_MENU).locator("option").all_inner_texts() == ["diff vs step 0", "diff vs step 2"]
    q = parse_qs(urlparse(page.url).query)
    assert q["diffrun"] == [ids["gelu"]] and q["diffstep"] == ["0"] and q["overlay"] == ["diff"], page.url
    # the run menu is in the legend bar, beside the counts: the toolbar stays one row at 1280 px
    assert page.evaluate("document.querySelector('[data-testid=legend]').contains(document.querySelector('[data-testid=diff-run]'))")
    tops = page.evaluate("""() => Array.from(document.querySelector(".view-graph .toolbar").children)
        .filter((e) => e.offsetParent !== null).map((e) => e.getBoundingClientRect().top)""")
    assert max(tops) - min(tops) < 10, tops
    shot(page, "graph-diff-runs")
    assert colours(page) == marks, got
    # B's other captured step: the legend and the URL follow
    page.locator(STEP_MENU).select_option("2")
    wait_legend(page, expected_legend(files, 0, 2)[0])
    assert parse_qs(urlparse(page.url).query)["diffstep"] == ["2"], page.url


def test_the_url_keeps_the_diff_against_another_run(checked: Any, runs: Any) -> None:  # noqa: F811
    srv, ids, files = runs
    page = checked
    legend, marks = expected_legend(files, 2, 0)
    open_graph(page, srv, ids["relu"], f"&step=2&overlay=diff&diffrun={ids['gelu']}&diffstep=0")
    wait_legend(page, legend)
    assert page.locator(RUN_MENU).input_value() == ids["gelu"]
    assert page.locator(STEP_MENU).input_value() == "0"
    assert colours(page) == marks
    page.reload()
    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    page.evaluate("window.__torchscope.ready")
    wait_legend(page, legend)  # the reload keeps the choice
    assert page.locator(RUN_MENU).input_value() == ids["gelu"]
    q = parse_qs(urlparse(page.url).query)
    assert q["diffrun"] == [ids["gelu"]] and q["diffstep"] == ["0"] and q["step"] == ["2"], page.url
    # another colour and back to the diff: the URL drops the choice meanwhile, the view keeps it
    page.locator("[data-testid=overlay]").select_option("dtype")
    page.wait_for_function("!location.search.includes('diffrun')")
    page.locator("[data-testid=overlay]").select_option("diff")
    wait_legend(page, legend)
    assert parse_qs(urlparse(page.url).query)["diffrun"] == [ids["gelu"]], page.url


def test_the_compare_page_links_to_the_graph_diff(checked: Any, runs: Any) -> None:  # noqa: F811
    srv, ids, files = runs
    page = checked
    page.goto(f"{srv.url}/compare?a={ids['relu']}&b={ids['gelu']}")
    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    page.evaluate("window.__torchscope.ready")
    link = page.locator("[data-testid=compare-graphs]")
    link.wait_for()
    assert link.inner_text() == "Compare graphs"
    shot(page, "graph-diff-compare-link")
    link.click()
    page.wait_for_url(f"**/sessions/{ids['relu']}?*")
    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    page.evaluate("window.__torchscope.ready")
    # A's first captured step against B's step of the same number
    wait_legend(page, expected_legend(files, 0, 0)[0])
    assert page.evaluate(f"{GRAPH}.step") == 0
    assert page.locator(RUN_MENU).input_value() == ids["gelu"]


def test_a_run_with_one_captured_step_diffs_against_another_run(checked: Any, runs: Any) -> None:  # noqa: F811
    srv, ids, files = runs
    page = checked
    assert load(files["short"]).graph_steps == [0]
    open_graph(page, srv, ids["short"])
    # no other step of its own, but other runs: the diff is there to choose
    page.wait_for_function("!document.querySelector('[data-testid=overlay] option[value=diff]').disabled")
    page.locator("[data-testid=overlay]").select_option("diff")
    page.locator(RUN_MENU).wait_for(state="visible")
    # the newest other run, its step of the same number
    name = {v: k for k, v in ids.items()}[page.locator(RUN_MENU).input_value()]
    assert name in ("relu", "gelu"), name
    legend, marks = expected_legend(files, 0, 0, "short", name)
    wait_legend(page, legend)
    if name == "relu":  # the same model: nothing differs
        assert legend.endswith(": 0 added, 0 changed, 0 removed"), legend
    assert colours(page) == marks
    # this run again: no other step to compare with, said so, and nothing coloured
    page.locator(RUN_MENU).select_option("")
    wait_legend(page, "no other step")
    assert "diffrun" not in page.url, page.url
