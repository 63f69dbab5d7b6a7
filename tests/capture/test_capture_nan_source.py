"""mode="full" checks the outputs of the NaN-source ops (log, div, sqrt, exp...) on every
recorded forward, with ``check_nan`` off: such an op is flagged "nan" only if it made the
NaN/Inf itself, not when the NaN/Inf came in through one of its inputs.  QA's case: a LayerNorm
overflow in the model, then ``loss = F.mse_loss(out, y) / accum_steps`` -- the doctor said
"NaN/Inf first produced by aten::div", pointing at the user's division.  Both op recorders
(the native one and the Python one)."""

from __future__ import annotations

import math
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope import _native

BAD = 4  # the step whose forward goes non-finite


class Net(nn.Module):
    """Linear -> LayerNorm -> Linear; ``poison`` makes the forward non-finite on one step."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 16)
        self.norm = nn.LayerNorm(16)
        self.out = nn.Linear(16, 1)
        self.poison = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        if self.poison == "inf_times_0":
            h = h * float("inf") * 0  # a mul makes the NaN: not a NaN source
        elif self.poison == "overflow":
            h = h * 1e38 * 1e38  # a mul overflows to +-inf, and the LayerNorm makes NaN of it (QA's case)
        elif self.poison == "log":
            h = h + torch.log(h - h)  # log(0): -inf, made by the log
        elif self.poison == "div":
            h = h / torch.zeros(())  # x / 0: +-inf (NaN where x is 0), made by the div
        elif self.poison == "masked_row":  # attention over keys all masked (an empty sequence)
            mask = torch.zeros_like(h, dtype=torch.bool)
            mask[0] = True  # the first row: -inf everywhere
            h = torch.softmax(h.masked_fill(mask, float("-inf")), dim=-1)  # its -inf came in, its NaN did not
        elif self.poison == "div_":
            h = h.clone()
            h.div_(torch.zeros(()))  # in place: its `self` holds the result, not what came in
        return self.out(torch.relu(self.norm(h)))


def _train(path: Path | None, poison: str) -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    losses = []
    with torchscope.watch(model, opt, server=None, record=path, mode="full") if path else nullcontext():
        for step in range(BAD + 2):
            x = torch.randn(8, 4, generator=g)
            y = torch.randn(8, 1, generator=g)
            model.poison = poison if step == BAD else ""
            loss = F.mse_loss(model(x), y) / 4  # the user's `loss / accum_steps`
            losses.append(loss.item())
            opt.zero_grad()
            loss.backward()
            if torch.isfinite(loss):
                opt.step()
    return losses, [float(p.detach().sum()) for p in model.parameters()]


def _recorder(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, _native._error


def _run(tmp_path: Path, poison: str) -> tuple[list[str], str]:
    """Train with and without the capture (the same numbers), then: the names of the forward
    ops flagged "nan" at the bad step, and what ``torchscope doctor`` says."""
    plain_losses, plain = _train(None, poison)
    path = tmp_path / f"{poison}.tscope"
    losses, watched = _train(path, poison)
    assert watched == plain and [str(v) for v in losses] == [str(v) for v in plain_losses]
    assert not math.isfinite(losses[BAD]) and all(math.isfinite(v) for i, v in enumerate(losses) if i != BAD)
    ops = torchscope.load(str(path)).graph(BAD)["ops"]
    flagged = [o["name"] for o in ops if "nan" in o.get("flags", ()) and o.get("phase") == "forward"]
    doctor = subprocess.run([sys.executable, "-m", "torchscope.doctor.cli", str(path)], capture_output=True,
                            text=True, timeout=300)
    assert doctor.returncode in (0, 1), doctor.stderr
    return flagged, doctor.stdout + doctor.stderr


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("poison", ["inf_times_0", "overflow"])
def test_a_nan_that_came_into_a_div_does_not_flag_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     native: bool, poison: str) -> None:
    """The NaN is made by ops that are not NaN sources (a mul, a LayerNorm: not checked with
    check_nan off) and flows through the loss into the user's `/ 4`: that div read a NaN, it
    made nothing, and no source op made it either -- no forward op is flagged, and the doctor
    does not blame the division (before, it said "first produced by aten::div at step 4")."""
    _recorder(monkeypatch, native)
    flagged, said = _run(tmp_path, poison)
    assert flagged == [], flagged
    assert "P4" in said, said
    assert "first produced by aten::div" not in said, said


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("poison", ["log", "div"])
def test_a_source_that_makes_the_nan_is_flagged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool,
                                                poison: str) -> None:
    """log(0) and x / 0 on finite inputs make the NaN/Inf: the op is flagged (the only one: the
    ops after it, the loss's `/ 4` among them, read it) and the doctor names it."""
    _recorder(monkeypatch, native)
    flagged, said = _run(tmp_path, poison)
    assert flagged == [f"aten::{poison}"], flagged
    assert f"first produced by aten::{poison} at step {BAD}" in said, said


@pytest.mark.parametrize("native", [True, False])
def test_an_inplace_source_is_flagged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """`h.div_(zero)` on a finite h: its `self` shares the output's storage and holds the result,
    so it is not taken for a non-finite input -- the div_ made the Inf and is flagged."""
    _recorder(monkeypatch, native)
    flagged, said = _run(tmp_path, "div_")
    assert flagged == ["aten::div_"], flagged
    assert f"first produced by aten::div_ at step {BAD}" in said, said


@pytest.mark.parametrize("native", [True, False])
def test_a_softmax_over_a_row_masked_wholly_is_flagged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       native: bool) -> None:
    """A softmax over a row of -inf only (attention whose keys are all masked: an empty
    sequence) makes NaN of infinities: it read -inf, not NaN, so it made the NaN and is flagged,
    and the doctor says what such a row is; partly masked rows (-inf among finite scores) come
    out finite and flag nothing (the other steps)."""
    _recorder(monkeypatch, native)
    flagged, said = _run(tmp_path, "masked_row")
    assert flagged == ["aten::_softmax"], flagged
    assert f"first produced by aten::_softmax at step {BAD}" in said, said
    assert "A softmax over a row that is -inf everywhere gives NaN" in said, said
