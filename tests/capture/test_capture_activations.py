"""Each module's output values on captured steps (``StepEvent.activations``): what the
forward made, as TorchLens shows per layer and W&B reads dead units from -- a ReLU that never
fires (zeros ~1), a tanh pushed into saturation (min/max at -1/1), a residual stream growing
layer by layer (rms).  Checked against forward hooks the test registers on the same modules,
every call of a module used twice counted, with and without the native extension (its C++
pass and the torch path read them apart); reading them changes no number of the training."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(32, 32)
        self.tanh = nn.Tanh()
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tanh(self.fc2(self.act(self.fc1(x))))
        h = self.tanh(self.fc2(h) * 5)  # fc2 and tanh twice; the second tanh saturates
        return self.head(h)


ORDER = ["fc1", "act", "fc2", "tanh", "head", ""]  # by the end of their first call; "" the model


def _train(path: Path | None, mode: str, evaluate: bool = False) -> tuple[list[float], list[dict[str, list[torch.Tensor]]]]:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: dict[str, list[torch.Tensor]] = {}
    for name, m in model.named_modules():
        m.register_forward_hook(lambda m, a, out, name=name: seen.setdefault(name, []).append(out.detach().clone()))
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode) if path else None
    losses, by_step = [], []
    for _ in range(6):
        seen.clear()
        opt.zero_grad()
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        by_step.append({k: list(v) for k, v in seen.items()})
        if evaluate:  # a validation forward inside the step: not the training forward
            with torch.no_grad():
                model(torch.randn(4, 8) * 100)
        opt.step()
        losses.append(loss.item())
    if watch:
        watch.close()
    return losses, by_step


def _check(row: dict[str, Any], outs: list[torch.Tensor]) -> None:
    flat = torch.cat([o.flatten() for o in outs]).double()
    assert row["numel"] == flat.numel()
    assert row["norm"] == pytest.approx(flat.norm().item(), rel=1e-5)
    assert row["rms"] == pytest.approx(flat.norm().item() / math.sqrt(flat.numel()), rel=1e-5)
    assert row["min"] == flat.min().item() and row["max"] == flat.max().item()
    assert row["zero_frac"] == pytest.approx((flat == 0).double().mean().item(), abs=1e-12)
    assert row["nan"] == 0 and row["inf"] == 0
    assert row.get("calls", 1) == len(outs)


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("mode", ["default", "full"])
def test_module_outputs_on_captured_steps_equal_what_the_forward_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, native: bool) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    plain, _ = _train(None, mode)
    path = tmp_path / "run.tscope"
    losses, by_step = _train(path, mode, evaluate=True)
    assert [x.hex() for x in losses] == [x.hex() for x in _train(None, mode, evaluate=True)[0]]
    assert len(plain) == len(losses)
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    captured = [e for e in steps if e["graph_captured"]]
    assert captured and all("activations" in e for e in captured)
    assert not [e for e in steps if not e["graph_captured"] and "activations" in e]
    if mode == "full":
        assert len(captured) == 6
    for e in captured:
        rows = e["activations"]
        assert [r["module"] for r in rows] == ORDER  # the no_grad evaluation's calls are not in them
        for r in rows:
            _check(r, by_step[e["step"]][r["module"]])
        by = {r["module"]: r for r in rows}
        assert by["fc2"]["calls"] == by["tanh"]["calls"] == 2
        assert by["act"]["min"] == 0.0 and 0 < by["act"]["zero_frac"] < 1  # a ReLU's zeros
        assert by["tanh"]["max"] <= 1.0 and by["tanh"]["min"] >= -1.0


def test_light_mode_reads_no_output(tmp_path: Path) -> None:
    path = tmp_path / "light.tscope"
    _train(path, "light")
    assert not [e for e in iter_events(path) if e["kind"] == "step" and "activations" in e]
