"""P11 on real captures: a dropout function called in ``forward`` with ``training`` left at its
default (True) keeps dropping activations after ``model.eval()`` -- told at its line, in its
module; the same call with ``training=self.training``, an ``nn.Dropout`` module and Monte Carlo
dropout asked for explicitly are no finding.  Training and the evaluations are unchanged by the
watch, and the probe leaves no function mode behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _helper_drop(x: torch.Tensor) -> torch.Tensor:
    return F.dropout(x, 0.3)  # a helper of the forward's


class Block(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.5)
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(x))
        if self.how == "default":
            return F.dropout(h, p=0.5)
        if self.how == "dropout1d":
            return F.dropout1d(h.unsqueeze(-1), 0.5).squeeze(-1)
        if self.how == "helper":
            return _helper_drop(h)
        if self.how == "self.training":
            return F.dropout(h, p=0.5, training=self.training)
        if self.how == "monte carlo":
            return F.dropout(h, p=0.5, training=True)
        if self.how in ("ternary", "ternary-right"):
            return F.dropout(h, p=0.5, training=self.training) if self.how == "ternary-right" else F.dropout(h, p=0.5)
        if self.how == "multiline":
            return F.dropout(
                h, p=0.5,
                training=self.training)
        return self.drop(h)  # "module"


LINES = {"default": "return F.dropout(h, p=0.5)", "dropout1d": "return F.dropout1d(h.unsqueeze(-1), 0.5).squeeze(-1)",
         "helper": "return F.dropout(x, 0.3)  # a helper of the forward's",
         # (the call that ran, not the line: "training" in the other branch hid it, QA 44b)
         "ternary": 'return F.dropout(h, p=0.5, training=self.training) if self.how == "ternary-right" else '
                    'F.dropout(h, p=0.5)'}


def _run(path: Path | None, how: str, mode: str = "default") -> tuple[list[torch.Tensor], list[list[str]]]:
    """20 SGD steps, an evaluation under no_grad in eval mode every 5; the final parameters and
    the evaluations' outputs, and the function modes on the stack after each evaluation."""
    torch.manual_seed(0)
    model = nn.Sequential(Block(how), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode) if path else None
    xv = torch.randn(64, 16)
    outs: list[torch.Tensor] = []
    depths: list[list[str]] = []
    for step in range(20):
        model.train()
        x, y = torch.randn(32, 16), torch.randint(0, 3, (32,))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if step % 5 == 4:
            model.eval()
            with torch.no_grad():
                outs.append(model(xv))
            stack = torch._C._len_torch_function_stack()
            depths.append([type(torch._C._get_function_stack_at(i)).__name__ for i in range(stack)])
    if watch is not None:
        watch.close()
    return [p.detach().clone() for p in model.parameters()] + outs, depths


def _p11(path: Path) -> list[dict[str, Any]]:
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P11"]


@pytest.mark.parametrize("how", list(LINES))
def test_a_dropout_function_at_its_default_in_eval_mode_is_p11_at_its_line(tmp_path: Path, how: str) -> None:
    path = tmp_path / "run.tscope"
    watched, depths = _run(path, how)
    plain, plain_depths = _run(None, how)
    assert all(torch.equal(a, b) for a, b in zip(watched, plain, strict=True))
    # what plain PyTorch does: the evaluation is randomised (two evaluations of one input differ)
    model = nn.Sequential(Block(how), nn.Linear(32, 3)).eval()
    x = torch.randn(8, 16)
    assert not torch.equal(model(x), model(x))
    found = _p11(path)
    assert [f["title"] for f in found] == ["Dropout function left on in eval mode"], found
    f = found[0]
    assert f["severity"] == "warning" and "training=self.training" in f["fix"]
    line = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.strip() == LINES[how])
    assert f["src"] == f"test_doctor_eval_dropout.py:{line}"
    # the module whose forward called it; a helper function's call is the model's
    assert f["modules"] == ([""] if how == "helper" else ["0"]), f
    assert f["steps"] == [4], f  # the first evaluation ran after step 4
    # the probe came off the stack with each evaluation's forward (the watch's own mode is on
    # from a forward's end to optimizer.step())
    assert plain_depths == [[]] * 4 and depths == [["Interposer"]] * 4, depths


@pytest.mark.parametrize("how", ["self.training", "monte carlo", "module", "ternary-right", "multiline"])
def test_dropout_that_follows_the_mode_or_is_asked_for_is_no_finding(tmp_path: Path, how: str) -> None:
    path = tmp_path / "run.tscope"
    _run(path, how)
    assert _p11(path) == []


@pytest.mark.parametrize("mode", ["light", "full"])
def test_the_other_modes_see_it_too(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "run.tscope"
    _run(path, "default", mode=mode)
    assert [f["title"] for f in _p11(path)] == ["Dropout function left on in eval mode"]
