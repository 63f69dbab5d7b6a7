"""Frames of the training frameworks that call torch for the user (Lightning's
``manual_backward``, accelerate's ``backward``, the HF Trainer) are not the user's: the
recorded lines (``backward_src``, a finding's source) are the user's call above them, and a
framework's own ``.to()`` of a batch already there is no redundant copy of the user's (P12).
A framework stands in for one here: a module under ``site-packages/lightning/``."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

_FRAMEWORK = '''
def manual_backward(loss):
    loss.backward()

def to_device(batch):
    for _ in range(40):  # a framework moving every field of a batch, every step
        batch = batch.to("cpu")
    return batch

def fit(step, n):
    for i in range(n):
        step(i)
'''


def _framework(tmp_path: Path) -> ModuleType:
    path = tmp_path / "site-packages" / "lightning" / "pytorch" / "core" / "module.py"
    path.parent.mkdir(parents=True)
    path.write_text(_FRAMEWORK)
    spec = importlib.util.spec_from_file_location("fake_lightning_module", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_the_users_line_above_a_frameworks_frames(tmp_path: Path, mode: str) -> None:
    fw = _framework(tmp_path)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "fw.tscope"

    def training_step(i: int) -> None:  # no zero_grad: P5, pointed at the user's backward line
        x = fw.to_device(torch.randn(8, 4))
        loss = model(x).pow(2).mean()
        fw.manual_backward(loss)
        opt.step()

    lines, first = inspect.getsourcelines(training_step)
    line = first + next(i for i, text in enumerate(lines) if "fw.manual_backward(loss)" in text)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        fw.fit(training_step, 6)
    events = list(iter_events(path))
    steps = [e for e in events if e["kind"] == "step"]
    here = f"{Path(__file__).name}:{line}"
    assert len(steps) == 6 and all(s["backward_src"] == [here] for s in steps), steps[0]["backward_src"]
    noops = [n for s in steps for n in s.get("events", []) if n["what"] == "noop_to"]
    assert noops == []  # the framework's .to() calls, not the user's
    found: list[dict[str, Any]] = [dict(f) for f in diagnose(events)]
    (p5,) = [f for f in found if f["code"] == "P5"]
    assert p5["src"] == here and not [f for f in found if f["code"] == "P12"], found
