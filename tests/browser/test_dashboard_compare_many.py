"""Compare a sweep (/compare?runs=<id>,...; QA: "there is no way to put 5 or 12 runs' loss curves
on one chart", and /compare?a=&b=&c=&d=&e= silently showed A and B).  Ten real runs of one script
-- eight of a learning-rate sweep of a few hundred steps each (different lengths, one diverging
to NaN), all under the script's default name, and two short ones -- imported into a real
`torchscope serve`, opened in headless Chromium:

- eight runs on every chart, each run's values as its recorded file has them on one step axis,
  a colour per run (the same on every chart, at least 3:1 against the chart panel in the light
  and the dark theme), each legend naming every run (with its id: the names repeat), the NaN/Inf
  ticks in the diverging run's colour, every run in the chart's label for a screen reader;
- the facts table's column per run, its new "command line" row (argv: what tells sweep runs
  apart) marked as differing, a row every run shares not marked;
- the page's load time with 8 runs x 6 charts (printed and written to test-artifacts/);
- more than eight named: the first eight shown, the rest named on the page with a link that
  compares them; the letters form (?a=&b=&c=...) read in letter order;
- the two-run form ?a=&b= as before, with the command line; an ill-formed id in runs= a 422 as an
  ill-formed a= is."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_page import checked_context, contrast, module_browser, recorded, shot  # noqa: F401
from conftest import ARTIFACTS, ServerProc
from test_dashboard_compare import KEYS, expected

from torchscope.session import load

playwright_sync = pytest.importorskip("playwright.sync_api")

SCRIPT = Path(__file__).with_name("dashboard_train_compare.py")
STATE = "window.__torchscope.state()"
# the sweep: a learning rate and a length each (the last one diverges: its loss turns Inf, then NaN)
SWEEP = [(0.001, 300), (0.003, 310), (0.01, 320), (0.02, 330), (0.03, 340), (0.05, 350), (0.1, 360), (40.0, 370)]
LOADED = "window.__torchscope && window.__torchscope.ready"
# the main thread's long tasks (over 50 ms) from the page's start: what "responsive" is measured by
LONG_TASKS = """window.__long = [];
new PerformanceObserver((l) => { for (const e of l.getEntries()) window.__long.push(e.duration); })
  .observe({ type: "longtask", buffered: true });"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The server, the sweep's (id, file) pairs in sweep order, and two short runs' (id, file)."""
    tmp = tmp_path_factory.mktemp("sweep")
    with ServerProc(tmp / "data") as srv:
        runs = []
        for k, (lr, steps) in enumerate(SWEEP):
            path = tmp / f"sweep{k}.tscope"
            extra = ["--log", "acc"] if k == 2 else []  # one run logs a number of its own
            runs.append((recorded(srv, path, SCRIPT, "--lr", str(lr), "--steps", str(steps), *extra), path))
        short = [(recorded(srv, tmp / f"short{k}.tscope", SCRIPT, "--name", f"short {k}", "--steps", "5"), tmp / f"short{k}.tscope")
                 for k in (0, 1)]  # fmt: skip
        yield srv, runs, short


