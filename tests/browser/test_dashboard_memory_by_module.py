"""The Memory view's in-step timeline "by module" (memory_viz's stacked allocations, in a PyTorch
user's words): the live bytes after each op stacked as what the step began with plus, per module,
the tensors its ops made that are still alive -- checked against the recorded file's frees
(OpRecord.freed, format 1.9, walked by conftest's ``alive_after_each_op``) for the example MLP
in default and full mode (full: the backward's allocations in their own "(backward)" bands) and
the example transformer (more modules than bands: the rest summed as "other modules"); the
choice kept in the URL; a file from before 1.9 keeps the single line.  And the table under it,
what was alive at the in-step peak, with the op that made and the op that freed each tensor."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import forkrun
import pytest
from browser_page import checked, fmt_bytes, module_browser, open_session, session_id, shot  # noqa: F401 - fixtures
from conftest import EXAMPLES, ServerProc, alive_after_each_op, untracked_frees

from torchscope.session import load

playwright_sync = pytest.importorskip("playwright.sync_api")

RUNS = {"mlp-default": ("mlp.py", "default"), "mlp-full": ("mlp.py", "full"), "transformer-default": ("transformer.py", "default"),
        "cnn-full": ("cnn.py", "full")}
MAX_BANDS = 8  # the view's named module bands; the rest are one "other modules" band
BASE = "held before the step's first op"
CHART = """() => { const m = window.__torchscope.app.views.memory.obj;
  return { stacked: !!m.timeline.opts.stacked, step: +m.stepSel.value, tl: m.tl, by: m.bySel.value, byHidden: m.bySel.hidden,
    bands: m.timeline.series.map((s) => ({ name: s.name, y: s.y, keys: s.keys || null })) }; }"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("bymodule-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path]]:
    d = tmp_path_factory.mktemp("bymodule-runs")
    out = {}
    for key, (script, mode) in RUNS.items():
        path = d / f"{key}.tscope"
        run = forkrun.run([str(EXAMPLES / script), "--steps", "2", "--mode", mode, "--server", srv.url,
                           "--record", str(path)], timeout=240)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        name = str(load(path).meta["name"])
        out[key] = (session_id(srv, name, "finished"), path)
    return out


@pytest.fixture
def page(checked: Any) -> Any:  # noqa: F811 - the fixture, by the name these tests use
    return checked


def band_key(op: dict[str, Any]) -> str:
    """The band an op's allocations go to, as the view keys it: its module, its backward apart,
    the ops outside the model one band, optimizer.step()'s one band."""
    if op.get("phase") == "optimizer":
        return "optimizer"
    outside = not op.get("module") and "outside_model" in op.get("flags", [])
    return ("outside" if outside else f"module:{op.get('module', '')}") + (" (backward)" if op.get("phase") == "backward" else "")


def bytes_by_band(ev: dict[str, Any]) -> dict[int, dict[str, int]]:
    """After each op (by id), the file's alive storages summed by the band of the op that made
    each: a storage new after an op (or freed and made again in it) is that op's."""
    ops = {o["id"]: o for o in ev["ops"]}
    maker: dict[int, str] = {}
    out: dict[int, dict[str, int]] = {}
    before: dict[int, int] = {}
    for op_id, alive in alive_after_each_op(ev):
        op = ops[op_id]
        for sid in alive:
            if sid not in before or sid in op.get("freed", []):
                maker[sid] = band_key(op)
        sums: dict[str, int] = {}
        for sid, nbytes in alive.items():
            sums[maker[sid]] = sums.get(maker[sid], 0) + nbytes
        out[op_id] = sums
        before = alive
    return out


def switch_to_modules(page: Any) -> dict[str, Any]:
    page.locator("[data-testid=timeline-by]").select_option("module")
    page.wait_for_function("window.__torchscope.app.views.memory.obj.timeline.opts.stacked === true")
    return page.evaluate(CHART)


