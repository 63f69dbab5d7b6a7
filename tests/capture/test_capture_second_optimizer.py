"""A second optimizer stepping right after the watched one trains the parameters the watched
one does not hold: they are not ``not_trained``, from the first step on (QA 42a: step 0 named
the head that ``opt_h.step()`` trains every step; the second optimizer had not stepped yet).
Parameters that no optimizer holds stay ``not_trained`` on every step, the first included."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


def _run(path: Path, mode: str, second: bool) -> tuple[list[str], list[dict], list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    body, head = model[0], model[2]
    opt_a = torch.optim.SGD(body.parameters(), lr=0.05, momentum=0.9)
    opt_h = torch.optim.Adam(head.parameters(), lr=1e-2)
    w = torchscope.watch(model, opt_a, server=None, record=path, mode=mode) if path.name else None
    losses = []
    for _ in range(4):
        opt_a.zero_grad()
        opt_h.zero_grad()
        x = torch.randn(16, 8)
        out = model(x)
        loss = nn.functional.cross_entropy(out, torch.randint(0, 3, (16,)))
        loss.backward()
        opt_a.step()
        if second:
            opt_h.step()
        losses.append(loss.item())
    if w is not None:
        w.close()
    names = [p for p, _ in model.named_parameters()]
    steps = [e for e in iter_events(path) if e["kind"] == "step"] if path.name else []
    return names, steps, losses


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_second_optimizers_parameters_are_trained_from_the_first_step(tmp_path: Path, mode: str) -> None:
    names, steps, losses = _run(tmp_path / "run.tscope", mode, second=True)
    assert [v.hex() for v in losses] == [v.hex() for v in _run(Path(), mode, second=True)[2]]
    assert [e["step"] for e in steps] == [0, 1, 2, 3]
    for e in steps:
        assert not e["grads"].get("not_trained"), (e["step"], [names[i] for i in e["grads"]["not_trained"]])
    assert all(e["loss"] is not None and None not in e["grads"]["norm"] for e in steps)  # the deferred step is whole


@pytest.mark.parametrize("mode", ["light", "default"])
def test_parameters_no_optimizer_steps_are_not_trained_on_every_step(tmp_path: Path, mode: str) -> None:
    names, steps, _ = _run(tmp_path / "run.tscope", mode, second=False)
    assert [e["step"] for e in steps] == [0, 1, 2, 3]
    for e in steps:
        assert [names[i] for i in e["grads"]["not_trained"]] == ["2.weight", "2.bias"], e["step"]
