"""Where a step's time went: the "Step time" view splits a single rank's step into the
watched model's forward, backward() and the rest (data loading, loss, optimizer.step(), the
loop's own code), each from the step events, as the profiler's step view does.  A run whose
loader sleeps 40 ms a batch shows those milliseconds in the rest, not in the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser_page import checked_page, open_session, recorded, shot
from conftest import ServerProc

from torchscope.session import load

playwright_sync = pytest.importorskip("playwright.sync_api")

SCRIPT = Path(__file__).with_name("dashboard_train_steptime.py")


def test_step_time_is_split_into_forward_backward_and_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "slow.tscope"
    with ServerProc(tmp_path / "data") as srv, checked_page() as page:
        sid = recorded(srv, path, SCRIPT, "--steps", "12", "--load-ms", "40")
        open_session(page, srv.url, sid, "?view=ranks")
        page.wait_for_selector(".view-ranks .chart-legend span:text-is('forward')")
        shot(page, "step-time-split")
        chart: dict[str, Any] = page.evaluate("""(() => {
            const c = window.__torchscope.app.views.ranks.obj.time;
            return { x: c.x, series: c.series.map((s) => ({ name: s.name, y: s.y })) };
        })()""")
    steps = load(path).steps
    assert chart["x"] == [e["step"] for e in steps] == list(range(12))
    lines = {s["name"]: s["y"] for s in chart["series"]}
    rest_name = "the rest (data loading, loss, optimizer.step(), your code)"
    assert list(lines) == ["whole step", "forward", "backward", rest_name]
    assert lines["whole step"] == [e["duration_us"] for e in steps]
    assert lines["forward"] == [e["forward_us"] for e in steps]
    assert lines["backward"] == [e["backward_us"] for e in steps]
    assert lines[rest_name] == [e["duration_us"] - e["forward_us"] - e["backward_us"] for e in steps]
    # the loader's 40 ms sleep (before each step's forward) is in the rest of every step after
    # the first (whose time runs from watch(), before the loop fetched its first batch)
    assert all(r >= 40_000 for r in lines[rest_name][1:])
    # and not in the forward: a forward takes a few ms, so most steps' forwards are far under
    # 40 ms; a sleep counted in the forward would put every one over.  Steps may stall past
    # 40 ms on a CI machine whose two cores run three test workers (two did, once), so the
    # median is what is compared, not each step
    forwards = sorted(lines["forward"][1:])
    assert forwards[len(forwards) // 2] < 40_000, lines["forward"]