def check_bands(chart: dict[str, Any], path: Path) -> dict[str, Any]:
    """The chart's bands against the file: what each holds at the peak and three other ops,
    their sum at every op, and which modules got a band of their own."""
    ev = dict(load(path).graph(chart["step"]))
    tl = chart["tl"]
    assert [p[0] for p in tl] == [p[0] for p in ev["memory_timeline"]]
    bands = chart["bands"]
    # the bands add up to the single line's live bytes at every op (baseline + what is alive)
    for i, (op_id, live) in enumerate(tl):
        assert sum(b["y"][i] for b in bands) == live, (op_id, live, [(b["name"], b["y"][i]) for b in bands])
    # the bottom band: what the step held before its first recorded op, less the bytes of it
    # freed outside any op since (the .grad tensors zero_grad() dropped before the backward)
    first = min(ev["ops"], key=lambda o: o["id"])
    base = first["live"] - first["alloc"] + first["free"]
    gone, untracked = 0, dict(untracked_frees(ev))
    expect = []
    for op_id, _ in tl:
        gone += untracked[op_id]
        expect.append(base - gone)
    assert bands[0]["name"].startswith(BASE) and bands[0]["y"] == expect, (bands[0], expect)
    # each group in one band; a band's bytes are its groups' alive storages
    by_op = bytes_by_band(ev)
    groups = {k for sums in by_op.values() for k in sums}
    keys = [k for b in bands[1:] for k in b["keys"]]
    assert sorted(keys) == sorted(groups), (keys, groups)
    peak_i = max(range(len(tl)), key=lambda i: (tl[i][1], -i))  # (the first of equal ones)
    n = len(tl)
    for i in sorted({peak_i, 0, n // 2, n - 1, (peak_i + n) // 2}):
        sums = by_op[tl[i][0]]
        for b in bands[1:]:
            assert b["y"][i] == sum(sums.get(k, 0) for k in b["keys"]), (tl[i][0], b["name"], b["y"][i], sums)
    # the named bands: at most MAX_BANDS, the largest by their own highest point
    top = {k: max(sums.get(k, 0) for sums in by_op.values()) for k in groups}
    named = [b for b in bands[1:] if not b["name"].startswith("other modules")]
    other = [b for b in bands[1:] if b["name"].startswith("other modules")]
    if other:
        assert len(named) == MAX_BANDS and len(other) == 1 and other == bands[-1:], [b["name"] for b in bands]
        assert min(top[b["keys"][0]] for b in named) >= max(top[k] for k in other[0]["keys"])
        assert other[0]["name"] == f"other modules ({len(other[0]['keys'])})"
    else:
        assert len(named) <= MAX_BANDS + 1
    for b in named:  # named after the module, as the view names it elsewhere
        (key,) = b["keys"]
        back = key.endswith(" (backward)")
        assert b["name"].endswith(" (backward)") == back, b
        what = key.removesuffix(" (backward)")
        if what in ("outside", "module:") and back:  # the backward's ops in no module: the graph's group of them
            assert b["name"].startswith("(outside modules)"), b
        elif what == "outside":
            assert b["name"].startswith("(outside the model)"), b
        elif what == "module:":  # the root's own forward
            assert b["name"].startswith("(root)"), b
        elif what.startswith("module:"):
            assert b["name"].startswith(what.removeprefix("module:")), b
        else:
            assert what == "optimizer" and b["name"] == "optimizer.step()", b
    return {"ev": ev, "peak_i": peak_i, "named": named, "other": other}


@pytest.mark.parametrize("run", list(RUNS))
def test_the_bands_are_the_files_allocations_by_module(page: Any, srv: ServerProc, runs: dict[str, tuple[str, Path]],
                                                       run: str) -> None:
    sid, path = runs[run]
    open_session(page, srv.url, sid, "?view=memory")
    page.wait_for_function("(window.__torchscope.state().memory?.timeline || 0) > 0")
    before = page.evaluate(CHART)
    # the single line first, as ever: the live bytes
    assert before["by"] == "total" and not before["byHidden"] and not before["stacked"]
    assert [b["y"] for b in before["bands"]] == [[p[1] for p in before["tl"]]]
    chart = switch_to_modules(page)
    assert "timeline=module" in page.url, page.url
    got = check_bands(chart, path)
    if run == "mlp-full":  # the backward's gradients and temporaries in their modules' backward bands
        assert any(b["name"].endswith(" (backward)") for b in got["named"]), [b["name"] for b in got["named"]]
    if run == "transformer-default":  # more modules than bands
        assert got["other"], [b["name"] for b in chart["bands"]]
    page.locator("[data-testid=in-step-timeline]").scroll_into_view_if_needed()
    shot(page, f"memory-by-module-{run}")
    # the URL keeps the choice
    page.reload()
    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    page.wait_for_function("window.__torchscope.app.views.memory?.obj.timeline.opts.stacked === true")
    again = page.evaluate(CHART)
    assert again["by"] == "module" and again["bands"] == chart["bands"]
    # and back: one line, out of the URL
    page.locator("[data-testid=timeline-by]").select_option("total")
    page.wait_for_function("window.__torchscope.app.views.memory.obj.timeline.opts.stacked === false")
    assert "timeline=" not in page.url and len(page.evaluate(CHART)["bands"]) == 1


@pytest.mark.parametrize("run", ["mlp-full", "cnn-full"])
def test_a_step_whose_old_gradients_zero_grad_freed_after_the_forward(page: Any, srv: ServerProc,
                                                                       runs: dict[str, tuple[str, Path]], run: str) -> None:
    """The examples' loops are in PyTorch's tutorial order (forward, loss, zero_grad(), backward):
    from step 1 on, the step before's .grad tensors die between the forward and the backward,
    outside any op.  The bottom band drops by their bytes there, the bands still add up to the
    live bytes, and the summary under the peak says what of the step's start was still held
    (QA 41a: they were counted on through the backward, beside the new ones)."""
    sid, path = runs[run]
    open_session(page, srv.url, sid, "?view=memory&timeline=module")
    page.wait_for_function("window.__torchscope.app.views.memory?.obj.timeline.opts.stacked === true")
    page.locator("[data-testid=memory-step]").select_option("1")
    page.wait_for_function("window.__torchscope.app.views.memory.obj.graph?.step === 1")
    chart = page.evaluate(CHART)
    assert chart["step"] == 1
    check_bands(chart, path)
    ev = dict(load(path).graph(1))
    grads = sum(n for _, n in untracked_frees(ev))
    params = sum(int(p["nbytes"]) for p in load(path).meta["params"])
    assert grads == params, (grads, params)  # every float32 .grad of the step before, once
    base = chart["bands"][0]["y"]
    assert base[0] - base[-1] == grads and len(set(base)) == 2, set(base)
    summary = page.locator("[data-testid=alive-summary]").inner_text()
    peak_i = max(range(len(chart["tl"])), key=lambda i: (chart["tl"][i][1], -i))
    if base[peak_i] < base[0]:  # a peak in the backward, after they died (the CNN's): what of the start was left
        assert summary.startswith(f"{fmt_bytes(base[peak_i])} of what the step held when its recording began"), summary
        assert f"{fmt_bytes(base[0])}, less {fmt_bytes(grads)} of .grad freed before the backward by zero_grad()" in summary
    else:  # (the MLP's: its forward, with the old gradients still held, is the higher)
        assert run == "mlp-full"
        assert summary.startswith(f"{fmt_bytes(base[0])} held when the step's recording began"), summary
    # a backward op in no module (an AccumulateGrad's detach) is named as the Graph view's group
    # of them, "(outside modules)" (QA 41a: the memory view read "(outside the model)" or "(root)")
    ops = {o["id"]: o for o in ev["ops"]}
    i = next(i for i, (op_id, _) in enumerate(chart["tl"]) if ops[op_id]["phase"] == "backward"
             and not ops[op_id].get("module") and ops[op_id]["name"] == "aten::detach")
    label = page.evaluate(f"window.__torchscope.app.views.memory.obj.opLabel({i})")
    assert label.endswith(" · (outside modules) · backward"), label


def test_hovering_shows_the_op_and_each_bands_bytes(page: Any, srv: ServerProc, runs: dict[str, tuple[str, Path]]) -> None:
    sid, path = runs["mlp-full"]
    open_session(page, srv.url, sid, "?view=memory&timeline=module")
    page.wait_for_function("window.__torchscope.app.views.memory?.obj.timeline.opts.stacked === true")
    chart = page.evaluate(CHART)
    i = max(range(len(chart["tl"])), key=lambda k: (chart["tl"][k][1], -k))
    g = page.evaluate("window.__torchscope.app.views.memory.obj.timeline.geom")
    x = g["L"] + (i - g["xmin"]) / (g["xmax"] - g["xmin"]) * g["pw"]
    timeline = page.locator("[data-testid=in-step-timeline]")

    def tip_at() -> list[str]:
        timeline.locator("canvas").hover(position={"x": x, "y": g["T"] + g["ph"] / 2})
        tip = timeline.locator(".chart-tip")
        tip.wait_for(state="visible")
        return tip.inner_text().splitlines()

    lines = tip_at()
    assert lines[0].startswith(f"#{chart['tl'][i][0]} "), lines
    # the bands holding bytes there, top first as drawn, then their sum: the single line's live bytes
    held = [b["name"] for b in reversed(chart["bands"]) if b["y"][i]]
    assert [ln.rsplit(": ", 1)[0] for ln in lines[1:-1]] == held and len(held) < len(chart["bands"]), (lines, chart["bands"])
    assert lines[-1].startswith("total: "), lines
    page.locator("[data-testid=timeline-by]").select_option("total")
    page.wait_for_function("window.__torchscope.app.views.memory.obj.timeline.opts.stacked === false")
    line = tip_at()
    assert line[0] == lines[0] and len(line) == 2 and line[1].rsplit(": ", 1)[1] == lines[-1].removeprefix("total: "), (line, lines)


def test_a_file_from_before_the_frees_keeps_the_single_line(page: Any, srv: ServerProc, runs: dict[str, tuple[str, Path]],
                                                          tmp_path: Path) -> None:
    """The MLP's default run replayed as a format 1.8 file (no OpRecord.freed): nothing says
    what is alive, so no "by module" menu and one line, even when the URL asks for the bands."""
    from torchscope.transport import Transport

    _, path = runs["mlp-default"]
    sid = f"old-bymodule-{int(time.time() * 1000)}"
    t = Transport(str(tmp_path / "old.tscope"), sid, rank=0, server=srv.url)
    end = None
    for e in load(path).events():
        if e["kind"] == "session":
            e = {**e, "schema": [1, 8], "session_id": sid, "name": "before 1.9"}
        elif e["kind"] == "graph":
            e = {**e, "ops": [{k: v for k, v in o.items() if k != "freed"} for o in e["ops"]]}
        elif e["kind"] == "end":
            end = e
            continue
        t.emit(e)
    t.close(end)
    session_id(srv, "before 1.9", "finished")
    open_session(page, srv.url, sid, "?view=memory&timeline=module")
    page.wait_for_function("(window.__torchscope.state().memory?.timeline || 0) > 0")
    chart = page.evaluate(CHART)
    assert chart["byHidden"] and not chart["stacked"], chart["by"]
    assert [b["y"] for b in chart["bands"]] == [[p[1] for p in chart["tl"]]]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_the_tensors_alive_at_the_peak_are_the_files(page: Any, srv: ServerProc, runs: dict[str, tuple[str, Path]],
                                                     mode: str) -> None:
    """The table under the timeline, "what was alive then" (memory_viz's question): the tensors
    made in the step and not yet freed at its peak, each with the op that freed it after."""
    sid, path = runs[f"mlp-{mode}"]
    open_session(page, srv.url, sid, "?view=memory")
    page.wait_for_function("(window.__torchscope.state().memory?.timeline || 0) > 0")
    table = page.locator("[data-testid=alive-at-peak]")
    table.wait_for()
    step = int(page.evaluate("window.__torchscope.app.views.memory.obj.stepSel.value"))
    ev = dict(load(path).graph(step))
    timeline = ev["memory_timeline"]
    peak_live = max(live for _, live in timeline)
    peak_op = next(op for op, live in timeline if live == peak_live)  # (the first of equal ones, as the view)
    alive = dict(alive_after_each_op(ev))[peak_op]
    assert alive, "nothing made in the step alive at its peak"
    heading = page.locator(".top-allocs h3").inner_text()
    assert heading.startswith("In-step peak") and f"after op #{peak_op} " in heading, heading
    # the rows: the largest of them, by storage, in bytes order
    rows = page.evaluate("""() => [...document.querySelectorAll('[data-testid=alive-at-peak] tr[data-sid]')]
      .map((r) => [+r.dataset.sid, r.cells[0].innerText, r.cells[6].innerText])""")
    # a tensor backward() made says so in its module cell, as the by-module bands do: a weight's
    # gradient read as its forward module's tensor (QA 50b)
    made = page.evaluate("""() => [...document.querySelectorAll('[data-testid=alive-at-peak] tr[data-sid]')]
      .map((r) => [+r.cells[1].innerText.slice(1).split(" ")[0], r.cells[2].innerText])""")
    phase = {o["id"]: o.get("phase", "forward") for o in ev["ops"]}
    assert all(where.endswith(" (backward)") == (phase[op] == "backward") for op, where in made), made
    if mode == "full":
        assert any(phase[op] == "backward" for op, _ in made), made
    shown = [sid_ for sid_, _, _ in rows]
    assert set(shown) <= set(alive) and len(shown) == min(15, len(alive)), (shown, alive)
    assert [alive[s] for s in shown] == sorted((alive[s] for s in shown), reverse=True)
    assert sorted(alive.values(), reverse=True)[: len(shown)] == [alive[s] for s in shown]
    # each row's "until": the op that freed it after the peak (by the file), or still alive
    ops = sorted(ev["ops"], key=lambda o: o["id"])
    for s, _, until in rows:
        freed_by = next((o for o in ops if o["id"] > peak_op and s in o.get("freed", [])), None)
        if freed_by is None:
            assert until == "still alive after the last recorded op", (s, until)
        else:
            assert until.startswith(f"freed in #{freed_by['id']} {freed_by['name']}"), (s, until, freed_by["id"])
    summary = page.locator("[data-testid=alive-summary]").inner_text()
    n = len(alive)
    assert f"in {n} tensor{'s' if n != 1 else ''} made in the step" in summary, (summary, n)
    if mode == "full":  # the backward frees the forward's saved activations: some row says by which op
        assert any(u.startswith("freed in #") for _, _, u in rows) or len(rows) == 0
