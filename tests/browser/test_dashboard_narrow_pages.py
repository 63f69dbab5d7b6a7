"""Narrow windows and long run names (QA): the sessions list and the compare page never run off
the side of the window.  Three real recorded runs, one with a 69-character unicode name, imported
into a real server; at 1280 and 800 px the page is no wider than the window, both runs' columns
and every row's action buttons are in view, and the long name can still be read in full (its
text, or the title of what shows it cut)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser_page import checked_context, module_browser, recorded, shot  # noqa: F401
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

SCRIPT = Path(__file__).with_name("dashboard_train_compare.py")
LONG = "тренировка_модели_с_очень_длинным_названием_для_проверки_интерфейса_🙂"
SHORT = "short run"
OTHER = "lr 0.1"
WIDTHS = (1280, 800)

# every element wider than the window, or reaching past its right edge (for the failure message)
OVERFLOW = """() => {
  const doc = document.documentElement, w = window.innerWidth;
  const wide = [...document.querySelectorAll('body *')].filter((e) => e.getBoundingClientRect().right > w + 1)
    .slice(0, 8).map((e) => `${e.tagName.toLowerCase()}.${e.className}: ${Math.round(e.getBoundingClientRect().right)}`);
  return { scroll: doc.scrollWidth, inner: w, wide };
}"""

# the long name, whole, in some element's text or title
READABLE = """(name) => [...document.querySelectorAll('body *')].some((e) =>
  (e.title || '').includes(name) || ([...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.includes(name))))"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("narrow")
    with ServerProc(tmp / "data") as srv:
        a = recorded(srv, tmp / "long.tscope", SCRIPT, "--name", LONG, "--steps", "3")
        b = recorded(srv, tmp / "short.tscope", SCRIPT, "--name", SHORT, "--steps", "3", "--lr", "0.3")
        c = recorded(srv, tmp / "other.tscope", SCRIPT, "--name", OTHER, "--steps", "3", "--lr", "0.1")
        yield srv, a, b, c


def no_overflow(page: Any, what: str) -> None:
    got = page.evaluate(OVERFLOW)
    assert got["scroll"] <= got["inner"] + 1, (what, got)


def in_view(page: Any, locator: Any, what: str) -> None:
    assert locator.count() >= 1, what
    w = page.evaluate("window.innerWidth")
    for k in range(locator.count()):
        box = locator.nth(k).bounding_box()
        assert box is not None and box["width"] > 0 and box["height"] > 0, (what, k, box)
        assert box["x"] >= 0 and box["x"] + box["width"] <= w + 1, (what, k, box, w)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_sessions_list_fits_the_window(runs: Any, module_browser: Any, width: int) -> None:  # noqa: F811
    srv, a, b, c = runs
    with checked_context(module_browser, width, 800) as page:
        page.goto(srv.url + "/")
        page.locator(f"tr[data-id='{a}']").wait_for()
        page.locator(f"tr[data-id='{b}']").wait_for()
        shot(page, f"narrow-sessions-{width}")
        no_overflow(page, f"/ at {width}")
        in_view(page, page.locator("table.list"), "the table")
        for sid in (a, b, c):
            row = page.locator(f"tr[data-id='{sid}']")
            for name in ("Rename", "Tag", "Download", "Delete"):
                in_view(page, row.get_by_role("button", name=name, exact=True), f"{sid} {name}")
            in_view(page, row.locator("input[data-testid=compare-pick]"), f"{sid} compare box")
            in_view(page, row.locator("a.session-link"), f"{sid} name")
        assert page.evaluate(READABLE, LONG), "the long name, whole, nowhere on the page"
        # nothing disappeared: the row's link still carries the whole name
        link = page.locator(f"tr[data-id='{a}'] a.session-link")
        assert LONG in (link.text_content() or "") or LONG in (link.get_attribute("title") or "")


@pytest.mark.parametrize("names", ["long", "short"])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_compare_page_fits_the_window(runs: Any, module_browser: Any, width: int, names: str) -> None:  # noqa: F811
    srv, long_run, short_run, other = runs
    a, b = (long_run, short_run) if names == "long" else (other, short_run)
    with checked_context(module_browser, width, 800) as page:
        page.goto(f"{srv.url}/compare?a={a}&b={b}")
        page.wait_for_function("window.__torchscope && window.__torchscope.ready")
        page.evaluate("window.__torchscope.ready")
        page.wait_for_function("!document.querySelector('[data-fact=doctor]').textContent.includes('checking')")
        page.wait_for_timeout(200)  # the charts' resize after the layout
        shot(page, f"narrow-compare-{names}-{width}")
        no_overflow(page, f"/compare at {width}")
        # both runs: their legend entries, their columns of the facts table, every cell
        in_view(page, page.locator("[data-testid=compare-legend] .compare-run"), "legend")
        for run in ("a", "b"):
            in_view(page, page.locator(f"table.compare-facts th[data-run={run}]"), f"column {run}")
        in_view(page, page.locator("table.compare-facts td"), "facts cells")
        in_view(page, page.locator(".compare-charts canvas"), "charts")
        if names == "long":
            assert page.evaluate(READABLE, LONG), "the long name, whole, nowhere on the page"
