"""The Graph view's diff matches the exact leaves first, whatever their order ("why do the
counts depend on which run I diff against which?"), in a real headless Chromium against a real
`torchscope serve`, on real runs recorded in full mode and imported:

- base: Linear(8, 64), ReLU, Linear(64, 64), ReLU, Linear(64, 3); variant: GELU for ReLU and one
  more Linear(64, 64) before the last.  The layers are applied in the model's own forward, so
  their ops share one module path and the same op label (t, addmm, mm, detach...) comes with
  several shapes: the variant's extra layer's ops sit before the last layer's, which the base has
  too.  A leaf with no exact match must not take the "changed" slot a later exact match needs:
  every leaf whose full signature the other graph has is the same, and run A against run B
  counts added / changed / removed as B against A counts removed / changed / added;
- a full-mode run against a default-mode run of the same model: only full mode records backward
  ops, and they are left out of that diff (not all "added" one way and "removed" the other).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked, module_browser, open_session, recorded  # noqa: F401 (fixtures)
from conftest import ServerProc
from test_dashboard_graph_diff_runs import diff, leaves

from torchscope.session import load

playwright_sync = pytest.importorskip("playwright.sync_api")

GRAPH = "window.__torchscope.state().graph"
LEGEND = "[data-testid=legend]"
COLOURS = {"added": "#16a34a", "changed": "#d97706", "same": "#9ca3af"}  # frontend/graph/scene.js DIFF_COLORS

SCRIPT = '''
import argparse

import torch
from torch import nn
from torch.nn import functional as F

import torchscope

ap = argparse.ArgumentParser()
ap.add_argument("--record", required=True)
ap.add_argument("--name", default="base")
ap.add_argument("--variant", action="store_true", help="GELU for ReLU, and an extra Linear(64, 64)")
ap.add_argument("--mode", default="full")
args = ap.parse_args()
torch.manual_seed(0)


class MLP(nn.Module):
    def __init__(self, variant):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 64), nn.Linear(64, 64)
        self.extra = nn.Linear(64, 64) if variant else None
        self.head = nn.Linear(64, 3)
        self.act = F.gelu if variant else F.relu

    def forward(self, x):
        # the layers applied here: their ops share one module path (the root)
        x = self.act(F.linear(x, self.fc1.weight, self.fc1.bias))
        x = self.act(F.linear(x, self.fc2.weight, self.fc2.bias))
        if self.extra is not None:
            x = F.linear(x, self.extra.weight, self.extra.bias)
        return F.linear(x, self.head.weight, self.head.bias)


model = MLP(args.variant)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
torchscope.watch(model, opt, server=None, record=args.record, name=args.name, mode=args.mode)
x, y = torch.randn(16, 8), torch.randn(16, 3)
for _ in range(2):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProc, dict[str, str], dict[str, Path]]]:
    """The server, and the session ids and recorded files by name: "base" and "variant" (full
    mode), "light" (the base model in the default mode)."""
    tmp = tmp_path_factory.mktemp("graph-diff-matching")
    script = tmp / "train_diffmatch.py"
    script.write_text(SCRIPT)
    args = {"base": [], "variant": ["--variant"], "light": ["--mode", "default"]}
    files = {n: tmp / f"{n}.tscope" for n in args}
    with ServerProc(tmp / "data") as srv:
        ids = {n: recorded(srv, files[n], script, "--name", n, *a) for n, a in args.items()}
        yield srv, ids, files


def full_sigs(ev: dict[str, Any]) -> dict[str, str]:
    return {key: f"{s}|{sub}" for key, s, sub in leaves(ev)}


def open_diff(page: Any, srv: ServerProc, sid: str, other: str) -> tuple[tuple[int, int, int], dict[str, str]]:
    """Run ``sid``'s step 0 against run ``other``'s step 0: the legend's counts (added, changed,
    removed) and each leaf's mark as the canvas colours it, every module expanded."""
    open_session(page, srv.url, sid, f"?view=graph&overlay=diff&diffrun={other}&diffstep=0")
    page.wait_for_function(f"(() => {{ const g = {GRAPH}; return g && g.nodes.length > 0; }})()")
    page.wait_for_function("/\\d+ added, \\d+ changed, \\d+ removed/.test(document.querySelector('[data-testid=legend]').innerText)")
    legend = str(page.locator(LEGEND).inner_text())
    m = re.search(r"(\d+) added, (\d+) changed, (\d+) removed", legend)
    assert m, legend
    page.evaluate("window.__torchscope.expandAll()")
    by_colour = {c: k for k, c in COLOURS.items()}
    marks = {n["key"]: by_colour.get(n["color"], n["color"]) for n in page.evaluate(f"{GRAPH}.nodes")}
    return (int(m[1]), int(m[2]), int(m[3])), marks


