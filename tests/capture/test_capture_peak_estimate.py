"""An uncaptured step's ``memory.peak`` is an estimate (the state plus the activations saved
for backward), a captured step's the op ledger's measured highest point when that is higher.
Drawn per step, the measured one stood out at every ``sample_every``-th step as a spike that
never happened (QA 42b: 179,804 B on every step of the example MLP but 186,456 B at step 50).
The steps after a captured one of the same structure carry its excess over the state."""

from __future__ import annotations

from pathlib import Path

from conftest import EXAMPLES, run_script

from torchscope.session import load


def test_steps_after_a_captured_one_carry_its_measured_peak(tmp_path: Path) -> None:
    path = tmp_path / "mlp.tscope"
    run_script(EXAMPLES / "mlp.py", "--steps", "54", "--server", "none", "--record", str(path))
    steps = load(str(path)).steps
    peak = {s["step"]: s["memory"]["peak"] for s in steps}
    live = {s["step"]: s["memory"]["live"] for s in steps}
    captured = [s["step"] for s in steps if s["graph_captured"]]
    assert 50 in captured and not {51, 52, 53} & set(captured), captured
    assert len(set(live[s] for s in range(1, 54))) == 1  # a steady state: the same bytes every step
    # the measurement saw more than the estimate (the input batch and temporaries) ...
    estimate = {s["step"]: s["memory"]["live"] + s["memory"]["saved"] for s in steps}
    assert peak[50] > estimate[51], (peak[50], estimate[51])
    # ... and the steps after it say so too, not a spike at step 50 alone
    assert peak[51] == peak[52] == peak[53] == peak[50], [peak[s] for s in (49, 50, 51, 52, 53)]
