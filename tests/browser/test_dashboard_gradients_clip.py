"""The Gradients view's total gradient norm, and what it says when the loop calls
``clip_grad_norm_``: the statistics are read after clipping, so a run clipped every step looks
calm unless the view shows the norm before clipping too.  Checked in a real headless Chromium
against a real `torchscope serve`, with runs recorded by a real training script, and the note's
numbers checked against the server's /grads JSON.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_page import checked_page, train_side_by_side
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

TRAIN = Path(__file__).resolve().parent / "dashboard_train.py"
STEPS = 8
MAX_NORM = 2.0  # under most steps' total norm in dashboard_train.py's run (about 1.4 to 5)
NOTE = re.compile(r"clip_grad_norm_\(max_norm=(\S+)\) ran on (\d+) of (\d+) steps and scaled the gradients down on (\d+) "
                  r"of them: the norms in this view are after clipping; before it, the total norm peaked at (\S+) \(step (\d+)\)\.")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("clip-server")) as s:
        yield s


@pytest.fixture(scope="module")
def runs(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Session ids of real runs of the same loop: one clipping, one not, one whose gradients are NaN."""
    args = {"clipped": ["--clip", str(MAX_NORM)], "unclipped": [], "nan": ["--backward-nan"]}
    runs = {name: ["--steps", str(STEPS), "--name", name, *extra] for name, extra in args.items()}
    return train_side_by_side(srv, TRAIN, tmp_path_factory.mktemp("clip-runs"), runs)


def gradients_view(page: Any, srv: ServerProc, sid: str) -> dict[str, Any]:
    page.goto(f"{srv.url}/sessions/{sid}?view=gradients")
    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
    page.wait_for_function(f"(() => {{ const g = window.__torchscope.state().gradients; return g && g.steps >= {STEPS}; }})()")
    return page.evaluate("window.__torchscope.state().gradients")  # type: ignore[no-any-return]


def legend(page: Any) -> list[str]:
    return page.locator("[data-testid=total-norm] .legend-item").all_inner_texts()  # type: ignore[no-any-return]


def test_a_clipped_run_shows_the_norm_before_clipping_and_says_so(srv: ServerProc, runs: dict[str, str]) -> None:
    sid = runs["clipped"]
    grads: dict[str, Any] = srv.get(f"/api/sessions/{sid}/grads")  # type: ignore[assignment]
    clip = grads["clip"]
    ran = [c for c in clip if c]
    scaled = sum(c["norm"] > c["max_norm"] for c in ran)
    assert len(ran) == STEPS and scaled > STEPS / 2  # the run is what this test needs: clipped on most steps
    peak = max(range(STEPS), key=lambda s: clip[s]["norm"])
    with checked_page() as page:
        g = gradients_view(page, srv, sid)
        assert legend(page) == ["after clip_grad_norm_", "before clip_grad_norm_", "max_norm"]
        assert g["total"] == legend(page)
        note = page.locator("[data-testid=clip-note]")
        assert note.is_visible()
        said = NOTE.fullmatch(note.inner_text())
        assert said, note.inner_text()
        assert float(said[1]) == MAX_NORM
        assert [int(said[i]) for i in (2, 3, 4)] == [len(ran), len(grads["steps"]), scaled]
        assert float(said[5]) == pytest.approx(clip[peak]["norm"], rel=1e-3)
        assert int(said[6]) == grads["steps"][peak]


def test_a_run_without_clipping_shows_one_total_norm_and_no_note(srv: ServerProc, runs: dict[str, str]) -> None:
    sid = runs["unclipped"]
    grads: dict[str, Any] = srv.get(f"/api/sessions/{sid}/grads")  # type: ignore[assignment]
    assert not any(grads["clip"])
    with checked_page() as page:
        g = gradients_view(page, srv, sid)
        assert legend(page) == ["total ‖grad‖"]
        assert g["clipNote"] == "" and not page.locator("[data-testid=clip-note]").is_visible()
        # the rest of the view is still there
        assert g["modules"] and page.locator("[data-testid=heatmap]").is_visible()


def test_the_total_norm_is_on_a_log_axis_with_nan_steps_marked(srv: ServerProc, runs: dict[str, str]) -> None:
    """Gradient norms span decades (a spike before clipping flattened the rest on a linear
    axis): the axis is in whole decades around every value; a step whose gradients hold NaN/Inf
    has no point to draw, so it gets a red dot instead of an empty chart."""
    clip = srv.get(f"/api/sessions/{runs['clipped']}/grads")["clip"]  # type: ignore[attr-defined]
    values = [c["norm"] for c in clip] + [c["max_norm"] for c in clip]
    nan = srv.get(f"/api/sessions/{runs['nan']}/grads")  # type: ignore[attr-defined]
    bad = [st for s, st in enumerate(nan["steps"]) if sum(nan["nan"][s]) + sum(nan["inf"][s]) > 0]
    assert bad == nan["steps"]  # the run is what this test needs: NaN gradients at every step
    with checked_page() as page:
        state = gradients_view(page, srv, runs["clipped"])
        axis = state["totalAxis"]
        assert axis["log"] is True and 10 ** axis["lo"] <= min(values) and max(values) <= 10 ** axis["hi"]
        assert state["totalMarks"] == []
        assert gradients_view(page, srv, runs["nan"])["totalMarks"] == bad