def test_exact_matches_are_the_same_before_any_leaf_is_changed(checked: Any, runs: Any) -> None:  # noqa: F811
    srv, ids, files = runs
    page = checked
    ev = {n: dict(load(files[n]).graph(0)) for n in ("base", "variant")}
    # (the data has what the bug needed: in leaf order, the variant's extra layer's ops come
    # before the last layer's ops of the same labels, which the base has too; the one-pass
    # rule marked 7 of them "changed")
    got = {}
    for mine, other in (("variant", "base"), ("base", "variant")):
        counts, marks = open_diff(page, srv, ids[mine], ids[other])
        expected, removed = diff(ev[mine], ev[other])
        n = Counter(expected.values())
        assert counts == (n["added"], n["changed"], removed), (mine, other, counts)
        assert marks == expected, (mine, other)
        # no leaf is "changed" (or "added") while the other graph has its exact signature left
        # over: what the same leaves did not take
        left = Counter(full_sigs(ev[other]).values()) - Counter(f for k, f in full_sigs(ev[mine]).items() if marks[k] == "same")
        wrong = [(k, f) for k, f in full_sigs(ev[mine]).items() if marks[k] != "same" and left[f] > 0]
        assert not wrong, (mine, other, wrong)
        got[mine] = counts
    # the extra layer is added, GELU for ReLU is added / removed: nothing is "changed" here
    assert got["variant"][0] > 0 and got["variant"][1] == 0, got
    # one direction mirrors the other
    (added_v, changed_v, removed_v), (added_b, changed_b, removed_b) = got["variant"], got["base"]
    assert (added_v, changed_v, removed_v) == (removed_b, changed_b, added_b), got


def test_a_full_mode_run_against_a_default_mode_run_leaves_the_backward_ops_out(checked: Any, runs: Any) -> None:  # noqa: F811
    srv, ids, files = runs
    page = checked
    full_ev, light_ev = dict(load(files["base"]).graph(0)), dict(load(files["light"]).graph(0))
    backward_ops = {f"o{o['id']}" for o in full_ev["ops"] if o.get("phase") == "backward"}
    update_ops = {f"o{o['id']}" for o in full_ev["ops"] if o.get("phase") == "optimizer"}  # (full mode records step() too)
    assert backward_ops and update_ops and not any(o.get("phase") in ("backward", "optimizer") for o in light_ev["ops"])
    # the same model: with full mode's backward ops left out, nothing differs, either way
    counts, marks = open_diff(page, srv, ids["base"], ids["light"])
    assert counts == (0, 0, 0), counts
    assert set(marks.values()) == {"same"} and backward_ops | update_ops <= set(marks), marks
    # and the legend says so: the backward's and optimizer.step()'s ops of the full-mode graph, left out
    legend = page.locator(LEGEND).inner_text()
    assert (f"; {len(backward_ops)} backward ops and {len(update_ops)} optimizer.step() ops left out "
            "(recorded in full mode by one of the runs only)") in legend, legend
    counts, marks = open_diff(page, srv, ids["light"], ids["base"])
    assert counts == (0, 0, 0), counts
    assert set(marks.values()) == {"same"}, marks
