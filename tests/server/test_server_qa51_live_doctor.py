"""The sessions list flags a running run that went NaN, while it runs (QA 51c, F2).

Before, the server diagnosed a run when it ended, went silent, or someone opened its Doctor
tab: a sweep watched from the sessions list showed "none so far" (``errors: 0, diagnosed:
false``) for a run whose loss was NaN from step 20 until its end, 61 s later.  Now a running
rank is queued for the background doctor at once when a step's loss or gradient is NaN/Inf,
and now and then besides (``diagnostics.LIVE_EVERY_S``).  Only ``/api/sessions`` is read
here: asking a run's ``/diagnostics`` (its Doctor tab) would diagnose it on its own.
"""

from __future__ import annotations

import time
from pathlib import Path

from conftest import ServerProc
from test_server_qa51_deleted import listed, start_run, wait_for

from torchscope.server.diagnostics import LIVE_EVERY_S


def test_the_list_flags_a_live_nan_run_within_seconds_and_diagnoses_a_healthy_one_while_it_runs(
        tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv:
        nan_run, _, nan_stop = start_run(tmp_path, srv, "nan-live", nan_at=20)
        ok_run, _, ok_stop = start_run(tmp_path, srv, "ok-live")
        try:
            wait_for(lambda: (s := listed(srv, "nan-live")) and s["steps"] > 20)
            since = time.monotonic()
            row = wait_for(lambda: (s := listed(srv, "nan-live")) and s["errors"] > 0 and s, timeout=60)
            assert time.monotonic() - since < 20, "the NaN reached the list, but late"
            assert row["status"] == "running" and row["diagnosed"] is True

            # a healthy live run: not diagnosed in its first seconds (a short run is diagnosed
            # at its end, as before), then diagnosed while it runs, with nothing found
            first = listed(srv, "ok-live")
            assert first is not None and first["status"] == "running"
            ok = wait_for(lambda: (s := listed(srv, "ok-live")) and s["diagnosed"] and s, timeout=LIVE_EVERY_S + 60)
            assert ok["status"] == "running" and ok["errors"] == 0
        finally:
            nan_stop.touch()
            ok_stop.touch()
            for proc in (nan_run, ok_run):
                out, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, (out, err)
        # the end still brings the final verdict
        done = wait_for(lambda: (s := listed(srv, "nan-live")) and s["status"] == "finished" and s)
        assert done["errors"] > 0