def open_compare(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_function(LOADED)
    page.evaluate("window.__torchscope.ready")


def labels(page: Any, srv: Any, ids: list[str], twins: bool) -> list[str]:
    """The page's name of each run: name, start time as the browser writes it, and its id when
    another run on the page has its name."""
    out = []
    for sid in ids:
        s = srv.get(f"/api/sessions/{sid}")
        when = page.evaluate("(t) => new Date(t * 1000).toLocaleString()", s["started_at"])
        out.append(f"{s['name']} (started {when})" + (f" [{sid}]" if twins else ""))
    return out


def test_eight_runs_of_a_sweep_on_every_chart(sweep: Any, module_browser: Any) -> None:  # noqa: F811
    srv, runs, _ = sweep
    ids = [sid for sid, _ in runs]
    with checked_context(module_browser, 1400, 1000) as page:
        page.add_init_script(LONG_TASKS)
        t0 = time.perf_counter()
        open_compare(page, f"{srv.url}/compare?runs={','.join(ids)}")
        wall = time.perf_counter() - t0
        loaded_ms = page.evaluate("window.__torchscope.loadedMs")
        page.wait_for_function("!document.querySelector('[data-fact=doctor]').textContent.includes('checking')", timeout=60_000)
        long_tasks = page.evaluate("window.__long")
        draw_ms = page.evaluate("window.__torchscope.drawMs()")
        shot(page, "compare-many-sweep")
        got: dict[str, Any] = page.evaluate(STATE)
        full = labels(page, srv, ids, twins=True)
        aria = {k: page.locator(f"[data-testid=compare-{k}] canvas").get_attribute("aria-label") or "" for k in KEYS}
        heads = [page.locator(f"table.compare-facts th[data-run={c}]").count() for c in "abcdefgh"]
        differs = {k: page.locator(f"tr[data-fact={k}]").get_attribute("class") or "" for k in ("argv", "model", "lr0")}
    figures = {"runs": len(ids), "steps": [s for _, s in SWEEP], "page_load_ms": round(loaded_ms), "goto_to_ready_s": round(wall, 2),
               "longest_task_ms": round(max(long_tasks, default=0)), "redraw_all_charts_ms": round(draw_ms, 1)}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "compare-many-timing.json").write_text(json.dumps(figures, indent=1))
    print("compare page, 8 runs x 6 charts:", figures)
    # 8 runs of 300..370 steps: the page loads (every chart drawn) in well under the 15 s allowed
    # here (a busy 2-core CI machine; the figure is in compare-many-timing.json), and no single
    # task holds the main thread for a second
    assert loaded_ms < 15_000 and max(long_tasks, default=0) < 1_000, figures

    assert got["ids"] == ids
    # the charts name a run by its letter, name and id (the start time only in the page's legend:
    # eight full names stacked eight lines over each chart); all eight are "compare": the ids tell
    names = [f"{'ABCDEFGH'[k]}: compare [{sid}]" for k, sid in enumerate(ids)]
    assert all(f.endswith(f" [{sid}]") and f.startswith("compare (started ") for f, sid in zip(full, ids, strict=True)), full
    steps = list(range(max(n for _, n in SWEEP)))
    want = [expected(path, steps) for _, path in runs]
    assert want[7]["loss"][-1] == "NaN" and want[0]["loss"][300] is None  # the diverging run; a shorter one's line stops
    colors = got["charts"]["loss"]["series"]
    palette = [s["color"] for s in colors]
    assert len(set(palette)) == 8, palette
    for key in KEYS:
        chart = got["charts"][key]
        assert chart["x"] == steps, key
        assert [s["name"] for s in chart["series"]] == names, (key, [s["name"] for s in chart["series"]])
        for k in range(8):
            assert chart["series"][k]["y"] == want[k][key], (key, k)
        assert [s["color"] for s in chart["series"]] == palette, key  # a colour per run, the same on every chart
        # the legend names every run, with its id (all eight are "compare")
        assert len(chart["legend"]) == 8 and all(n in t for n, t in zip(names, chart["legend"], strict=True)), (key, chart["legend"])
        # the label a screen reader says names every run's line
        assert all(f"{n}: " in aria[key] for n in names), (key, aria[key])
    assert got["charts"]["grad_norm"]["log"] is True
    # the NaN/Inf ticks: the diverging run's steps, in its colour
    bad = [s for s, v in enumerate(want[7]["loss"]) if v in ("NaN", "Infinity", "-Infinity")]
    assert bad and got["charts"]["loss"]["marks"] == bad
    assert set(got["charts"]["loss"]["markColors"]) == {palette[7]}
    # a name one run logged: its chart, that run's line alone
    assert [s["name"] for s in got["charts"]["metric:acc"]["series"]] == [names[2]]
    # the page's legend, lettered A to H; a facts column per run
    assert got["legend"] == [f"{'ABCDEFGH'[k]}: {full[k]}" for k in range(8)], got["legend"]
    assert heads == [1] * 8
    facts = got["facts"]
    assert all(len(cells) == 8 for cells in facts.values()), facts
    assert facts["argv"] == [shlex.join(load(path).meta["argv"]) for _, path in runs], facts["argv"]
    assert all(f"--lr {lr}" in facts["argv"][k] for k, (lr, _) in enumerate(SWEEP)), facts["argv"]
    assert facts["lr0"] == [f"{lr:g}" for lr, _ in SWEEP]
    assert facts["steps"] == [str(n) for _, n in SWEEP]
    assert facts["model"] == ["Sequential"] * 8
    assert "differs" in differs["argv"] and "differs" in differs["lr0"] and "differs" not in differs["model"], differs


