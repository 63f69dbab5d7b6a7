"""Correct training loops QA (round 18) saw flagged, run for real: a GradScaler calibrating its
scale (P14, P2), batch-norm statistics frozen on purpose (P11), and a NaN learning rate blamed
on the wrong step (P4) -- each with its real-bug twin, which must still be reported.

The variants of false_alarm_runs.py run once per module, side by side (doctor_runs.diagnose_all).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from doctor_events import grads, session, step
from doctor_runs import diagnose_all

from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

SCRIPT = Path(__file__).with_name("false_alarm_runs.py")
STEPS = 24
VARIANTS = ["fp16_scaler_sum", "fp16_scaler", "fp16_dead_relu", "fp16_corrupt_batches",
            "frozen_bn", "frozen_bn_and_dropout", "backbone_left_in_eval",
            "nan_lr_warmup", "nan_lr_decay", "nan_batch", "pruned", "pruned_dead_relu", "wgan_gp"]

Findings = list[dict[str, Any]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Findings | BaseException]]:
    tmp = tmp_path_factory.mktemp("false-alarms")
    # the later --steps wins over the one doctor_runs.record passes
    jobs = [(name, SCRIPT, ("--variant", name, "--steps", str(STEPS))) for name in VARIANTS]
    return tmp, diagnose_all(jobs, tmp, workers=2)  # the machine's two cores are shared


def findings(runs: tuple[Path, dict[str, Findings | BaseException]], name: str) -> Findings:
    res = runs[1][name]
    if isinstance(res, BaseException):
        raise AssertionError(f"{name} did not run: {res}")
    return res


def of(found: Findings, code: str) -> Findings:
    return [f for f in found if f["code"] == code]


def loud(found: Findings) -> list[tuple[str, str]]:
    return [(f["code"], f["message"]) for f in found if f["severity"] in ("error", "warning")]


def skipped_steps(runs: tuple[Path, dict[str, Findings | BaseException]], name: str) -> list[int]:
    """The steps whose optimizer.step() the GradScaler skipped, as recorded."""
    return [ev["step"] for ev in iter_events(runs[0] / f"{name}.tscope")
            if ev.get("kind") == "step" and ev.get("scaler", {}).get("skipped") is True]


def script_line(src: str) -> str:
    file, _, line = src.rpartition(":")
    assert file == SCRIPT.name, src
    return SCRIPT.read_text().splitlines()[int(line) - 1].strip()


# ---------------------------------------------------------------- P14 + P2: GradScaler calibration
@pytest.mark.parametrize("name", ["fp16_scaler_sum", "fp16_scaler"])
def test_gradscaler_calibration_is_an_info_not_a_warning(runs: Any, name: str) -> None:
    """The documented recipe: the scaler skips its first steps while it lowers its scale from
    65536 (fp16_scaler: one more skip after a first stepped step), then steps steadily.  No
    P14 warning, and no dead branch or cancelling bias read from the skipped steps' gradients
    (clip_grad_norm_ saw an inf norm and zeroed them)."""
    found = findings(runs, name)
    skipped = skipped_steps(runs, name)
    assert skipped and skipped[0] == 0 and skipped[-1] < STEPS - 3, skipped  # the run is a calibration
    assert not loud(found), loud(found)
    assert not of(found, "P2"), [f["message"] for f in of(found, "P2")]
    (p14,) = of(found, "P14")
    assert p14["severity"] == "info" and p14["steps"] == skipped and p14["data"]["calibration"] == skipped
    assert "calibrated its scale" in p14["message"] and p14["title"] == "GradScaler calibrating its scale"
    # from the scale it began with to where it settled: halved at each skip (backoff_factor 0.5)
    init = torch.amp.GradScaler("cpu").get_scale()
    assert f"(from {init:g} to {init / 2 ** len(skipped):g})" in p14["message"], p14["message"]


def test_dead_branch_under_amp_is_still_reported_from_the_stepped_steps(runs: Any) -> None:
    """A ReLU layer that never fires, in the same AMP loop: P2 still reports it, on the steps
    the optimizer took -- not on the calibration's skipped ones."""
    found = findings(runs, "fp16_dead_relu")
    skipped = skipped_steps(runs, "fp16_dead_relu")
    assert skipped, "the twin should calibrate too"
    dead = [f for f in of(found, "P2") if f["severity"] == "warning"]
    assert len(dead) == 1 and {"0.weight", "0.bias"} <= set(dead[0]["params"]), [f["message"] for f in found]
    assert dead[0]["steps"] == [s for s in range(STEPS) if s not in skipped]
    assert not [f for f in of(found, "P14") if f["severity"] != "info"]


def test_skips_recurring_after_calibration_are_still_a_warning(runs: Any) -> None:
    """A corrupt batch every third step from step 12: the scaler keeps skipping after it found its
    scale.  P14 warns about those steps (the calibration's are not counted)."""
    found = findings(runs, "fp16_corrupt_batches")
    corrupt = [s for s in range(12, STEPS) if s % 3 == 0]
    skipped = skipped_steps(runs, "fp16_corrupt_batches")
    assert set(corrupt) <= set(skipped) and skipped[0] == 0
    (p14,) = of(found, "P14")
    assert p14["severity"] == "warning" and p14["steps"] == corrupt, p14["message"]
    assert "besides the 3 of its calibration (steps 0-2)" in p14["message"], p14["message"]
    # an inf in the batch makes the loss itself non-finite: not an overflow of the scaling
    assert "their loss itself was NaN/Inf" in p14["message"] and "because the gradients overflowed" not in p14["message"]
    (p4,) = of(found, "P4")
    assert "each time followed by finite steps" in p4["message"] and "their data" in p4["message"], p4["message"]


