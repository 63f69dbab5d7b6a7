"""Every pitfall reproducer, run for real with --record: its finding, at the right step and place;
the --fixed run: no finding of that code; clean scripts: no warning or error at all.

The scripts run once per test session, side by side (doctor_runs.diagnose_all).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from doctor_runs import CLEAN, PITFALLS, all_jobs, diagnose_all

Findings = list[dict[str, Any]]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Findings | BaseException]:
    return diagnose_all(all_jobs(), tmp_path_factory.mktemp("doctor-runs"))


def findings_of(results: dict[str, Findings | BaseException], name: str) -> Findings:
    res = results[name]
    if isinstance(res, BaseException):
        raise AssertionError(f"{name} did not run: {res}")
    return res


def targets(f: dict[str, Any], key: str) -> list[Any]:
    return [t[key] for t in f.get("targets", []) if key in t]


def check_p1(f: dict[str, Any]) -> None:
    assert {"encoder.0.weight", "encoder.0.bias"} <= set(f["params"]) and "encoder.0" in f["modules"]
    assert f["since"] == 0 and "detach" in f["message"]  # the op where the path breaks
    assert targets(f, "op"), "P1 should point at the op where the path breaks"


def check_p2(f: dict[str, Any]) -> None:
    assert "gate.0" in f["modules"] and "gate.0.weight" in f["params"] and f["since"] == 0
    assert not any(m.startswith("body") for m in f["modules"])


def check_p3(f: dict[str, Any]) -> None:
    assert "0.weight" in f["params"] and f["since"] == 0  # the first layer is where it vanished


def check_p4(f: dict[str, Any]) -> None:
    assert f["since"] == 0 and "0" in f["modules"]  # RowNorm, the model's first module
    assert any("div" in f["message"] for _ in [0]) and targets(f, "op")


def check_p5(f: dict[str, Any]) -> None:
    assert f["since"] == 1 and "0.weight" in f["params"] and f["steps"] == list(range(1, 6))
    path, _, line = f["src"].rpartition(":")  # the backward that added onto old gradients
    assert ".backward(" in (PITFALLS / Path(path).name).read_text().splitlines()[int(line) - 1]


def check_p6(f: dict[str, Any]) -> None:
    assert f["steps"] == [0, 2, 4] and f["view"] == "memory"  # evaluations after steps 0, 2, 4


def check_p7(f: dict[str, Any]) -> None:
    assert f["since"] == 1 and f["view"] == "memory" and f["data"]["graphs_alive"][-1] > 0
    assert "the loss that backward() was called on stays referenced" in f["message"]
    path, _, line = f["src"].rpartition(":")  # the line that keeps the loss
    assert "total_loss += loss" in (PITFALLS / Path(path).name).read_text().splitlines()[int(line) - 1]


def check_p8(f: dict[str, Any]) -> None:
    assert f["since"] == 2 and "Sigmoid" in f["message"]  # batch 2 was the first padded one
    assert targets(f, "node"), "P8 should point at the backward node that needed the old value"
    # a failing step's graph was captured: the finding opens it, at the in-place op it holds
    assert "(aten::fill_)" in f["message"] and f["targets"][0]["step"] in f["steps"]


def check_p9(f: dict[str, Any]) -> None:
    assert f["since"] == 0 and "gt" in f["message"] and targets(f, "op")


def check_p10(f: dict[str, Any]) -> None:
    assert f["since"] == 1 and "p10_backward_twice.py" in f["message"]


def check_p11(f: dict[str, Any]) -> None:
    assert f["since"] == 2 and f["modules"] == [""]  # validation after step 1 left the model in eval


def check_p12(f: dict[str, Any]) -> None:
    assert f["since"] <= 1 and f["view"] == "memory"


def check_p13(f: dict[str, Any]) -> None:
    assert f["modules"] == ["1"] and f["view"] == "memory"  # the ReLU the hook is on


def check_p14(f: dict[str, Any]) -> None:
    assert f["since"] == 0 and len(f["steps"]) >= 5 and f["data"]["scale"][-1] < 65536


def check_p15(f: dict[str, Any]) -> None:
    assert f["since"] == 0 and f["data"]["micro_batches"][0] == 4


def check_p16(f: dict[str, Any]) -> None:
    # the Softmax module and the loss's log_softmax, both ops of the captured step 0
    assert f["since"] == 0 and f["modules"] == ["3"] and "cross_entropy" in f["message"]
    assert len(targets(f, "op")) == 2 and "Softmax" in f["message"]


def check_p17(f: dict[str, Any]) -> None:
    assert f["modules"] == ["encoder"] and f["since"] == 0 and f["view"] == "gradients"
    assert set(f["params"]) == {"encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias"}
    assert "model.encoder.requires_grad = False" in f["message"]


def check_p18(f: dict[str, Any]) -> None:
    # the policy loss's mul and the value head's layer, both ops of the captured step 0
    assert f["since"] == 0 and f["modules"] == ["value"] and len(targets(f, "op")) == 2
    path, _, line = f["src"].rpartition(":")
    assert "dist.log_prob(action) * advantage" in (PITFALLS / Path(path).name).read_text().splitlines()[int(line) - 1]


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "P1": check_p1, "P2": check_p2, "P3": check_p3, "P4": check_p4, "P5": check_p5, "P6": check_p6,
    "P7": check_p7, "P8": check_p8, "P9": check_p9, "P10": check_p10, "P11": check_p11, "P12": check_p12,
    "P13": check_p13, "P14": check_p14, "P15": check_p15, "P16": check_p16, "P17": check_p17,
    "P18": check_p18,
}


@pytest.mark.parametrize("code", list(CHECKS))
def test_reproducer_is_diagnosed(results: dict[str, Findings | BaseException], code: str) -> None:
    found = [f for f in findings_of(results, code) if f["code"] == code]
    assert found, f"{code} not diagnosed; got {[(f['code'], f['message']) for f in findings_of(results, code)]}"
    assert all(f["steps"] and f["message"] and f["fix"] for f in found)
    CHECKS[code](found[0])


@pytest.mark.parametrize("code", list(CHECKS))
def test_fixed_reproducer_is_not_diagnosed(results: dict[str, Findings | BaseException], code: str) -> None:
    found = findings_of(results, f"{code}-fixed")
    assert code not in [f["code"] for f in found], [f["message"] for f in found if f["code"] == code]
    noisy = [(f["code"], f["message"]) for f in found if f["severity"] != "info"]
    assert not noisy, f"the fixed {code} reproducer should be clean: {noisy}"


@pytest.mark.parametrize("script", CLEAN, ids=[p.stem for p in CLEAN])
def test_clean_script_has_no_warning_or_error(results: dict[str, Findings | BaseException], script: Path) -> None:
    assert script.exists(), f"{script} is missing (examples/mlp.py, cnn.py, transformer.py come from the capture)"
    found = findings_of(results, f"clean-{script.stem}")
    assert not [(f["code"], f["message"]) for f in found if f["severity"] in ("error", "warning")]
