"""FSDP1 (``FullyShardedDataParallel``) on 2 real gloo ranks under torchrun: ``watch()`` changes
no number, each rank records every step with the gradient statistics of its own shard -- the
one FlatParameter, or (``use_orig_params=True``) the original parameters' views into it -- and
the doctor finds nothing in a correct run: a parameter whose shard is empty on a rank is not
one that "never received a gradient" (P1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import rank_runs, run_two_ranks

SCRIPT = Path(__file__).with_name("train_fsdp1.py")
STEPS = 5


@pytest.mark.parametrize(("params", "mode"), [("flat", "default"), ("orig", "light"), ("orig", "full")])
def test_fsdp1_model_is_watched_per_rank_shard(tmp_path: Path, params: str, mode: str) -> None:
    run_two_ranks(SCRIPT, str(tmp_path), mode, params)
    empty_somewhere = False
    for facts, s in rank_runs(tmp_path, "fsdp1", STEPS):
        watched = next(e for e in s.events() if e["kind"] == "session")["params"]
        assert len(watched) == (1 if params == "flat" else 4) and [p["numel"] for p in watched] == facts["numel"]
        empty_somewhere |= 0 in facts["numel"]
        for ev, norms in zip(s.steps, facts["norms"], strict=True):
            assert ev["loss"] is not None and ev["grads"]["none"] == []
            # None where the shard is empty, compared as is (pytest >= 9.1 rejects None inside approx())
            assert ev["grads"]["norm"] == [n if n is None else pytest.approx(n, rel=1e-5) for n in norms]
        if mode != "light":
            assert s.graph_steps and s.graph_steps[0] == 0
        assert [f["code"] for f in s.diagnostics()] == []
    assert empty_somewhere == (params == "orig")  # 2 ranks, 4 small parameters: some wholly on one rank