def test_run_colours_stand_out_in_both_themes(sweep: Any, module_browser: Any) -> None:  # noqa: F811
    """Each run's colour against the chart panel, light and dark: 3:1 at least (WCAG 1.4.11)."""
    srv, runs, _ = sweep
    with checked_context(module_browser) as page:
        open_compare(page, f"{srv.url}/compare?runs={','.join(sid for sid, _ in runs)}")
        palette = [s["color"] for s in page.evaluate(STATE)["charts"]["loss"]["series"]]
        swatches = page.locator("[data-testid=compare-legend] .swatch").evaluate_all("(es) => es.map((e) => getComputedStyle(e).backgroundColor)")
        seen = {}
        for theme in ("light", "dark"):
            if page.evaluate("document.documentElement.dataset.theme") != theme:
                page.locator("#theme").click()
            panel = page.evaluate("getComputedStyle(document.documentElement).getPropertyValue('--panel').trim()")
            seen[theme] = [round(contrast(c, panel), 2) for c in palette]
            # the charts keep each run's colour across the switch
            assert [s["color"] for s in page.evaluate(STATE)["charts"]["loss"]["series"]] == palette
        shot(page, "compare-many-dark")
    assert [contrast(s, c) for s, c in zip(swatches, palette, strict=True)] == [1.0] * 8  # the legend's swatches are the lines' colours
    assert all(r >= 3 for rs in seen.values() for r in rs), seen
    assert seen["light"] != seen["dark"]  # (two panels were measured)


def test_more_than_eight_named_are_said_and_compared_on_their_own(sweep: Any, module_browser: Any) -> None:  # noqa: F811
    srv, runs, short = sweep
    ids = [sid for sid, _ in runs] + [sid for sid, _ in short]
    with checked_context(module_browser) as page:
        open_compare(page, f"{srv.url}/compare?runs={','.join(ids)}")
        got = page.evaluate(STATE)
        note = page.locator("[data-testid=compare-left-out]")
        text = note.inner_text()
        shot(page, "compare-many-left-out")
        assert got["ids"] == ids[:8] and len(got["charts"]["loss"]["series"]) == 8
        assert 'left out: "short 0", "short 1"' in text and "at most 8 runs" in text, text
        # its link compares the two left out
        note.get_by_role("link").click()
        page.wait_for_url("**/compare?runs=*")
        page.wait_for_function(LOADED)
        page.evaluate("window.__torchscope.ready")
        again = page.evaluate(STATE)
        assert again["ids"] == ids[8:] and page.locator("[data-testid=compare-left-out]").count() == 0
        assert [s["name"] for s in again["charts"]["loss"]["series"]] == labels(page, srv, ids[8:], twins=False)

        # QA's link: letters past b, in letter order (not the order written), no run dropped
        q = "&".join(f"{c}={ids[k]}" for k, c in reversed(list(enumerate("abcde"))))
        open_compare(page, f"{srv.url}/compare?{q}")
        got = page.evaluate(STATE)
        assert got["ids"] == ids[:5], (q, got["ids"])
        assert [t.split(":")[0] for t in got["legend"]] == list("ABCDE")
        assert all(len(cells) == 5 for cells in got["facts"].values())
        assert page.locator("h2").inner_text() == "Compare 5 runs"

        # one run is not a comparison: one sentence, as ?a= alone
        open_compare(page, f"{srv.url}/compare?runs={ids[0]}")
        fatal = page.locator("#fatal").inner_text()
        assert fatal.startswith("Pick two sessions to compare") and "?runs=" in fatal and "\n" not in fatal, fatal
        assert page.locator("canvas").count() == 0


