"""P1 where the loop copies a tensor that requires grad with a copy constructor (QA round 29):
``torch.tensor(aux)`` / ``aux.new_tensor(aux)`` "to make it a tensor" cuts the auxiliary head off
the loss.  The finding names that call and its line (it said the head's result "ends at
aten::add, whose result the loss never uses" -- the loss itself)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

COPIES = {"torch.tensor": "aux = torch.tensor(aux)", "new_tensor": "aux = aux.new_tensor(aux)"}
LABELS = {"torch.tensor": "tensor()", "new_tensor": "Tensor.new_tensor()"}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Linear(10, 3)
        self.aux = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.main(x), self.aux(x)


@pytest.mark.parametrize("mode", ["default", "full"])
@pytest.mark.parametrize("how", list(COPIES))
def test_a_copy_constructor_on_the_loss_path_is_the_cut(tmp_path: Path, how: str, mode: str) -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    path = tmp_path / "copy.tscope"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own advice against copy-constructing a tensor
        with torchscope.watch(model, opt, server=None, record=path, mode=mode):
            for _ in range(6):
                x, y, ya = torch.randn(16, 10), torch.randint(0, 3, (16,)), torch.randn(16, 1)
                out, aux = model(x)
                if how == "torch.tensor":
                    aux = torch.tensor(aux)
                if how == "new_tensor":
                    aux = aux.new_tensor(aux)
                loss = F.cross_entropy(out, y) + 0.5 * F.mse_loss(aux, ya)
                opt.zero_grad()
                loss.backward()
                opt.step()
    (p1,) = [f for f in diagnose(iter_events(path)) if f["code"] == "P1"]
    assert p1["severity"] == "error" and p1["params"] == ["aux.0.weight", "aux.0.bias", "aux.2.weight", "aux.2.bias"]
    assert f"their paths to the loss break at {LABELS[how]}" in p1["message"], p1["message"]
    lines = Path(__file__).read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if text.strip() == COPIES[how])
    assert p1["src"] == f"{Path(__file__).name}:{line}"
    assert "torch.tensor(t)" in p1["fix"]
