"""The dashboard on the forty-eighth session's findings (QA 48b).

- A GAN watched through a container whose submodules the loop calls: the first step's graph has
  no op (the capture learned of those calls there).  Its status line said "the op recorder stopped
  partway through this step (its error is in the run's log)" of a log with no error, and every
  grad_fn node was placed in "(root)".
- A later step of it holds four forward calls and two backward passes: the status line said
  "4 micro-batches", as of gradient accumulation.
- A light run's graph view (no graph) offered "Top ops" (an empty table), "Export PNG" ("Export
  failed: no graph shown") and "Click a node to see its details".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked, contrast, graph_settled, module_browser, open_session, recorded  # noqa: F401 - fixtures
from conftest import EXAMPLES, ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("qa48-server")) as s:
        yield s


@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


@pytest.fixture(scope="module")
def gan(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> str:
    return recorded(srv, tmp_path_factory.mktemp("qa48-runs") / "gan.tscope", HERE / "dashboard_gan_container.py")


def _status(page: Any, srv: ServerProc, sid: str, step: int) -> str:
    open_session(page, srv.url, sid, f"?view=graph&step={step}")
    status = page.locator(".graph-status")
    status.wait_for(state="visible")
    graph_settled(page)
    return str(status.inner_text())


def test_a_step_without_ops_says_why_not_a_recorder_error(page: Any, srv: ServerProc, gan: str) -> None:
    graph = srv.get(f"/api/sessions/{gan}/graph?step=0")
    # the premise: no op recorded, the grad_fn graph there, and no error in the run's log
    assert graph["ops"] == [] and graph["nodes"] and graph["complete"] is False  # type: ignore[index]
    text = _status(page, srv, gan, 0)
    assert "No op of this step was recorded: the loop called the model's submodules" in text, text
    assert "its error is in the run's log" not in text
    # its nodes are placed nowhere they did not run: not "(root)"
    key = page.evaluate("""() => window.__torchscope.app.views.graph.obj.model.leaves
      .find((l) => l.kind === "node" && !l.module).key""")
    page.evaluate(f"window.__torchscope.select({key!r})")
    details = page.locator("[data-testid=details]")
    row = details.locator("table.kv tr", has=page.locator("th", has_text="module")).first
    row.wait_for()
    assert row.locator("td").inner_text() == "(module not recorded)"


def test_forward_calls_that_are_no_micro_batches_are_not_called_so(page: Any, srv: ServerProc, gan: str) -> None:
    step = next(s for s in srv.get(f"/api/sessions/{gan}/steps") if s["step"] == 1)  # type: ignore[union-attr]
    assert step["micro_batches"] == 2 and len(step["forwards"]) == 4  # the premise
    text = _status(page, srv, gan, 1)
    assert "4 forward calls and 2 backward passes in this step" in text and "micro-batches" not in text, text


def test_a_run_without_a_graph_offers_nothing_to_export_or_click(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    sid = recorded(srv, tmp_path / "light.tscope", EXAMPLES / "mlp.py", "--steps", "3", "--mode", "light", "--server", "none")
    open_session(page, srv.url, sid, "?view=graph&top=1")
    page.locator(".graph-status").wait_for(state="visible")
    empty = page.locator("[data-testid=details-empty]")
    empty.wait_for()
    assert empty.inner_text().startswith("No graph to show")
    for testid in ("top-ops-toggle", "export-png"):
        assert page.locator(f"[data-testid={testid}]").is_hidden(), testid
    assert page.evaluate("window.__torchscope.app.views.graph.obj.topOps.open") is False


def test_a_one_step_runs_diff_picks_a_run_of_its_own_model(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """A run with one captured step can only be diffed against another run: the newest of the same
    model class, not whatever ran last (QA 48b: a ResNet diffed against an MLP run, all "added")."""
    older = recorded(srv, tmp_path / "a1.tscope", EXAMPLES / "mlp.py", "--steps", "1", "--server", "none")
    recorded(srv, tmp_path / "gan.tscope", HERE / "dashboard_gan_container.py", "--steps", "2")  # newer, another class
    sid = recorded(srv, tmp_path / "a2.tscope", EXAMPLES / "mlp.py", "--steps", "1", "--server", "none")
    assert [g["step"] for g in srv.get(f"/api/sessions/{sid}/graphs")] == [0]  # type: ignore[union-attr]
    open_session(page, srv.url, sid, "?view=graph")
    page.wait_for_function("!document.querySelector('[data-testid=overlay] option[value=diff]').disabled")
    page.locator("[data-testid=overlay]").select_option("diff")
    menu = page.locator("[data-testid=diff-run]")
    menu.wait_for(state="visible")
    assert menu.input_value() == older


# the text colours a page shows, over the page's background and a panel's, per theme
COLOURS = """() => {
  const probe = (cls, tag = "span") => { const el = document.createElement(tag); el.className = cls; el.textContent = "x";
    document.body.append(el); const st = getComputedStyle(el); const out = [st.color, st.backgroundColor]; el.remove(); return out; };
  const root = getComputedStyle(document.documentElement);
  return { link: probe("", "a")[0], brand: getComputedStyle(document.querySelector("header.top .brand")).color,
           ok: (() => { const el = document.createElement("span"); el.id = "conn-probe"; el.className = "ok";
                        document.body.append(el); el.id = "conn"; const c = getComputedStyle(el).color; el.remove(); return c; })(),
           warn: probe("badge warn"), bg: root.getPropertyValue("--bg").trim(), panel: root.getPropertyValue("--panel").trim() };
}"""


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_text_colours_meet_wcag_aa(page: Any, srv: ServerProc, theme: str) -> None:
    """Links and the brand in the accent's hue, "● connected", white on a warning badge: each
    at least 4.5:1 against the page and a panel (QA 48d: 3.2-3.7:1 in the light theme)."""
    page.goto(srv.url + "/")
    page.evaluate(f"localStorage.setItem('torchscope-theme', '{theme}')")
    page.reload()
    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    c = page.evaluate(COLOURS)
    for name in ("link", "brand", "ok"):
        for back in ("bg", "panel"):
            assert contrast(c[name], c[back]) >= 4.5, (theme, name, back, c)
    fg, bg = c["warn"]
    assert contrast(fg, bg) >= 4.5, (theme, c["warn"])
