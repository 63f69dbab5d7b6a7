"""A small run in which a part of torchscope's own per-step code fails from a given step on
(a bug of ours, made here by replacing one of the capture's functions): it prints its losses.

    python train_capture_off.py RECORD MODE FAIL_AT [PART]

PART: ``step`` (the step's record: its ``_follow_structure`` raises), ``activations`` (the
module outputs' rows raise) or ``adopt`` (``watch(model)`` without an optimizer, whose adopting
of the loop's optimizer raises, inside the global hook of optimizer.step(); FAIL_AT is ignored);
FAIL_AT -1: nothing fails.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

import torchscope
from torchscope import _watch

record, mode, fail_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
part = sys.argv[4] if len(sys.argv) > 4 else "step"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
if fail_at >= 0:
    if part == "step":  # a method the step's record alone calls
        original = _watch.Watch._follow_structure

        def failing(self: _watch.Watch, *args: object) -> None:
            if self._step >= fail_at:
                raise NameError("name 'something' is not defined")
            original(self, *args)  # type: ignore[arg-type]

        _watch.Watch._follow_structure = failing  # type: ignore[method-assign]
    elif part == "adopt":  # run inside every optimizer's step(): a global hook of ours

        def failing_adopt(self: _watch.Watch, *args: object) -> None:
            raise NameError("name 'something' is not defined")

        _watch.Watch._adopt = failing_adopt  # type: ignore[method-assign]
    else:
        rows = _watch._output_row

        def failing_rows(*args: object) -> object:
            if watch._step >= fail_at:
                raise NameError("name 'something' is not defined")
            return rows(*args)  # type: ignore[arg-type]

        _watch._output_row = failing_rows  # type: ignore[assignment]
watch = torchscope.watch(model, None if part == "adopt" else opt, server=None, record=record, mode=mode)
losses = []
for _ in range(12):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(torch.randn(16, 8)), torch.randn(16, 1))
    loss.backward()
    opt.step()
    losses.append(loss.item().hex())
watch.close()
print("LOSSES", " ".join(losses))
