"""DTensor parameters -- tensor parallel, and FSDP2's ``fully_shard`` -- on 2 real gloo ranks
under torchrun: ``watch()`` neither raises (a DTensor has no storage of its own to read) nor
changes a number, each rank records every step's backward (under FSDP2 the graph accumulates
into gathered stand-ins of the parameters) and the gradient statistics and parameter bytes of
its own shards -- read locally, never through a collective inside the user's step."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import rank_runs, run_two_ranks

SCRIPT = Path(__file__).with_name("train_dtensor.py")
STEPS = 6


@pytest.mark.parametrize(("layout", "mode"), [("tp", "light"), ("tp", "default"), ("fsdp2", "default")])
def test_dtensor_model_is_watched_per_rank_shard(tmp_path: Path, layout: str, mode: str) -> None:
    run_two_ranks(SCRIPT, str(tmp_path), mode, layout)
    for facts, s in rank_runs(tmp_path, "dtensor", STEPS):
        assert [level for level in (log.get("level") for log in s.logs) if level in ("error", "warning")] == []
        for ev, norms in zip(s.steps, facts["norms"], strict=True):
            assert ev["loss"] is not None and ev["micro_batches"] == 1 and ev["grads"]["none"] == []
            assert ev["grads"]["norm"] == pytest.approx(norms, rel=1e-5)  # this rank's shards
            assert ev["memory"]["params"] == facts["local_bytes"]
        if mode == "default":
            assert s.graph_steps and s.graph_steps[0] == 0
