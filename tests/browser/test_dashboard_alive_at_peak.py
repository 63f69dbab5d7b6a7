"""The Memory view's "what was alive at the in-step peak" (memory_viz's question): the tensors
made in the captured step and not yet freed when its live bytes peaked, each with the op that
made it and the op that freed it -- checked against the recorded file's frees (OpRecord.freed,
format 1.9) for the example MLP in default and full mode (full: forward, backward and the
optimizer's ops)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked_page, open_session, session_id
from conftest import EXAMPLES, ServerProc, alive_after_each_op

from torchscope.session import load

playwright_sync = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("alive-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path]]:
    d = tmp_path_factory.mktemp("alive-runs")
    out = {}
    for mode in ("default", "full"):
        path = d / f"mlp-{mode}.tscope"
        run = subprocess.run([sys.executable, str(EXAMPLES / "mlp.py"), "--steps", "2", "--mode", mode, "--server", srv.url,
                              "--record", str(path)], capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        name = str(load(path).meta["name"])
        out[mode] = (session_id(srv, name, "finished"), path)
    return out


@pytest.fixture
def page() -> Iterator[Any]:
    with checked_page() as pg:
        yield pg


@pytest.mark.parametrize("mode", ["default", "full"])
def test_the_tensors_alive_at_the_peak_are_the_files(page: Any, srv: ServerProc, runs: dict[str, tuple[str, Path]],
                                                     mode: str) -> None:
    sid, path = runs[mode]
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
