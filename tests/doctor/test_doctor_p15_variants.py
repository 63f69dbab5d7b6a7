"""P15 on gradient accumulation as real loops write it: each wrong variant of p15_variants.py
flagged, with what was done, where and the fix; each correct twin silent.

The variants run once per module, for real, side by side (doctor_runs.diagnose_all).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from doctor_runs import STEPS, diagnose_all

from torchscope.sessionfile import iter_events

SCRIPT = Path(__file__).with_name("p15_variants.py")
K, B = 4, 8  # p15_variants.K, p15_variants.B: micro-batches per step, samples per micro-batch
T = 6  # p15_variants.T: tokens per sequence (tokens_* variants)

CHUNKED = ["chunk_sum", "chunk_stack_sum", "chunk_outputs_first", "chunk_of_pixels", "chunk_sum_divided_by_micro_batch"]
# a sum over each micro-batch's samples divided by its size: the loss node's reduction='sum' (or a
# SumBackward0) under a DivBackward0 / MulBackward0 whose number is the micro-batch's batch dimension
MICRO_MEANS = ["sum_divided_by_micro_batch", "sum_times_inverse_micro_batch", "explicit_sum_divided_by_micro_batch"]
CORRECT = ["chunk_sum_divided", "chunk_stack_mean", "mean_divided", "sum_divided_by_batch", "sum_scaled_by_full_batch",
           "sum_reduction", "explicit_sum", "chunk_explicit_sum", "two_datasets", "two_views", "label_smoothing_divided",
           "tokens_divided_by_batch_tokens", "scaler_divided", "scaler_divided_light", "weighted_average_divided"]
# a loss multiplied by numbers that are weights, not 1 / K: label smoothing's, 2.0 * loss
# (and losses averaged with weights summing to 1: a distillation's alpha * kd + (1 - alpha) * ce)
WEIGHTED = ["label_smoothing_not_divided", "weighted_not_divided", "weighted_average_not_divided", "distillation_not_divided"]
ADAM = ["adam_not_divided", "adam_clip_not_divided"]
TOKENS = "tokens_divided_by_micro_batch_tokens"
# under a GradScaler, whose scaler.scale(loss) multiplies by a tensor, in the modes with and without graphs
SCALED = ["scaler_not_divided", "scaler_not_divided_light", "scaler_chunk_sum"]
VARIANTS = [*CHUNKED, "mean_not_divided", "custom_function_not_divided", *MICRO_MEANS, *CORRECT, *WEIGHTED, *ADAM, TOKENS,
            *SCALED]
HEDGE = "reduction='sum'"  # the warning's caveat when no loss node tells its reduction

Findings = list[dict[str, Any]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Findings | BaseException]]:
    tmp = tmp_path_factory.mktemp("p15-variants")
    jobs = [(name, SCRIPT, ("--variant", name.removesuffix("_light"), "--mode", "light" if name.endswith("_light") else "default"))
            for name in VARIANTS]
    return tmp, diagnose_all(jobs, tmp, workers=2)  # the machine's two cores are shared


def p15(runs: tuple[Path, dict[str, Findings | BaseException]], name: str) -> Findings:
    res = runs[1][name]
    if isinstance(res, BaseException):
        raise AssertionError(f"{name} did not run: {res}")
    return [f for f in res if f["code"] == "P15"]


def _line(src: str) -> str:
    """The source line a finding's "file.py:123" names, in p15_variants.py."""
    file, _, line = src.rpartition(":")
    assert file == SCRIPT.name, src
    return SCRIPT.read_text().splitlines()[int(line) - 1]


@pytest.mark.parametrize("name", CHUNKED)
def test_losses_of_a_chunked_batch_added_before_one_backward(
        runs: tuple[Path, dict[str, Findings | BaseException]], name: str) -> None:
    found = p15(runs, name)
    assert len(found) == 1, found
    f = found[0]
    assert f["severity"] == "warning" and f["steps"] == list(range(int(STEPS))), f
    assert f["data"]["micro_batches"] == [K] * int(STEPS)
    assert "added into one loss before backward()" in f["message"] and f"{K}x larger" in f["message"]
    assert f"/ {K}" in f["fix"] and "torch.stack(losses).mean()" in f["fix"]
    assert "backward()" in _line(f["src"])  # where: the user's backward() call
    # the finding opens the captured step's graph at the loss that adds the micro-batches up
    graph = next(e for e in iter_events(runs[0] / f"{name}.tscope") if e["kind"] == "graph")
    target = f["targets"][0]
    assert target["step"] == graph["step"] and target["node"] == graph["root"]
    root = next(n for n in graph["nodes"] if n["id"] == graph["root"])
    assert root["name"] in ("AddBackward0", "SumBackward0"), root


def test_micro_batch_means_summed_into_grad_still_p15(runs: tuple[Path, dict[str, Findings | BaseException]]) -> None:
    found = p15(runs, "mean_not_divided")
    assert len(found) == 1 and found[0]["severity"] == "warning", found
    f = found[0]
    assert f"by {K}" in f["message"] and "(loss / accum_steps).backward()" in f["fix"]
    assert "backward()" in _line(f["src"])
    # MseLossBackward0 recorded reduction='mean': the warning says so without a caveat
    assert HEDGE not in f["message"]


