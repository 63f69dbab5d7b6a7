"""A grad_fn node's details panel lists what it saved for backward besides tensors
(NodeRecord.attrs: a convolution's stride and padding, a batch norm's eps), as torchviz's
``show_attrs`` does, each value as Python prints it: ``stride (2, 2)``, ``transposed False``,
``eps 1e-05``.

Checked in a real headless Chromium against a real `torchscope serve`, with a real full-mode
run recorded to a file and imported; what the table must say is read from that file
(``torchscope.load(path).graph(0)``) and printed by Python itself (``repr`` of the tuple)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from browser_page import checked, module_browser, open_session, recorded, shot  # noqa: F401 - fixtures
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

SCRIPT = """
import argparse, torch, torchscope
from torch import nn
ap = argparse.ArgumentParser()
ap.add_argument("--record", required=True)
args = ap.parse_args()
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w = torchscope.watch(model, opt, server=None, record=args.record, name="node-attrs", mode="full")
for _ in range(2):
    opt.zero_grad()
    nn.functional.cross_entropy(model(torch.randn(2, 3, 8, 8)), torch.tensor([1, 2])).backward()
    opt.step()
w.close()
"""

# the details panel's attributes table, name -> value as shown
ATTRS_TABLE = """() => {
  const t = document.querySelector('[data-testid=details] [data-testid=node-attrs]');
  if (!t) return null;
  return Object.fromEntries([...t.querySelectorAll('tr')].map((r) => [r.querySelector('th').textContent, r.querySelector('td').textContent]));
}"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("node-attrs-server")) as s:
        yield s


@pytest.fixture(scope="module")
def run(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The imported run's session id and its step 0's graph as the file holds it."""
    import torchscope

    d = tmp_path_factory.mktemp("node-attrs-run")
    script = d / "train_node_attrs.py"
    script.write_text(SCRIPT)
    path = d / "full.tscope"
    sid = recorded(srv, path, script)
    return {"sid": sid, "graph": torchscope.load(str(path)).graph(0)}


@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


def as_python(v: Any) -> str:
    """How Python prints a saved attribute (the file holds tuples as lists)."""
    return repr(tuple(v)) if isinstance(v, list) else repr(v)


def details_of(page: Any, srv: ServerProc, sid: str, node: dict[str, Any]) -> dict[str, str] | None:
    open_session(page, srv.url, sid, "?view=graph&step=0")
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")
    page.evaluate("(k) => window.__torchscope.select(k)", f"n{node['id']}")
    page.wait_for_function("(n) => document.querySelector('[data-testid=details] h3')?.textContent === n", arg=node["name"])
    return page.evaluate(ATTRS_TABLE)  # type: ignore[no-any-return]


def node(graph: dict[str, Any], name: str) -> dict[str, Any]:
    (n,) = [n for n in graph["nodes"] if n["name"] == name]
    return n


def test_convolution_details_list_its_saved_attributes(page: Any, srv: ServerProc, run: dict[str, Any]) -> None:
    conv = node(run["graph"], "ConvolutionBackward0")
    assert conv["attrs"]["stride"] == [2, 2]  # what the file holds
    shown = details_of(page, srv, run["sid"], conv)
    assert shown is not None, "no attributes table in the details panel"
    assert shown["stride"] == "(2, 2)" and shown["padding"] == "(1, 1)" and shown["transposed"] == "False"
    assert shown == {k: as_python(v) for k, v in conv["attrs"].items()}
    assert page.locator("[data-testid=details] h4", has_text="attributes (saved for backward)").count() == 1
    shot(page, "node-attrs-conv")


def test_batch_norm_eps_reads_as_python_prints_it_and_a_node_without_attributes_has_no_table(page: Any, srv: ServerProc, run: dict[str, Any]) -> None:
    bn = node(run["graph"], "NativeBatchNormBackward0")
    shown = details_of(page, srv, run["sid"], bn)
    assert shown is not None and shown["eps"] == "1e-05" and shown["training"] == "True"
    assert shown == {k: as_python(v) for k, v in bn["attrs"].items()}
    # a node that saved nothing besides tensors has no such table
    relu = node(run["graph"], "ReluBackward0")
    assert "attrs" not in relu and details_of(page, srv, run["sid"], relu) is None

