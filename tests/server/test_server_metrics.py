"""GET /api/sessions/{id}/metrics: the numbers a loop logged with torchscope.log(), as columns per
name, against a real `torchscope serve`: streamed live by a real training subprocess, kept over
a server restart, imported from the session file, and gone with the session."""

from __future__ import annotations

import math
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProc, run_script, wait_for

from torchscope.server.client import upload
from torchscope.session import load

SCRIPT = Path(__file__).with_name("server_metrics_train.py")
STEPS = 8


def wire(metrics: dict[str, dict[str, list[Any]]]) -> dict[str, dict[str, list[Any]]]:
    """The file's metrics as the API's JSON writes them: NaN and the infinities as strings."""
    def one(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        return v
    return {name: {"step": c["step"], "value": [one(v) for v in c["value"]]} for name, c in metrics.items()}


def test_logged_metrics_are_served_live_kept_over_a_restart_and_imported(tmp_path: Path) -> None:
    path = tmp_path / "run.tscope"
    srv = ServerProc(tmp_path / "data").start()
    try:
        run_script(SCRIPT, srv.url, str(path), str(STEPS), timeout=240)
        metrics = load(path).metrics()
        # the file: what the loop logged, at the steps it logged them for
        assert sorted(metrics) == ["acc", "batch_mean", "every3", "rare", "val"]
        assert metrics["acc"]["step"] == list(range(STEPS))
        assert metrics["acc"]["value"] == [0.5 if s == 1 else s / 10 for s in range(STEPS)]  # step 1: logged later
        assert metrics["every3"] == {"step": [0, 3, 6], "value": [0.0, 3.0, 6.0]}
        assert metrics["rare"]["value"] == [1.0, 1.0, 1.0]
        assert math.isnan(metrics["val"]["value"][3]) and metrics["val"]["value"][4] == 1 / 5
        assert metrics["batch_mean"]["step"] == list(range(STEPS))
        sid = load(path).session_id
        expected = wire(metrics)
        assert wait_for(lambda: srv.get(f"/api/sessions/{sid}/metrics") == expected, timeout=30), \
            srv.get(f"/api/sessions/{sid}/metrics")
        srv.stop()
        srv.start()  # the store is the SQLite file: nothing lost
        assert srv.get(f"/api/sessions/{sid}/metrics") == expected
        assert srv.get(f"/api/sessions/{sid}/metrics?rank=1") == {}  # a rank that logged nothing
    finally:
        srv.stop()

    fresh = ServerProc(tmp_path / "other").start()
    try:
        res = upload(fresh.url, path, quiet=True)
        assert fresh.get(f"/api/sessions/{res['id']}/metrics") == expected
        gone = urllib.request.Request(fresh.url + f"/api/sessions/{res['id']}", method="DELETE")
        with urllib.request.urlopen(gone, timeout=10) as resp:
            assert resp.status in (200, 204)
        with pytest.raises(urllib.error.HTTPError) as err:
            fresh.get(f"/api/sessions/{res['id']}/metrics")
        assert err.value.code == 404
    finally:
        fresh.stop()


def test_a_run_without_metrics_serves_none(tmp_path: Path) -> None:
    path = tmp_path / "plain.tscope"
    with ServerProc(tmp_path / "data") as srv:
        run_script(Path(__file__).with_name("server_watch_train.py"), srv.url, str(path), "3", timeout=240)
        assert load(path).metrics() == {}
        sid = load(path).session_id
        assert wait_for(lambda: srv.get(f"/api/sessions/{sid}")["steps"] == 3, timeout=30)  # type: ignore[index]
        assert srv.get(f"/api/sessions/{sid}/metrics") == {}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
