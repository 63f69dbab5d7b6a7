"""P6 and P11 on real captures: a validation run every few steps with neither ``model.eval()``
nor ``torch.no_grad()`` builds a graph nobody uses and evaluates with dropout on -- both told,
as warnings, at its line.  A second forward of every step whose output is only used detached
(a consistency target) stays P6's info, with no P11; the same validation done right is no
finding."""

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


def _run(path: Path, how: str) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xv, yv = torch.randn(128, 16), torch.randint(0, 3, (128,))
    accuracies = []
    with torchscope.watch(model, opt, server=None, record=path):
        for step in range(20):
            x, y = torch.randn(32, 16), torch.randint(0, 3, (32,))
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            if how == "consistency":
                target = model(x + 0.01 * torch.randn_like(x)).detach()  # a second view, every step
                loss = loss + F.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            if step % 5 == 4 and how == "train mode":
                accuracies.append((model(xv).argmax(1) == yv).float().mean().item())  # validation
            if step % 5 == 4 and how == "right":
                model.eval()
                with torch.no_grad():
                    accuracies.append((model(xv).argmax(1) == yv).float().mean().item())
                model.train()
    return [dict(f) for f in diagnose(iter_events(path))]


def test_a_validation_in_train_mode_without_no_grad_is_p6_and_p11(tmp_path: Path) -> None:
    found = _run(tmp_path / "run.tscope", "train mode")
    by_code = {f["code"]: f for f in found}
    assert sorted(by_code) == ["P11", "P6"], found
    p6, p11 = by_code["P6"], by_code["P11"]
    line = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.endswith("# validation"))
    for f in (p6, p11):
        assert f["severity"] == "warning" and f["src"] == f"{Path(__file__).name}:{line}", f
        assert f["steps"] == [4, 9, 14, 19], f  # each told with the step it ran after
    assert "without torch.no_grad()" in p6["message"] and "model.eval()" in p6["message"]
    assert p11["modules"] == ["2"] and "in train mode" in p11["message"]  # the dropout module


@pytest.mark.parametrize("how", ["consistency", "right"])
def test_a_detached_second_forward_or_a_proper_validation_is_no_warning(tmp_path: Path, how: str) -> None:
    found = _run(tmp_path / "run.tscope", how)
    assert [f for f in found if f["severity"] != "info"] == [], found
    assert [f["code"] for f in found] == (["P6"] if how == "consistency" else []), found


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_a_dropout_of_p_zero_has_no_mode_to_be_wrong_in(tmp_path: Path, p: float) -> None:
    """A ``no_grad`` forward in train mode every step (features for a queue, GradCache's first
    pass): with a real dropout it evaluates with dropout on (P11); ``Dropout(0.0)`` -- what a
    transformer built with ``dropout=0.0`` holds -- computes the same in both modes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(p), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(10):
            x = torch.randn(16, 8)
            with torch.no_grad():
                cached = model(x)
            loss = ((model(x) - cached.flip(0)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    session = next(e for e in iter_events(path) if e.get("kind") == "session")
    assert [m["path"] for m in session["modules"] if m.get("mode_inert")] == (["1"] if p == 0 else [])
    found = [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P11"]
    assert [f["modules"] for f in found] == ([] if p == 0 else [["1"]]), found
