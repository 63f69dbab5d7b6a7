"""The dashboard on the forty-fourth session's findings (QA 44c).

- A GAN whose generator loss is made from ``D(fake.detach())`` has no graph: no backward reached
  the generator.  The graph view said "the script ended before a captured step completed" of a
  run that finished all its steps, and the gradient charts "No data yet"; they say why now, and
  where to look (the Doctor).
- Full mode draws ``optimizer.step()``'s ops in a colour of their own, which the legend did not
  name.
- A compiled forward's module outputs and forward ops are not recorded: the gradients view gave
  a wrong reason, the graph view none.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked, module_browser, open_session, recorded  # noqa: F401 - fixtures
from conftest import EXAMPLES, ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("qa44-server")) as s:
        yield s


@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


def test_a_run_no_backward_reached_says_so_in_the_graph_view(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    sid = recorded(srv, tmp_path / "gan.tscope", HERE / "dashboard_gan_detach.py", "--steps", "6")
    (p1,) = [f for f in srv.get(f"/api/sessions/{sid}/diagnostics") if f["code"] == "P1"]
    assert p1["title"] == "No backward reaches the model", p1
    open_session(page, srv.url, sid, "?view=graph")
    status = page.locator(".graph-status")
    status.wait_for(state="visible")
    text = status.inner_text()
    assert "no backward() of its 6 steps reached the model's parameters" in text and "Doctor" in text, text
    assert "ended before" not in text, text
    # the gradient charts of the finished run say why they are empty, not "No data yet"
    open_session(page, srv.url, sid, "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps >= 6; })()")
    empty = page.evaluate("window.__torchscope.state().gradients.totalEmpty")
    assert empty.startswith("No parameter had a gradient (.grad) at optimizer.step() on any step"), empty


def test_the_legend_names_the_optimizers_ops(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    sid = recorded(srv, tmp_path / "full.tscope", EXAMPLES / "mlp.py", "--steps", "2", "--mode", "full", "--server", "none")
    open_session(page, srv.url, sid, "?view=graph")
    legend = page.locator("[data-testid=legend]")
    page.wait_for_function("document.querySelector('[data-testid=legend]')?.innerText.includes('AccumulateGrad')")
    assert "optimizer.step() op" in legend.inner_text()
    # a graph without them (default mode records no optimizer op) does not list it
    sid = recorded(srv, tmp_path / "default.tscope", EXAMPLES / "mlp.py", "--steps", "2", "--server", "none")
    open_session(page, srv.url, sid, "?view=graph")
    page.wait_for_function("document.querySelector('[data-testid=legend]')?.innerText.includes('AccumulateGrad')")
    assert "optimizer.step() op" not in legend.inner_text()


COMPILED = '''
import sys, torch, torchscope
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run = torch.compile(model, backend="aot_eager")
with torchscope.watch(model, opt, server=None, record=sys.argv[sys.argv.index("--record") + 1], mode="full"):
    for _ in range(3):
        opt.zero_grad()
        run(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
'''


def test_a_compiled_forwards_missing_module_outputs_are_told_why(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """A compiled forward runs none of the module hooks that record each module's output: the
    gradients view said "no module returned a floating-point tensor", of a model whose modules
    all did, and listed the steps it tried backwards."""
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    sid = recorded(srv, tmp_path / "compiled.tscope", script)
    open_session(page, srv.url, sid, "?view=gradients")
    empty = page.locator("[data-testid=act-empty]")
    empty.wait_for(state="visible")
    text = empty.inner_text()
    assert text.startswith("The captured steps 0, 1, 2 recorded no module output"), text
    assert "torch.compile'd forward runs none of the module hooks" in text, text
    # and the graph view says why its forward column is empty
    open_session(page, srv.url, sid, "?view=graph")
    page.wait_for_function("document.querySelector('.graph-status')?.innerText.includes('torch.compile')")
    assert "The forward ran compiled (torch.compile): its ops are not recorded" in page.locator(".graph-status").inner_text()
