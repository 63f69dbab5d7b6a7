"""P1 "No backward reaches the model" when the model's forward built no graph at all (QA 46a).

The loss still has a graph through a parameter outside the model -- a learned temperature next
to it, a bias added to its output -- so ``loss.backward()`` raises nothing, while every
parameter of the model keeps ``.grad`` None and ``optimizer.step()`` skips them: the model never
trains, and the doctor said "no problems found".  Two ways in: the training forward slipped into
a ``torch.no_grad()`` block beside a logging forward, and an ensemble's output rebuilt from
``.tolist()``.  Their fixed twins are clean."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _line(marker: str) -> str:
    text = Path(__file__).read_text().splitlines()
    return f"{Path(__file__).name}:{next(i for i, t in enumerate(text, 1) if t.rstrip().endswith(marker))}"


def _no_grad_forward(path: Path, mode: str, fixed: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))
    logit_scale = nn.Parameter(torch.zeros(()))  # a learned temperature kept next to the model
    opt = torch.optim.Adam([*model.parameters(), logit_scale], lr=1e-2)
    ref_x = torch.randn(64, 16)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(12):
            x, y = torch.randn(32, 16), torch.randint(0, 5, (32,))
            with torch.no_grad():
                ref = model(ref_x).mean()  # a statistic for the logs
                if not fixed:
                    logits = model(x)  # (the training forward, under no_grad)
            if fixed:
                logits = model(x)
            loss = F.cross_entropy(logits * logit_scale.exp(), y) + 0 * ref
            opt.zero_grad()
            loss.backward()
            opt.step()


class _Ensemble(nn.Module):
    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.fixed = fixed
        self.trunk = nn.Linear(16, 16)
        self.heads = nn.ModuleList([nn.Linear(16, 1) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.trunk(x))
        outs = [head(h).squeeze(-1) for head in self.heads]
        if self.fixed:
            return torch.stack(outs, 1).mean(1)
        return torch.tensor([o.tolist() for o in outs]).mean(0)


def _rebuilt_output(path: Path, mode: str, fixed: bool) -> None:
    torch.manual_seed(0)
    model = _Ensemble(fixed)
    bias = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([*model.parameters(), bias], lr=0.05)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(12):
            x, y = torch.randn(32, 16), torch.randn(32)
            opt.zero_grad()
            loss = F.mse_loss(model(x) + bias, y)  # (the ensemble's forward)
            loss.backward()
            opt.step()


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("case", ["no_grad", "no_graph"])
def test_a_model_whose_forward_builds_no_graph_never_trains(tmp_path: Path, mode: str, case: str) -> None:
    path = tmp_path / "run.tscope"
    (_no_grad_forward if case == "no_grad" else _rebuilt_output)(path, mode, fixed=False)
    found = [dict(f) for f in diagnose(list(iter_events(path)))]
    p1 = [f for f in found if f["code"] == "P1" and f["title"] == "No backward reaches the model"]
    assert len(p1) == 1, found
    (f,) = p1
    assert f["severity"] == "error" and f["steps"] == list(range(12))
    if case == "no_grad":
        assert f["src"] == _line("# (the training forward, under no_grad)")
        assert "ran under torch.no_grad()" in f["message"] and "no_grad" in f["fix"]
    else:
        assert f["src"] == _line("# (the ensemble's forward)")
        assert "returned an output with no autograd graph" in f["message"] and "torch.stack" in f["fix"]
    assert "parameters outside the model" in f["message"]


@pytest.mark.parametrize("case", ["no_grad", "no_graph"])
def test_the_fixed_loops_are_clean(tmp_path: Path, case: str) -> None:
    path = tmp_path / "run.tscope"
    (_no_grad_forward if case == "no_grad" else _rebuilt_output)(path, "default", fixed=True)
    found = [dict(f) for f in diagnose(list(iter_events(path)))]
    assert not [f for f in found if f["severity"] in ("warning", "error")], found


def test_a_warm_up_under_no_grad_then_fine_tuning_is_no_finding(tmp_path: Path) -> None:
    """The backbone run under ``no_grad`` for the first 8 of 12 steps while a head beside it
    trains, then fine-tuned with the same optimizer: it trains, so no "never trains" (QA 46d)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
    head = nn.Linear(32, 5)
    opt = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=1e-3)
    path = tmp_path / "warmup.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for step in range(12):
            x, y = torch.randn(32, 16), torch.randint(0, 5, (32,))
            if step < 8:
                with torch.no_grad():
                    h = model(x)
            else:
                h = model(x)
            loss = F.cross_entropy(head(h), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    found = [dict(f) for f in diagnose(list(iter_events(path)))]
    assert not [f for f in found if f["title"] == "No backward reaches the model"], found
