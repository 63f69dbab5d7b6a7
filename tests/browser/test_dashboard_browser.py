"""The dashboard in a real headless Chromium against a real `torchscope serve`, with sessions
recorded by real training scripts (torchscope.watch in a subprocess).

One server, one browser and a few recorded sessions are shared by the module (browser tests
are the slow tier).  Screenshots of each view go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import forkrun
import pytest
from browser_page import chromium, contrast, open_session, shot
from conftest import EXAMPLES, ServerProc, http_json

playwright_sync = pytest.importorskip("playwright.sync_api")

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "dashboard_train.py"
HOSTILE = "<img src=x onerror=alert(1)><script>alert(2)</script>"


def sessions(srv: ServerProc) -> list[dict[str, Any]]:
    return srv.get("/api/sessions")  # type: ignore[return-value]


def session_named(srv: ServerProc, name: str) -> dict[str, Any]:
    return next(s for s in sessions(srv) if s["name"] == name)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("dash-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three real runs streamed to the server, plus a file-only run to import."""
    d = tmp_path_factory.mktemp("runs")
    procs = [
        [str(TRAIN), "--server", srv.url, "--record", str(d / "net.tscope"), "--steps", "5", "--name", "net <b>bold</b>"],
        [str(EXAMPLES / "mlp.py"), "--server", srv.url, "--record", str(d / "mlp.tscope"), "--steps", "4"],
        [str(EXAMPLES / "pitfalls" / "p01_no_grad_detach.py"), "--server", srv.url, "--record", str(d / "p01.tscope")],
        [str(TRAIN), "--server", srv.url, "--record", str(d / "amp.tscope"), "--steps", "2", "--name", "amp", "--autocast"],
        [str(TRAIN), "--record", str(d / "import-a.tscope"), "--steps", "2", "--name", "imported-a"],
        [str(TRAIN), "--record", str(d / "import-b.tscope"), "--steps", "2", "--name", "imported-b"],
        [str(TRAIN), "--server", srv.url, "--record", str(d / "probe.tscope"), "--steps", "3", "--name", "probe",
         "--probe"],
    ]
    # side by side: each is mostly `import torch`
    running = [forkrun.spawn([*p]) for p in procs]
    for p, args in zip(running, procs, strict=True):
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0, f"{args}: {out[-3000:]}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(sessions(srv)) < 5:
        time.sleep(0.2)
    return {"dir": d, "net": session_named(srv, "net <b>bold</b>"), "mlp": session_named(srv, "mlp"),
            "p01": session_named(srv, "p01_no_grad_detach"), "amp": session_named(srv, "amp"), "probe": session_named(srv, "probe")}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    pg.errors = []  # type: ignore[attr-defined]
    pg.dialogs = []  # type: ignore[attr-defined]
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    try:
        yield pg
    finally:
        assert pg.errors == [], f"JavaScript errors: {pg.errors}"
        assert pg.dialogs == [], f"unexpected dialogs (injected script ran?): {pg.dialogs}"
        ctx.close()


def open_dash(page: Any, srv: ServerProc, sid: str, query: str = "") -> dict[str, Any]:
    open_session(page, srv.url, sid, query)
    return state(page)


def state(page: Any) -> dict[str, Any]:
    return page.evaluate("window.__torchscope.state()")  # type: ignore[no-any-return]


def wait_graph(page: Any) -> dict[str, Any]:
    page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.nodes.length > 0; })()")
    return state(page)["graph"]


