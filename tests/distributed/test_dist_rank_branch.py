"""A forward that depends on the rank under DistributedDataParallel (``find_unused_parameters=
True``): rank 1 skips ``proj``, whose ``.grad`` DDP's all-reduce fills with rank 0's gradient
all the same -- so ``.grad`` is never None and plain P1 cannot see it.  The captured graph of
rank 1's step holds no AccumulateGrad of ``proj``: the doctor warns on rank 1, not on rank 0,
and not at all when every rank takes the same path."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import rank_runs, run_two_ranks

SCRIPT = Path(__file__).with_name("train_rank_branch.py")
STEPS = 6


@pytest.mark.parametrize(("mode", "variant"), [("default", "bug"), ("full", "bug"), ("default", "fixed")])
def test_a_parameter_only_other_ranks_use_is_p1_on_the_rank_that_skips_it(tmp_path: Path, mode: str,
                                                                          variant: str) -> None:
    run_two_ranks(SCRIPT, str(tmp_path), mode, variant)
    for facts, s in rank_runs(tmp_path, "branch", STEPS):
        assert all(facts["proj_grad"])  # the all-reduce filled it on every rank, every step
        assert all(e["grads"]["none"] == [] for e in s.steps)
        found = [f for f in s.diagnostics() if f["code"] == "P1"]
        if variant == "bug" and s.rank == 1:
            assert [(f["severity"], f["params"]) for f in found] == [("warning", ["module.proj.weight", "module.proj.bias"])]
            assert found[0]["steps"][0] == 0
            assert "rank 1" in found[0]["message"] and "all-reduce" in found[0]["message"]
        else:
            assert found == []
