"""P7 on real captures of PyTorch's word-language-model example gone wrong: the ``(h, c)`` state
nested in the model's output carried into the next batch without ``repackage_hidden`` (the
backward "fixed" with ``retain_graph=True``), and ``total_loss += loss`` reset every epoch (a
graph piled up over each epoch, as high late in the run as early).  ``loss.item()`` is no
finding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

V = 20


class _LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, 16)
        self.rnn = nn.LSTM(16, 16)
        self.out = nn.Linear(16, V)

    def forward(self, x: torch.Tensor, hidden: Any) -> tuple[torch.Tensor, Any]:
        y, hidden = self.rnn(self.embed(x), hidden)
        return nn.functional.log_softmax(self.out(y), -1).view(-1, V), hidden


def _run(path: Path, how: str) -> tuple[list[dict[str, Any]], list[bool]]:
    torch.manual_seed(0)
    model = _LM()
    data = torch.randint(0, V, (3 * 10 * 6 + 1, 4))
    totals = []
    with torchscope.watch(model, None, server=None, record=path):
        for epoch in range(3):
            hidden = (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
            total_loss: Any = 0.0
            for i in range(10):
                start = (epoch * 10 + i) * 6
                x, y = data[start:start + 6], data[start + 1:start + 7].reshape(-1)
                if how != "state":
                    hidden = tuple(h.detach() for h in hidden)  # repackage_hidden
                model.zero_grad()
                out, hidden = model(x, hidden)
                loss = nn.functional.nll_loss(out, y)
                loss.backward(retain_graph=how == "state")
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-0.5)  # the example's own SGD
                total_loss += loss if how == "total" else loss.item()
            # the epoch's running loss holds a graph (kept in no list: reset by the next epoch)
            totals.append(getattr(total_loss, "grad_fn", None) is not None)
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P7"], totals


@pytest.mark.parametrize("how", ["state", "total", "item"])
def test_graphs_kept_by_the_carried_state_or_an_epochs_running_loss_are_p7(tmp_path: Path, how: str) -> None:
    found, totals = _run(tmp_path / "run.tscope", how)
    # what plain PyTorch says: the running loss holds a graph (the epoch's steps), loss.item() none
    assert totals == [how == "total"] * 3
    if how == "item":
        assert found == []
        return
    assert [f["title"] for f in found] == ["Graph kept alive across steps"], found
    kept = "fed into the next step's forward" if how == "state" else "the loss that backward() was called on"
    assert kept in found[0]["message"], found[0]["message"]