# ----------------------------------------------------------------------------- sessions page
def test_sessions_page_lists_runs_and_names_are_text(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    page.goto(srv.url + "/")
    page.wait_for_selector("a.session-link")
    links = page.locator("a.session-link").all_inner_texts()
    assert "net <b>bold</b>" in links and "mlp" in links and "p01_no_grad_detach" in links
    assert page.locator("main b").count() == 0  # the <b> in the name stayed text
    row = page.locator(f"tr[data-id='{runs['p01']['id']}']")
    assert "error" in row.inner_text()  # the doctor's P1 error badge
    assert row.locator(".badge.status-finished").inner_text() == "finished"
    shot(page, "sessions")


def test_import_by_file_picker_and_by_drop(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    page.goto(srv.url + "/")
    page.wait_for_selector("a.session-link")
    before = len(sessions(srv))
    page.set_input_files("[data-testid=file-input]", str(runs["dir"] / "import-a.tscope"))
    page.wait_for_selector("a.session-link:text-is('imported-a')")
    data = (runs["dir"] / "import-b.tscope").read_bytes()
    page.evaluate("""(bytes) => {
        const dt = new DataTransfer();
        dt.items.add(new File([new Uint8Array(bytes)], "import-b.tscope"));
        document.body.dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
    }""", list(data))
    page.wait_for_selector("a.session-link:text-is('imported-b')")
    assert len(sessions(srv)) == before + 2


def test_an_import_of_a_cut_file_says_what_was_left_out(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    """A file cut short (a copy that stopped early) imports what it holds, and the page says
    how many bytes were dropped: a file is never read short silently."""
    data = (runs["dir"] / "import-b.tscope").read_bytes()
    cut = runs["dir"] / "import-cut.tscope"
    cut.write_bytes(data[:-7])  # its last frame torn
    page.goto(srv.url + "/")
    page.wait_for_selector("a.session-link")
    page.set_input_files("[data-testid=file-input]", str(cut))
    page.wait_for_selector("#note a.imported")
    text = page.locator("#note").inner_text()
    assert "Note: import-cut.tscope is incomplete" in text and "bytes after its last whole frame were dropped" in text


# ----------------------------------------------------------------------------- graph
def test_graph_collapsed_then_expand_and_read_shapes(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    sid = runs["net"]["id"]
    open_dash(page, srv, sid)
    g = wait_graph(page)
    keys = {n["key"] for n in g["nodes"]}
    # collapsed by default to the top-level modules, forward and backward
    assert {"g:forward:embed", "g:forward:blocks", "g:forward:head", "g:backward:blocks"} <= keys
    assert not any(n["key"].startswith("g:forward:blocks.") for n in g["nodes"])
    shot(page, "graph-collapsed")

    page.evaluate("window.__torchscope.expand('blocks')")
    page.evaluate("window.__torchscope.expand('blocks.0')")
    g = state(page)["graph"]
    keys = {n["key"] for n in g["nodes"]}
    assert {"g:forward:blocks.0.norm", "g:forward:blocks.0.mlp", "g:forward:blocks.1"} <= keys
    assert "g:forward:blocks" not in keys  # now a frame, not a box

    # select the first Linear's addmm and read its shapes in the details panel
    graph = http_json(f"{srv.url}/api/sessions/{sid}/graph?step={g['step']}")
    addmm = next(o for o in graph["ops"] if o["name"] == "aten::addmm" and o["module"] == "blocks.0.mlp.0")
    out_shape = next(t["shape"] for t in graph["tensors"] if t["id"] == addmm["outputs"][0])
    page.evaluate(f"window.__torchscope.select('o{addmm['id']}')")
    details = page.locator("[data-testid=details]")
    details.locator("h3").wait_for()
    assert details.locator("h3").inner_text() == "aten::addmm"
    assert "blocks.0.mlp.0" in details.inner_text()
    shapes = details.locator("td.shape").all_inner_texts()
    assert "[" + ", ".join(map(str, out_shape)) + "]" in shapes
    # the grad_fn it created, a link to that node (the capture links node -> op; the panel
    # read a field of the op that no recorder writes, so it never showed: QA 36b)
    made = next(n for n in graph["nodes"] if n.get("op") == addmm["id"])
    details.locator("a.nodelink", has_text=made["name"]).click()
    page.wait_for_function(f"window.__torchscope.state().graph.selected === 'n{made['id']}'")
    page.evaluate(f"window.__torchscope.select('o{addmm['id']}')")
    g = state(page)["graph"]
    assert g["selected"] == f"o{addmm['id']}"
    assert "forward:blocks.0.mlp" in g["expanded"]  # selecting a hidden op expanded its module
    assert f"node=o{addmm['id']}" in state(page)["url"]
    shot(page, "graph-expanded-details")


def expanded_graph(page: Any, srv: ServerProc, sid: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The drawn graph with every module expanded, and the captured graph event of its step."""
    open_dash(page, srv, sid)
    wait_graph(page)
    page.evaluate("window.__torchscope.expandAll()")
    g = state(page)["graph"]
    return g, http_json(f"{srv.url}/api/sessions/{sid}/graph?step={g['step']}")


def test_graph_nodes_match_the_captured_graph(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    g, graph = expanded_graph(page, srv, runs["mlp"]["id"])
    drawn = {n["key"] for n in g["nodes"] if not n["group"]}
    assert drawn == {f"o{o['id']}" for o in graph["ops"]} | {f"n{n['id']}" for n in graph["nodes"]}
    labels = {n["label"] for n in g["nodes"]}
    assert {"addmm", "AddmmBackward0", "AccumulateGrad"} <= labels
    subs = " ".join(n["sub"] for n in g["nodes"])
    assert "[64, 64]" in subs  # shapes on the nodes


def test_autocast_casts_are_labelled(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    """A forward under autocast: the casts autocast inserted are named so in the graph (M7)."""
    g, graph = expanded_graph(page, srv, runs["amp"]["id"])
    marked = {f"n{n['id']}" for n in graph["nodes"] if n.get("autocast_cast")}
    casts = [n for n in g["nodes"] if n["label"] == "ToCopyBackward0 (autocast cast)"]
    assert marked and {n["key"] for n in casts} == marked
    page.evaluate(f"window.__torchscope.select({json.dumps(casts[0]['key'])})")
    details = page.locator("[data-testid=details]")
    assert "a dtype cast autocast inserted" in details.inner_text()
    shot(page, "autocast-cast")


def test_overlays_recolour_with_legend(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    open_dash(page, srv, runs["net"]["id"])
    wait_graph(page)
    page.evaluate("window.__torchscope.expandAll()")
    before = {n["key"]: n["color"] for n in state(page)["graph"]["nodes"]}
    for overlay, legend_word in [("time", "time"), ("memory", "memory"), ("grad", "‖grad‖"), ("dtype", "float32")]:
        page.select_option("[data-testid=overlay]", overlay)
        page.wait_for_function(f"window.__torchscope.state().graph.overlay === '{overlay}'")
        assert legend_word in page.locator("[data-testid=legend]").inner_text()
        after = {n["key"]: n["color"] for n in state(page)["graph"]["nodes"]}
        assert after != before, overlay
        if overlay == "grad":  # AccumulateGrad nodes carry the parameter's gradient norm
            acc = [n for n in state(page)["graph"]["nodes"] if n["label"] == "AccumulateGrad"]
            assert acc and len({n["color"] for n in acc}) > 1
            shot(page, "graph-overlay-grad")
    assert "overlay=dtype" in state(page)["url"]


def test_step_scrubber_and_search_and_keyboard(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    sid = runs["net"]["id"]
    captured = sorted({g["step"] for g in http_json(f"{srv.url}/api/sessions/{sid}/graphs")})
    assert len(captured) >= 2  # sample_every=2 over 5 steps
    open_dash(page, srv, sid)
    wait_graph(page)
    page.evaluate("window.__torchscope.expand('blocks')")
    page.click("button[title^='next captured step']")
    page.wait_for_function(f"window.__torchscope.state().graph.step === {captured[1]}")
    g = state(page)["graph"]
    assert "forward:blocks" in g["expanded"]  # expansion survives the step change
    assert f"step={captured[1]}" in state(page)["url"]
    page.fill("[data-testid=search]", "layer_norm")
    page.press("[data-testid=search]", "Enter")
    page.wait_for_function("(window.__torchscope.state().graph.selected || '').startsWith('o')")
    assert "layer_norm" in page.locator("[data-testid=details] h3").inner_text()
    page.focus("canvas[aria-label^='computation graph']")
    first = state(page)["graph"]["selected"]
    page.keyboard.press("n")
    page.wait_for_function(f"window.__torchscope.state().graph.selected !== '{first}'")
    # the keyboard alone reaches a collapsed module and opens it: n/p visit its box, Enter expands
    before = set(state(page)["graph"]["expanded"])
    for _ in range(len(state(page)["graph"]["nodes"]) + 1):
        if (state(page)["graph"]["selected"] or "").startswith("g:"):
            break
        page.keyboard.press("n")
    box = state(page)["graph"]["selected"]
    assert box.startswith("g:"), "n never reached a collapsed module"
    page.keyboard.press("Enter")
    page.wait_for_function(f"window.__torchscope.state().graph.expanded.length > {len(before)}")
    assert box[2:] in state(page)["graph"]["expanded"]


def test_diff_of_two_steps(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    captured = [g["step"] for g in http_json(f"{srv.url}/api/sessions/{runs['net']['id']}/graphs")]
    assert len(captured) >= 3
    open_dash(page, srv, runs["net"]["id"], f"?overlay=diff&step={captured[-1]}")
    wait_graph(page)
    page.wait_for_function("document.querySelector('[data-testid=legend]').innerText.includes('added')")
    # the same model every step: nothing added or removed
    legend = page.locator("[data-testid=legend]").inner_text()
    assert "0 added, 0 changed, 0 removed" in legend
    # against another captured step (sample_every=2: 0, 2, 4), not the shown one itself
    shown = int(parse_qs(urlparse(state(page)["url"]).query)["step"][0])
    other = int(re.search(r"vs step (\d+)", legend).group(1))  # type: ignore[union-attr]
    at = captured.index(shown)
    assert other == (captured[at - 1] if at > 0 else captured[1])  # the captured step before it


def test_deep_link_opens_view_step_and_node(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    sid = runs["mlp"]["id"]
    open_dash(page, srv, sid, "?view=graph&step=0&node=o1")
    page.wait_for_function("window.__torchscope.state().graph && window.__torchscope.state().graph.selected === 'o1'")
    page.locator("[data-testid=details] h3").wait_for()
    assert page.locator("[data-testid=details] h3").inner_text().startswith("aten::")


def test_a_link_to_an_unknown_view_says_which_views_there_are(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    """``?view=grads`` (the view is "gradients") showed the graph and said nothing (QA 49b)."""
    sid = runs["mlp"]["id"]
    open_dash(page, srv, sid, "?view=grads")
    note = page.locator("#unknown-view")
    note.wait_for()
    assert note.inner_text().startswith('There is no view "grads" (the views are graph (Graph), memory (Memory), '
                                        "gradients (Loss & gradients)"), note.inner_text()
    assert note.inner_text().endswith(": showing the graph.")
    page.wait_for_function("window.__torchscope.state().view === 'graph'")
    page.locator("#tabs button[data-view=gradients]").click()  # a tab chosen: the note has done its job
    note.wait_for(state="detached")
    open_dash(page, srv, sid, "?view=doctor")  # an alias is a view
    page.wait_for_function("window.__torchscope.state().view === 'diagnostics'")
    assert page.locator("#unknown-view").count() == 0


# ----------------------------------------------------------------------------- memory, gradients, ranks
def test_memory_view_and_click_through_to_the_op(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    sid = runs["mlp"]["id"]
    open_dash(page, srv, sid, "?view=memory")
    page.wait_for_function("(() => { const m = window.__torchscope.state().memory; return m && m.timeline > 0; })()")
    m = state(page)["memory"]
    assert m["steps"] == 4
    assert "what was alive then" in page.locator(".top-allocs").inner_text()
    shot(page, "memory")
    canvases = page.locator(".view-memory > .chart canvas")  # not the graphs-alive chart's
    box = canvases.nth(1).bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.5)
    page.wait_for_function("window.__torchscope.state().view === 'graph' && (window.__torchscope.state().graph?.selected || '').startsWith('o')")
    assert page.locator("[data-testid=details] h3").inner_text().startswith("aten::")


def test_memory_view_shows_graphs_kept_alive(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """P7's finding opens the Memory view: a graph kept across steps shows there as its count
    of autograd nodes still alive, and what it holds saved for backward as a byte category
    of its own; a run without one has neither.  So do P13's bytes kept by forward hooks."""
    from torchscope.transport import Transport

    for name, alive in (("kept", [0, 12, 24, 36]), ("clean", [0, 0, 0, 0])):
        sid = f"{name}-{int(time.time() * 1000)}"
        t = Transport(str(tmp_path / f"{name}.tscope"), sid, rank=0, server=srv.url)
        t.emit({"kind": "session", "schema": [1, 0], "session_id": sid, "name": name, "started_at": time.time(),
                "rank": 0, "world_size": 1, "model": "Net", "modules": [], "params": []})
        for s, n in enumerate(alive):
            t.emit({"kind": "step", "step": s, "rank": 0, "t": time.time(), "duration_us": 1000,
                    "graphs_alive": n, "hooks": {"1": 1024 * n} if n else {},
                    "memory": {"live": 1000, "params": 600, **({"kept": 512 * n} if n else {})}})
        t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": len(alive)})
        open_dash(page, srv, sid, "?view=memory&step=2")
        page.wait_for_function("(() => { const m = window.__torchscope.state().memory; return m && m.steps >= 4; })()")
        shown = state(page)["memory"]["graphsAlive"]
        assert shown == (36 if name == "kept" else None)
        assert page.locator("[data-testid=graphs-alive]").is_visible() == (name == "kept")
        assert state(page)["memory"]["hookBytes"] == (36 * 1024 if name == "kept" else None)
        assert page.locator("[data-testid=hook-bytes]").is_visible() == (name == "kept")
        kept = "saved by earlier steps' graphs still alive (P7)"
        assert (kept in state(page)["memory"]["categories"]) == (name == "kept")


def test_gradients_and_ranks_views(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    open_dash(page, srv, runs["p01"]["id"], "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps > 0; })()")
    g = state(page)["gradients"]
    assert "encoder.0" in g["modules"] and "head" in g["modules"]
    assert "encoder.0.weight" in g["noGrad"]  # P1: the detached encoder never gets .grad
    shot(page, "gradients")
    page.click("button[data-view=ranks]")
    page.wait_for_selector(".view-ranks .chart-legend span:text-is('rank 0')")
    shot(page, "ranks")


def test_parameters_no_optimizer_trains_are_shown_apart(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    """A linear probe's frozen layer (no_grad, in no param group) has no gradient by design:
    the gradients view lists it as not trained, not as missing, and the graph marks it so."""
    sid = runs["probe"]["id"]
    g = http_json(f"{srv.url}/api/sessions/{sid}/grads")
    embed = [g["params"].index("embed.weight"), g["params"].index("embed.bias")]
    assert all(sorted(nt) == embed for nt in g["not_trained"]) and all(sorted(n) == embed for n in g["none"])
    open_dash(page, srv, sid, "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps > 0; })()")
    st = state(page)["gradients"]
    assert "Every trained parameter received a gradient" in st["noGrad"]
    assert "embed.weight" in st["notTrained"] and "embed.bias" in st["notTrained"]
    open_dash(page, srv, sid, "?view=graph&step=0")
    page.wait_for_selector("[data-testid=not-trained]")
    assert "2 param(s) not trained" in page.locator("[data-testid=not-trained]").inner_text()
    assert page.locator("[data-testid=cut-params]").count() == 0
    assert "P1" not in {f["code"] for f in http_json(f"{srv.url}/api/sessions/{sid}/diagnostics")}


def test_a_step_whose_backward_failed_says_so_in_the_graph(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """P8's reproducer catches the failed backward and goes on: that step's graph holds two
    forwards, and the view says why (a badge with the error, a line under the toolbar)."""
    path = tmp_path / "p08.tscope"
    run = forkrun.run([str(EXAMPLES / "pitfalls" / "p08_inplace_modification.py"),
                       "--server", srv.url, "--record", str(path)], timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    from torchscope import load

    session = load(path)
    failed = {st["step"] for st in session.steps if st.get("backward_errors")}
    both = sorted(failed & set(session.graph_steps))
    clean = sorted(set(session.graph_steps) - failed)
    assert both and clean
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and http_json(f"{srv.url}/api/sessions/{session.session_id}")["status"] == "running":
        time.sleep(0.2)
    open_dash(page, srv, session.session_id, f"?view=graph&step={both[0]}")
    wait_graph(page)
    badge = page.locator("[data-testid=backward-errors]")
    badge.wait_for()
    assert "backward() failed once in this step" in badge.inner_text()
    assert "modified by an inplace operation" in (badge.get_attribute("title") or "")
    assert "the one whose backward failed" in page.locator(".graph-status").inner_text()
    open_dash(page, srv, session.session_id, f"?view=graph&step={clean[0]}")
    wait_graph(page)
    assert page.locator("[data-testid=backward-errors]").count() == 0
    assert "backward() raised" not in page.locator(".graph-status").inner_text()


_LONG_STEP = """
import sys, torch, torchscope
from torch import nn

class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        for _ in range(200):
            h = h * 1.0
        return h

model = Chain()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with torchscope.watch(model, opt, server=sys.argv[1], record=sys.argv[2], mode="full", max_ops=300):
    for _ in range(2):
        opt.zero_grad()
        model(torch.ones(2, 4)).pow(2).mean().backward()
        opt.step()
"""


def test_a_step_past_max_ops_says_its_graph_is_partial(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """A step's graph past max_ops holds its first ops: the line under the toolbar says how many
    the step ran, how many the graph holds and how to record more -- not "back-pressure"."""
    script, path = tmp_path / "long_step.py", tmp_path / "long.tscope"
    script.write_text(_LONG_STEP)
    run = forkrun.run([str(script), srv.url, str(path)], timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    from torchscope import load

    session = load(path)
    graph = session.graph(0)
    ran = len(graph["ops"]) + graph["shed_ops"]
    assert len(graph["ops"]) == 300 and graph["shed_ops"] > 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and http_json(f"{srv.url}/api/sessions/{session.session_id}")["status"] == "running":
        time.sleep(0.2)
    open_dash(page, srv, session.session_id, "?view=graph&step=0")
    wait_graph(page)
    line = page.locator(".graph-status").inner_text()
    assert f"this step ran {ran:,} ops and its graph holds the first 300" in line, line
    assert "max_ops" in line and "back-pressure" not in line


# ----------------------------------------------------------------------------- doctor
def test_diagnostics_click_highlights_the_cut(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    sid = runs["p01"]["id"]
    findings = http_json(f"{srv.url}/api/sessions/{sid}/diagnostics")
    p1 = next(f for f in findings if f["code"] == "P1")
    open_dash(page, srv, sid, "?view=doctor")  # the tab's name works as well as "diagnostics"
    page.wait_for_selector("button.finding[data-code=P1]")
    assert p1["message"] in page.locator("button.finding[data-code=P1]").inner_text()
    shot(page, "doctor")
    page.click("button.finding[data-code=P1]")
    page.wait_for_function("window.__torchscope.state().view === 'graph' && window.__torchscope.state().graph.nodes.some(n => n.hi)")
    g = state(page)["graph"]
    hi = {n["key"] for n in g["nodes"] if n["hi"]}
    op_targets = {f"o{t['op']}" for t in p1["targets"] if "op" in t}
    assert op_targets and op_targets <= hi  # the op where the path breaks
    assert any(k.startswith("g:forward:encoder") or k.startswith("o") for k in hi - op_targets)  # the cut parameters' uses
    assert "param(s) got no gradient" in page.locator("[data-testid=cut-params]").inner_text()
    shot(page, "doctor-highlight")


UNUSED_LAYER = """
import sys, torch, torchscope
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.pooler, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x):  # the pooler is never called
        return self.head(torch.relu(self.body(x)))

torch.manual_seed(0)
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
torchscope.watch(net, opt, server=sys.argv[1], record=sys.argv[2], name="unused-pooler")
for _ in range(2):
    opt.zero_grad()
    nn.functional.cross_entropy(net(torch.randn(4, 8)), torch.tensor([0, 1, 2, 0])).backward()
    opt.step()
"""


def test_the_no_gradient_badge_names_parameters_no_op_used(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """A layer the forward never calls: its parameters got no gradient and no op of the step
    uses them, so the badge's click has nothing to light up -- it says so, by name, beside the
    badge (QA 41a: the click did nothing visible; the names were only in its tooltip)."""
    script, path = tmp_path / "unused.py", tmp_path / "unused.tscope"
    script.write_text(UNUSED_LAYER)
    run = forkrun.run([str(script), srv.url, str(path)], timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    sid = next(s["id"] for s in http_json(f"{srv.url}/api/sessions") if s["name"] == "unused-pooler")
    open_dash(page, srv, sid, "?view=graph&step=0")
    wait_graph(page)
    badge = page.locator("[data-testid=cut-params]")
    assert badge.inner_text() == "2 param(s) got no gradient"
    assert page.locator("[data-testid=cut-unused]").count() == 0
    badge.click()
    note = page.locator("[data-testid=cut-unused]")
    note.wait_for()
    assert note.inner_text() == "pooler.weight, pooler.bias: no op of this step used them (their module never ran in the forward)"
    badge.click()  # again: one note, not two
    assert page.locator("[data-testid=cut-unused]").count() == 1


# ----------------------------------------------------------------------------- hostile names, live
def test_hostile_module_names_render_as_text(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    open_dash(page, srv, runs["net"]["id"])
    g = wait_graph(page)
    assert any(n["label"].startswith(HOSTILE) for n in g["nodes"])
    page.evaluate(f"window.__torchscope.select({json.dumps('g:forward:' + HOSTILE)})")
    details = page.locator("[data-testid=details]")
    assert details.locator("h3").inner_text() == HOSTILE
    assert page.locator("img").count() == 0 and page.locator("body script").count() == 0
    assert page.locator("#session-title").inner_text() == "net <b>bold</b>"
    page.click("button[data-view=gradients]")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps > 0; })()")
    assert HOSTILE in state(page)["gradients"]["modules"]
    shot(page, "hostile-names")


def test_live_run_adds_steps_without_losing_the_view(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    proc = forkrun.spawn([str(TRAIN), "--server", srv.url, "--record", str(tmp_path / "live.tscope"),
                          "--steps", "40", "--sleep", "0.25", "--name", "live-run"])
    try:
        deadline = time.monotonic() + 120
        sess = None
        while time.monotonic() < deadline and sess is None:
            sess = next((s for s in sessions(srv) if s["name"] == "live-run" and s["steps"] >= 1), None)
            time.sleep(0.2)
        assert sess is not None, "the live session never appeared"
        open_dash(page, srv, sess["id"])
        wait_graph(page)
        page.evaluate("window.__torchscope.expand('blocks')")
        page.evaluate("window.__torchscope.select('g:forward:blocks.1')")
        zoom = page.evaluate("(() => { const c = window.__torchscope.app.views.graph.obj.canvas; c.zoomAt(300, 300, 1.5); return [c.scale, c.tx, c.ty]; })()")
        captured0 = len(state(page)["graph"]["captured"])
        sub0 = page.locator("#session-sub").inner_text()
        page.wait_for_function(f"window.__torchscope.state().graph.captured.length > {captured0}", timeout=60_000)
        page.wait_for_function(f"document.querySelector('#session-sub').innerText !== {json.dumps(sub0)}", timeout=30_000)
        g = state(page)["graph"]
        assert g["selected"] == "g:forward:blocks.1" and "forward:blocks" in g["expanded"]
        assert page.evaluate("(() => { const c = window.__torchscope.app.views.graph.obj.canvas; return [c.scale, c.tx, c.ty]; })()") == zoom
        shot(page, "live")
    finally:
        proc.wait(timeout=120)
    assert proc.returncode == 0


def test_views_refresh_while_a_fast_run_streams(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """A run that steps faster than the views' refresh delay: the header and the memory view
    update while it streams, not only once it pauses (a debounce, reset by every live event,
    never fired: the page stayed at the steps it had when opened)."""
    from torchscope.transport import Transport

    sid = f"fast-{int(time.time() * 1000)}"
    t = Transport(str(tmp_path / "fast.tscope"), sid, rank=0, server=srv.url)
    t.emit({"kind": "session", "schema": [1, 0], "session_id": sid, "name": "fast run", "started_at": time.time(),
            "rank": 0, "world_size": 1, "model": "Net", "modules": [], "params": []})

    def step(s: int) -> None:
        t.emit({"kind": "step", "step": s, "rank": 0, "t": time.time(), "duration_us": 40_000,
                "memory": {"live": 1_000_000 + 1_000 * s, "peak": 2_000_000}})

    for s in range(5):
        step(s)
    t.flush(timeout=30)
    open_dash(page, srv, sid, "?view=memory")
    page.wait_for_function("window.__torchscope.state().memory?.steps >= 5")
    seen: list[tuple[int, str]] = []
    s = 5
    end = time.monotonic() + 6
    while time.monotonic() < end:  # a step every 25 ms, flushed every 0.25 s: a live burst 4 times a second
        step(s)
        s += 1
        time.sleep(0.025)
        if s % 20 == 0:
            seen.append((state(page)["memory"]["steps"], page.locator("#session-sub").inner_text()))
    t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": s})
    during = seen[len(seen) // 2:]  # the second half of the stream, still streaming
    assert max(n for n, _ in during) > 40, seen
    assert any(sub != "Net · 5 steps" and "steps" in sub for _, sub in during), seen


def test_gradients_view_picks_parameters_with_a_gradient_and_keeps_the_users_choice(
        page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """The first three parameters preselected are ones with a norm to draw (not one that never
    got a gradient), and a choice the user made survives the live reloads of a streaming run."""
    from torchscope.transport import Transport

    sid = f"pick-{int(time.time() * 1000)}"
    names = ["side.weight", "enc.weight", "enc.bias", "head.weight", "head.bias"]
    t = Transport(str(tmp_path / "pick.tscope"), sid, rank=0, server=srv.url)
    t.emit({"kind": "session", "schema": [1, 0], "session_id": sid, "name": "pick", "started_at": time.time(),
            "rank": 0, "world_size": 1, "model": "Net", "modules": [],
            "params": [{"name": n, "module": n.rsplit(".", 1)[0], "shape": [2], "numel": 2, "requires_grad": True}
                       for n in names]})

    def step(s: int) -> None:
        t.emit({"kind": "step", "step": s, "rank": 0, "t": time.time(), "duration_us": 1000,
                "grads": {"norm": [None, 1.0, 0.5, 0.25 + s, 0.1], "nan": [0] * 5, "inf": [0] * 5, "none": [0]}})

    for s in range(3):
        step(s)
    t.flush(timeout=30)
    open_dash(page, srv, sid, "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps >= 3; })()")
    assert state(page)["gradients"]["chosen"] == ["enc.weight", "enc.bias", "head.weight"]
    page.select_option("[data-testid=param-pick]", ["head.bias"])
    for s in range(3, 8):
        step(s)
    t.flush(timeout=30)
    page.wait_for_function("(() => window.__torchscope.state().gradients.steps >= 8)()")
    assert state(page)["gradients"]["chosen"] == ["head.bias"]
    t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": 8})
    # a finding's link (the Doctor's P3/P4/P5 open this view so): its step marked, its
    # parameters the ones plotted -- names the session does not have are ignored
    open_dash(page, srv, sid, "?view=gradients&step=5&params=head.weight,enc.bias,gone.weight")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps >= 8; })()")
    g = state(page)["gradients"]
    assert g["chosen"] == ["enc.bias", "head.weight"] and g["focus"] == 5


def _grads_run(srv: ServerProc, tmp_path: Path, name: str, params: list[str], norms: list[float], steps: int) -> str:
    """A finished run streamed to the server with gradient norms only: ``norms`` (one per
    parameter) on every step.  Returns its session id."""
    from torchscope.transport import Transport

    sid = f"{name}-{int(time.time() * 1000)}"
    t = Transport(str(tmp_path / f"{name}.tscope"), sid, rank=0, server=srv.url)
    t.emit({"kind": "session", "schema": [1, 0], "session_id": sid, "name": name, "started_at": time.time(),
            "rank": 0, "world_size": 1, "model": "Net", "modules": [],
            "params": [{"name": n, "module": n.rsplit(".", 1)[0], "shape": [2], "numel": 2, "requires_grad": True}
                       for n in params]})
    for s in range(steps):
        t.emit({"kind": "step", "step": s, "rank": 0, "t": time.time(), "duration_us": 1000,
                "grads": {"norm": norms, "nan": [0] * len(params), "inf": [0] * len(params), "none": []}})
    t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": steps})
    return sid


def test_a_finding_about_many_parameters_plots_a_few(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """A dead branch of 40 parameters (P2): its finding lists the first few and counts the rest
    (all of them on hover), and its link plots the first few -- not 40 lines in a URL."""
    names = [f"branch.{i}.weight" for i in range(40)] + ["head.weight"]
    sid = _grads_run(srv, tmp_path, "many", names, [0.0] * 40 + [1.0], 8)
    p2 = next(f for f in http_json(f"{srv.url}/api/sessions/{sid}/diagnostics") if f["code"] == "P2")
    assert p2["view"] == "gradients" and len(p2["params"]) == 40
    open_dash(page, srv, sid, "?view=doctor")
    finding = page.locator("button.finding[data-code=P2]")
    finding.wait_for()
    listed = finding.locator("div.muted", has_text="parameters:")
    assert listed.inner_text().endswith("… and 32 more")
    assert (listed.get_attribute("title") or "").split("\n") == p2["params"]
    finding.click()
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps >= 8; })()")
    assert state(page)["gradients"]["chosen"] == p2["params"][:8]
    assert page.url.count("branch.") == 8, page.url


def test_a_dead_gradient_is_not_drawn_as_a_small_one(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """A module whose gradient is exactly zero (a dead branch, P2) gets its own colour in the
    heat map, named in the legend -- not the log ramp's lowest, which the smallest non-zero
    norm gets."""
    sid = _grads_run(srv, tmp_path, "dead", ["dead.weight", "low.weight", "big.weight"], [0.0, 0.04, 1.0], 3)
    open_dash(page, srv, sid, "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps >= 3; })()")
    g = state(page)["gradients"]
    assert g["zeroCells"] == 3 and "exactly zero" in g["legend"]
    geom = g["geom"]
    colours = page.evaluate(
        """([geom, rows]) => {
          const c = document.querySelector("[data-testid=heatmap]"), ctx = c.getContext("2d");
          const dpr = c.width / parseFloat(c.style.width);
          return rows.map((m) => Array.from(ctx.getImageData(Math.round((geom.L + 2) * dpr),
                                                             Math.round((m * geom.cellH + 6) * dpr), 1, 1).data));
        }""",
        [geom, [g["modules"].index(m) for m in ("dead", "low", "big")]])
    dead, low, big = (tuple(c[:3]) for c in colours)
    assert dead == (0xC0, 0x26, 0xD3)  # the zero colour (colors.js ZERO)
    assert low != dead and big != dead and low != big
    # the pointer over a cell reads it out
    heat = page.locator("[data-testid=heatmap]")
    for module, says in (("dead", "exactly zero"), ("low", "0.04")):
        heat.hover(position={"x": geom["L"] + 2 + geom["cellW"], "y": g["modules"].index(module) * geom["cellH"] + 6})
        assert page.locator("[data-testid=heat-hover]").inner_text().startswith(f"{module} · step 1 · ‖grad‖ {says}")


def test_node_labels_contrast_with_every_overlay_colour(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    """A node filled by an overlay (the gradient ramp's dark red or navy, its pale yellow, the
    zero colour, the diff's green) gets label ink readable on that fill, in either theme --
    not the theme's text colour, which vanished on half of them."""
    open_dash(page, srv, runs["p01"]["id"])
    fills = ["#313695", "#4575b4", "#74add1", "#abd9e9", "#fee090", "#fdae61", "#f46d43", "#d73027", "#a50026",
             "#c026d3", "#7f1d1d", "#16a34a", "#d97706", "#9ca3af"]
    inks = page.evaluate("(fills) => import('/static/graph/render.js').then((m) => fills.map((f) => m.inkOn(f)))", fills)
    for fill, (label, sub) in zip(fills, inks, strict=True):
        assert contrast(fill, label) >= 4.5 and contrast(fill, sub) >= 4.0, (fill, label, sub)
    assert page.evaluate("import('/static/graph/render.js').then((m) => m.inkOn('var(--node)'))") is None
    # long module paths are cut in the middle: siblings keep the ends that tell them apart
    cut = page.evaluate("""import('/static/graph/render.js').then((m) => {
      const ctx = document.createElement('canvas').getContext('2d'); ctx.font = '12px system-ui, sans-serif';
      return ['encoder_with_a_really_quite_long_name.layers.0.proj', 'encoder_with_a_really_quite_long_name.layers.1.norm']
        .map((s) => m.fit(ctx, s, 140));
    })""")
    assert all("…" in c for c in cut) and cut[0] != cut[1]
    assert cut[0].startswith("enc") and cut[0].endswith(".0.proj") and cut[1].endswith(".1.norm")


def test_gradients_of_a_model_without_parameters_say_so(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """A watched model with no parameters (its optimizer trains a tensor outside it): the view
    says so instead of "no data yet" and "every parameter received a gradient"."""
    from torchscope.transport import Transport

    sid = f"noparams-{int(time.time() * 1000)}"
    t = Transport(str(tmp_path / "np.tscope"), sid, rank=0, server=srv.url)
    t.emit({"kind": "session", "schema": [1, 0], "session_id": sid, "name": "noparams", "started_at": time.time(),
            "rank": 0, "world_size": 1, "model": "Net", "modules": [], "params": []})
    for s in range(3):
        t.emit({"kind": "step", "step": s, "rank": 0, "t": time.time(), "duration_us": 1000,
                "grads": {"norm": [], "nan": [], "inf": [], "none": []}})
    t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": 3})
    open_dash(page, srv, sid, "?view=gradients")
    page.wait_for_function("(() => { const g = window.__torchscope.state().gradients; return g && g.steps >= 3; })()")
    g = state(page)["gradients"]
    assert "has no parameters" in g["noGrad"] and "Every trained parameter" not in g["noGrad"]
    assert "exactly zero" in g["legend"] and "‖grad‖" not in g["legend"]  # no ramp of 1.000 ... 1.000


def test_a_server_restart_under_an_open_page_is_no_page_error(page: Any, tmp_path: Path) -> None:
    """The server goes away under a session page mid-run and comes back: the page says
    "disconnected", raises nothing (refreshes that found the server gone are not page errors),
    and picks up the steps sent after the restart."""
    from torchscope.transport import Transport

    srv = ServerProc(tmp_path / "data").start()
    try:
        sid = f"restart-{int(time.time() * 1000)}"
        t = Transport(str(tmp_path / "r.tscope"), sid, rank=0, server=srv.url)
        t.emit({"kind": "session", "schema": [1, 0], "session_id": sid, "name": "restart", "started_at": time.time(),
                "rank": 0, "world_size": 1, "model": "Net", "modules": [], "params": []})
        step = 0

        def send(n: int) -> None:
            nonlocal step
            for _ in range(n):
                t.emit({"kind": "step", "step": step, "rank": 0, "t": time.time(), "duration_us": 1000,
                        "memory": {"live": 1000, "peak": 2000}})
                step += 1

        send(3)
        t.flush(timeout=30)
        open_dash(page, srv, sid, "?view=memory")
        page.wait_for_function("window.__torchscope.state().memory?.steps >= 3")
        srv.stop()
        page.wait_for_selector("#conn.bad")
        send(3)  # while it is down: kept in the file, sent once it is back
        page.wait_for_timeout(1500)  # refreshes meanwhile find no server
        srv.start()
        page.wait_for_selector("#conn.ok", timeout=30_000)
        send(2)
        page.wait_for_function("window.__torchscope.state().memory?.steps >= 8", timeout=30_000)
        t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": step})
    finally:
        srv.stop()


def test_dark_theme_and_unknown_session(page: Any, srv: ServerProc, runs: dict[str, Any]) -> None:
    open_dash(page, srv, runs["net"]["id"])
    wait_graph(page)
    page.click("#theme")
    assert page.evaluate("document.documentElement.dataset.theme") in ("dark", "light")
    if page.evaluate("document.documentElement.dataset.theme") != "dark":
        page.click("#theme")
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    shot(page, "graph-dark")
    page.goto(f"{srv.url}/sessions/does-not-exist")
    page.wait_for_selector("#fatal")
    assert "No session does-not-exist on this server" in page.locator("#fatal").inner_text()


def test_server_unreachable_says_so(browser: Any, tmp_path: Path) -> None:
    s = ServerProc(tmp_path / "gone").start()
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    try:
        pg.goto(s.url + "/")
        pg.wait_for_selector("#empty")
        s.stop()
        pg.evaluate("window.__torchscope.refresh()")
        pg.wait_for_selector("#note.error")
        assert "unreachable" in pg.locator("#note").inner_text()
    finally:
        s.stop()
        ctx.close()


def test_token_protected_server(browser: Any, tmp_path: Path) -> None:
    s = ServerProc(tmp_path / "tok", extra=["--token", "s3cret-token"]).start()
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    failed: list[str] = []
    pg.on("response", lambda r: failed.append(r.url) if r.status == 401 else None)
    try:
        pg.goto(s.url + "/?token=s3cret-token")
        pg.wait_for_selector("#empty")  # the API answered the page's Bearer-token fetch
        pg.wait_for_selector("#conn.ok")  # and the live channel accepted ?token=
        assert pg.evaluate("document.body.dataset.token") == "s3cret-token"
        assert failed == []
        with pytest.raises(OSError):  # urllib's HTTPError: no token, no data
            http_json(s.url + "/api/sessions")
    finally:
        s.stop()
        ctx.close()


def test_rename_tag_download_delete(browser: Any, srv: ServerProc, runs: dict[str, Any], tmp_path: Path) -> None:
    import httpx

    target = next((s for s in sessions(srv) if s["name"] in ("imported-a", "imported-b")), None)
    if target is None:  # this test ran alone: import one of the file-only runs
        with open(runs["dir"] / "import-a.tscope", "rb") as f:
            httpx.post(srv.url + "/api/sessions/import", files={"file": ("a.tscope", f)}).raise_for_status()
        target = session_named(srv, "imported-a")
    sid = target["id"]
    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    pg = ctx.new_page()
    answers = iter(["renamed <i>run</i>", "baseline, lr=1e-3"])
    pg.on("dialog", lambda d: d.accept(next(answers, "")) if d.type == "prompt" else d.accept())
    try:
        pg.goto(srv.url + "/")
        row = pg.locator(f"tr[data-id='{sid}']")
        row.locator("button[title=rename]").click()
        pg.wait_for_selector("a.session-link:text-is('renamed <i>run</i>')")
        pg.locator(f"tr[data-id='{sid}'] button[title^=tags]").click()
        pg.wait_for_selector(f"tr[data-id='{sid}'] .tag:text-is('lr=1e-3')")
        assert session_named(srv, "renamed <i>run</i>")["tags"] == ["baseline", "lr=1e-3"]
        with pg.expect_download() as dl:
            pg.locator(f"tr[data-id='{sid}'] button[title^=download]").click()
        path = tmp_path / "down.tscope"
        dl.value.save_as(path)
        with urllib.request.urlopen(f"{srv.url}/api/sessions/{sid}/export") as resp:
            assert path.read_bytes() == resp.read()
        pg.locator(f"tr[data-id='{sid}'] button[title=delete]").click()
        pg.wait_for_selector(f"tr[data-id='{sid}']", state="detached")
        assert all(s["id"] != sid for s in sessions(srv))
        shot(pg, "sessions-after-edit")
    finally:
        ctx.close()


def test_ranks_view_shows_each_rank(page: Any, srv: ServerProc, tmp_path: Path) -> None:
    """Two ranks of one session sent by the real transport (a torchrun job is the distributed
    tier's business; here only the view is under test)."""
    from torchscope.transport import Transport

    sid = f"ranks-{int(time.time() * 1000)}"
    for r in (0, 1):
        t = Transport(str(tmp_path / f"r{r}.tscope"), sid, rank=r, server=srv.url)
        t.emit({"kind": "session", "schema": [1, 0], "session_id": sid, "name": "two ranks", "started_at": time.time(),
                "rank": r, "world_size": 2, "model": "Net", "modules": [], "params": []})
        for s in range(20):
            t.emit({"kind": "step", "step": s, "rank": r, "t": time.time(), "duration_us": 10_000 + 5_000 * r,
                    "memory": {"live": 1_000_000 * (r + 1), "peak": 2_000_000 * (r + 1)}})
        t.close({"kind": "end", "t": time.time(), "status": "finished", "steps": 20})
    open_dash(page, srv, sid, "?view=ranks")
    page.wait_for_selector(".view-ranks .chart-legend span:text-is('rank 1')")
    assert page.locator(".view-ranks .chart-legend span:text-is('rank 0')").count() == 2  # time and memory charts
    assert page.locator("#rank").is_visible()  # a rank picker for the other views
    assert "2 ranks" in page.locator("#session-sub").inner_text()