@pytest.mark.parametrize("name", ["scaler_not_divided", "scaler_not_divided_light"])
def test_micro_batch_means_scaled_by_a_grad_scaler_still_p15(
        runs: tuple[Path, dict[str, Findings | BaseException]], name: str) -> None:
    """scaler.scale(loss) is loss times the scale, a tensor: the loss it scaled is judged, from
    the captured graph (default) or from the roots' names alone (light)."""
    found = p15(runs, name)
    assert len(found) == 1 and found[0]["severity"] == "warning", found
    f = found[0]
    assert f"by {K}" in f["message"] and f"{K}x larger" in f["message"]
    # light captures no graph, whose MseLossBackward0 node would have told reduction='mean'
    assert (HEDGE in f["message"]) == name.endswith("_light")
    assert f["data"]["micro_batches"] == [K] * int(STEPS)
    assert "scaler.scale(" in _line(f["src"])


def test_chunked_losses_scaled_by_a_grad_scaler_still_p15(runs: tuple[Path, dict[str, Findings | BaseException]]) -> None:
    """The sum of K slices' losses under scaler.scale(): the finding opens the sum, below the scaler's multiply."""
    (f,) = p15(runs, "scaler_chunk_sum")
    assert "added into one loss before backward()" in f["message"] and f"{K}x larger" in f["message"], f
    graph = next(e for e in iter_events(runs[0] / "scaler_chunk_sum.tscope") if e["kind"] == "graph")
    names = {n["id"]: n["name"] for n in graph["nodes"]}
    assert names[graph["root"]] == "MulBackward0"
    assert f["targets"][0]["node"] != graph["root"] and names[f["targets"][0]["node"]] == "AddBackward0", f


@pytest.mark.parametrize("name", WEIGHTED)
def test_a_weighted_loss_not_divided_is_p15(runs: tuple[Path, dict[str, Findings | BaseException]], name: str) -> None:
    """A number the loss is multiplied by is the division by K only when it is about 1 / K:
    label smoothing's (1 - e) and e / C, or a task weight of 2, are weights of a mean."""
    found = p15(runs, name)
    assert len(found) == 1 and found[0]["severity"] == "warning", found
    assert f"by {K}" in found[0]["message"] and f"{K}x larger" in found[0]["message"]
    assert "backward()" in _line(found[0]["src"])


def test_under_adam_p15_says_what_k_times_the_gradients_do(
        runs: tuple[Path, dict[str, Findings | BaseException]]) -> None:
    """Adam divides its steps by the gradients' running scale: K times the gradients make about
    the same step (info), but a clip at max_norm clips them as at max_norm / K (warning)."""
    (plain,) = p15(runs, "adam_not_divided")
    assert plain["severity"] == "info" and "Adam divides each step" in plain["message"], plain
    assert "larger than intended" not in plain["message"]
    (clipped,) = p15(runs, "adam_clip_not_divided")
    assert clipped["severity"] == "warning", clipped
    assert f"clips as if max_norm={1 / K:g}, not 1" in clipped["message"]


def test_hand_written_loss_keeps_the_caveat(runs: tuple[Path, dict[str, Findings | BaseException]]) -> None:
    """A loss that is its own autograd Function records no reduction: a mean is assumed, and the
    warning says when the sum would be intended."""
    found = p15(runs, "custom_function_not_divided")
    assert len(found) == 1 and f"by {K}" in found[0]["message"], found
    assert HEDGE in found[0]["message"] and "backward()" in _line(found[0]["src"])


@pytest.mark.parametrize("name", CORRECT)
def test_correct_accumulation_is_silent(runs: tuple[Path, dict[str, Findings | BaseException]], name: str) -> None:
    assert p15(runs, name) == []
    res = runs[1][name]
    assert not isinstance(res, BaseException)
    assert not [f for f in res if f["severity"] in ("error", "warning")], res


@pytest.mark.parametrize("name", MICRO_MEANS)
def test_sum_loss_divided_by_the_micro_batch_size(runs: tuple[Path, dict[str, Findings | BaseException]],
                                                  name: str) -> None:
    found = p15(runs, name)
    assert len(found) == 1, found
    f = found[0]
    assert f["severity"] == "warning" and f["steps"] == list(range(int(STEPS))), f
    assert f["data"]["micro_batches"] == [K] * int(STEPS) and f["data"]["micro_batch_size"] == B
    assert f"micro-batch size ({B})" in f["message"] and f"{K}x larger" in f["message"]
    assert HEDGE not in f["message"]
    assert f"({K} * {B} = {K * B})" in f["fix"] and "accum_steps * micro_batch_size" in f["fix"]
    assert "backward()" in _line(f["src"])
    # the finding opens the captured step's graph at the division, which recorded the micro-batch size
    graph = next(e for e in iter_events(runs[0] / f"{name}.tscope") if e["kind"] == "graph")
    target = f["targets"][0]
    assert target["step"] == graph["step"] and target["node"] == graph["root"]
    root = next(n for n in graph["nodes"] if n["id"] == graph["root"])
    assert root["name"] in ("DivBackward0", "MulBackward0") and root["scalar"] in (B, 1 / B), root


def test_sum_of_token_losses_divided_by_the_micro_batch_tokens(
        runs: tuple[Path, dict[str, Findings | BaseException]]) -> None:
    """A language model's loss summed over tokens and divided by the micro-batch's B * T tokens:
    a mean over the micro-batch, K of them summed into .grad."""
    found = p15(runs, TOKENS)
    assert len(found) == 1, found
    f = found[0]
    assert f["severity"] == "warning" and f["steps"] == list(range(int(STEPS))), f
    assert f"the {B * T} elements of its {B}x{T} micro-batch" in f["message"] and f"{K}x larger" in f["message"]
    assert f["data"]["micro_batch_size"] == B and f["data"]["divided_by"] == B * T
    assert f"({K} * {B * T} = {K * B * T})" in f["fix"] and "element count" in f["fix"]
    assert "backward()" in _line(f["src"])