def test_two_runs_as_before_with_their_command_lines(sweep: Any, module_browser: Any) -> None:  # noqa: F811
    srv, runs, short = sweep
    (a, pa), (b, pb) = runs[0], short[0]
    with checked_context(module_browser) as page:
        open_compare(page, f"{srv.url}/compare?a={a}&b={b}")
        got = page.evaluate(STATE)
        names = labels(page, srv, [a, b], twins=False)  # "compare" and "short 0": no ids
        assert got["ids"] == [a, b] and got["legend"] == [f"A: {names[0]}", f"B: {names[1]}"]
        assert page.locator("h2").inner_text() == "Compare runs" and page.locator("[data-testid=compare-left-out]").count() == 0
        assert got["facts"]["argv"] == [shlex.join(load(p).meta["argv"]) for p in (pa, pb)]
        assert "--steps 5" in got["facts"]["argv"][1]
        assert page.locator("tr[data-fact=argv] th").inner_text() == "command line"
        # a? and runs= together: the letters first
        open_compare(page, f"{srv.url}/compare?runs={runs[1][0]}&a={a}&b={b}")
        assert page.evaluate(STATE)["ids"] == [a, b, runs[1][0]]
    # an ill-formed id is refused as an ill-formed a= is (422), wherever it is written
    for query in ("a=bad/id&b=x", f"runs={a},bad/id", f"a={a}&c=bad/id"):
        res = httpx.get(f"{srv.url}/compare?{query}", timeout=30)
        assert res.status_code == 422, (query, res.status_code, res.text[:300])


def test_ticking_runs_on_the_sessions_page_compares_up_to_eight(sweep: Any, module_browser: Any) -> None:  # noqa: F811
    """The list's "compare" boxes: a third tick dropped the first (QA 51c); up to eight are
    compared now, in the order ticked, and a ninth is refused and said."""
    srv, runs, short = sweep
    ids = [sid for sid, _ in runs] + [sid for sid, _ in short]
    with checked_context(module_browser) as page:
        page.goto(srv.url + "/")
        page.locator(f"tr[data-id='{ids[-1]}']").wait_for()
        order = [ids[2], ids[0], ids[5]]
        for sid in order:
            page.locator(f"tr[data-id='{sid}'] input[data-testid=compare-pick]").check()
        assert page.locator("#compare").inner_text() == "Compare the 3 ticked runs"
        for sid in ids:  # every other one, up to eight, then a ninth
            if sid not in order:
                page.locator(f"tr[data-id='{sid}'] input[data-testid=compare-pick]").click()
        ticked = [sid for sid in ids if page.locator(f"tr[data-id='{sid}'] input[data-testid=compare-pick]").is_checked()]
        assert len(ticked) == 8 and set(order) <= set(ticked), ticked
        assert "At most 8 runs can be compared at once" in page.locator("#note").inner_text()
        # back to three, in the order ticked: run A is the first ticked
        for sid in ticked:
            if sid not in order:
                page.locator(f"tr[data-id='{sid}'] input[data-testid=compare-pick]").uncheck()
        page.locator("#compare").click()
        page.wait_for_url("**/compare?*")
        page.wait_for_function(LOADED)
        page.evaluate("window.__torchscope.ready")
        assert page.evaluate(STATE)["ids"] == order