# ---------------------------------------------------------------- P11: frozen batch-norm statistics
def test_frozen_batchnorm_statistics_are_an_info(runs: Any) -> None:
    """model.train(); model.apply(freeze_bn) every step (mmdetection's norm_eval=True): the
    batch-norm layers in eval while their weight and bias train, from the first step."""
    found = findings(runs, "frozen_bn")
    assert not loud(found), loud(found)
    (p11,) = of(found, "P11")
    assert p11["severity"] == "info" and p11["modules"] == ["0.1", "0.4"] and p11["steps"] == list(range(STEPS))
    assert "norm_eval" in p11["message"] and "weight and bias train" in p11["message"]


@pytest.mark.parametrize(("name", "modules", "since"), [
    ("frozen_bn_and_dropout", ["0.1", "0.4", "1"], range(1)),  # the dropout is off while training
    # eval from a feature check after step 5 on, not by the loop (the capture reads submodules'
    # modes every 10 steps)
    ("backbone_left_in_eval", ["0.1", "0.4"], range(6, 11)),
])
def test_wrong_modes_are_still_a_warning(runs: Any, name: str, modules: list[str], since: range) -> None:
    (p11,) = of(findings(runs, name), "P11")
    assert p11["severity"] == "warning" and p11["modules"] == modules, p11["message"]
    assert p11["since"] in since and "Training while" in p11["message"]


# ---------------------------------------------------------------- P4: a NaN learning rate
@pytest.mark.parametrize(("name", "blamed"), [("nan_lr_warmup", 0), ("nan_lr_decay", 10)])
def test_nan_learning_rate_blames_that_optimizer_step(runs: Any, name: str, blamed: int) -> None:
    """The learning rate is NaN at step ``blamed`` (a warm-up's 0/0 set by hand; a LambdaLR's
    0/0 from a later step): that step's loss and gradients are finite, its optimizer.step()
    writes NaN into the parameters and the next step's loss is NaN.  The finding names that
    step, its learning rate and the optimizer.step() line -- not the next step's backward."""
    (p4,) = of(findings(runs, name), "P4")
    assert p4["severity"] == "error" and p4["since"] == blamed and p4["targets"][0] == {"step": blamed, "rank": 0}
    assert script_line(p4["src"]) == "opt.step()"
    assert f"step {blamed}'s loss and gradients were finite" in p4["message"]
    assert "non-finite learning rate (param group 0: lr=nan)" in p4["message"]
    assert "set_detect_anomaly" not in p4["message"] and "scheduler" in p4["fix"]
    assert math.isnan(p4["data"]["lr"][blamed][0])


def test_nan_in_the_data_still_blames_that_step(runs: Any) -> None:
    """The twin: a NaN sample at step 5, the learning rate finite: the loss of step 5 is where
    it began, brought by its batch (the forward's line), the optimizer is not blamed."""
    (p4,) = of(findings(runs, "nan_batch"), "P4")
    assert p4["since"] == 5 and script_line(p4["src"]) == "loss = F.cross_entropy(model(x), y)"
    assert "learning rate" not in p4["message"] and "first appeared at step 5 in the loss" in p4["message"]
    assert "input batch at step 5 already held NaN/Inf" in p4["message"]


def test_optimizer_update_blamed_when_the_first_nan_op_reads_a_parameter() -> None:
    """No NaN learning rate, but the first non-finite step was checked op by op (the step before
    armed the check) and its first NaN op only reads a weight: the update of the step before --
    finite loss and gradients -- made the weight NaN.  (The capture checks ops on the first
    non-finite step only in such runs, so this one is spelled out as events.)"""
    g = {"kind": "graph", "step": 3, "rank": 0, "tensors": [{"id": 0, "param": "enc.weight"}, {"id": 1}],
         "ops": [{"id": 0, "name": "aten::t", "module": "enc", "inputs": [0], "outputs": [1], "flags": ["nan"],
                  "src": "m.py:4"}]}
    bad = grads(nan=[32, 8, 8, 1])
    events = [session(), step(0), step(1), step(2, lr=[0.1], step_src="train.py:40"),
              step(3, loss=float("nan"), losses=[float("nan")], grads=bad), g]
    (p4,) = of([dict(f) for f in diagnose(events)], "P4")
    assert p4["since"] == 2 and p4["src"] == "train.py:40" and p4["targets"][0] == {"step": 2, "rank": 0}
    assert "made the parameters non-finite" in p4["message"] and "'enc.weight'" in p4["message"]
    assert "learning rate (" not in p4["message"]


def test_a_pruned_layer_is_no_dead_branch(runs: Any) -> None:
    """99% magnitude pruning: 99% of 2.weight_orig's gradient is exact zeros, by the mask.  No
    finding; a dead ReLU in front of it is still found, and names layer 0, not the pruned one."""
    assert loud(findings(runs, "pruned")) == []
    (p2,) = of(findings(runs, "pruned_dead_relu"), "P2")
    assert "0.weight" in p2["params"] and not any(p.startswith("2.") for p in p2["params"]), p2["params"]


def test_a_wgan_gp_critic_is_no_dead_branch(runs: Any) -> None:
    """A WGAN-GP critic's module outputs get exact-zero gradients from the penalty's double
    backward while its weights learn: no dead branch (the last layer's bias, which cancels out
    of fake minus real, is an info)."""
    assert loud(findings(runs, "wgan_gp")) == []
