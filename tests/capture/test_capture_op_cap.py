"""A step past the per-step op cap: its graph holds the first ops, counts the rest, and says so
-- once on the terminal and in the session's log, and in the doctor's note -- while training
runs exactly as unwatched."""

from __future__ import annotations

import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope import _native
from torchscope.sessionfile import iter_events

_CAP = 3_000  # a smaller max_ops than the default 50,000: the same code, faster to run


class _Chain(nn.Module):
    """A forward of ``n`` scalings: one op each, so a step runs well over the cap."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        for _ in range(self.n):
            h = h * 1.0
        return h


def _train(path: Path | None, steps: int) -> list[float]:
    torch.manual_seed(0)
    model = _Chain(2_000)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses: list[float] = []
    with torchscope.watch(model, opt, server=None, record=path, mode="full", max_ops=_CAP) if path else nullcontext():
        for _ in range(steps):
            opt.zero_grad()
            loss = model(torch.ones(2, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


@pytest.mark.parametrize("native", [True, False])
def test_a_step_over_the_op_cap_holds_the_first_ops_and_says_so(
    tmp_path: Path, native: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, _native._error
    path = tmp_path / "long.tscope"
    assert _train(path, 2) == _train(None, 2)
    events = list(iter_events(path))
    start = next(ev for ev in events if ev["kind"] == "session")
    assert start["settings"]["max_ops"] == _CAP
    graphs = [ev for ev in events if ev["kind"] == "graph"]
    assert [g["step"] for g in graphs] == [0, 1]
    for g in graphs:
        # 2,000 forward multiplications and as many in their backward: past the cap
        assert len(g["ops"]) == _CAP
        assert g["shed_ops"] > 500 and g["complete"] is False
        names = [op["name"] for op in g["ops"]]
        assert names.count("aten::mul") >= 2_000  # the first ops are the ones kept
    said = [ev["message"] for ev in events if ev["kind"] == "log" and "ops; its graph holds" in ev["message"]]
    assert len(said) == 1, said  # once a run, not once a step
    assert f"holds the first {_CAP:,}" in said[0]
    assert f"ran {_CAP + graphs[0]['shed_ops']:,} ops" in said[0]
    assert said[0] in capsys.readouterr().err

    doctor = subprocess.run([sys.executable, "-m", "torchscope.doctor.cli", str(path)], capture_output=True, text=True,
                            timeout=300)
    assert doctor.returncode in (0, 1), doctor.stderr
    assert f"the graphs of 2 steps are partial (step 0, 1: a step's graph holds its first {_CAP:,} ops)" \
        in doctor.stderr
