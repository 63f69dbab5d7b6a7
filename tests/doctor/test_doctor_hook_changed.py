"""P13's other half: a forward hook that keeps a module's output (``output.detach()``) while an
in-place op later in the forward (``nn.ReLU(inplace=True)``) writes into it -- the hook reads
values the forward overwrote.  Checked against plain PyTorch; its correct twins stay silent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _run(path: Path | None, keep: str, inplace: bool, mode: str = "default") -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=inplace), nn.Linear(16, 1))
    kept: list[torch.Tensor] = []
    stats: list[float] = []

    def hook(m: nn.Module, args: Any, out: torch.Tensor) -> None:
        if keep == "detach":
            kept.append(out.detach())
        elif keep == "clone":
            kept.append(out.detach().clone())
        else:
            stats.append(out.detach().min().item())  # read at once: nothing kept

    model[0].register_forward_hook(hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode) if path is not None else None
    losses = []
    try:
        for _ in range(4):
            kept.clear()
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        if watch is not None:
            watch.close()
    return losses, kept


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_hook_keeping_an_output_a_later_in_place_op_changes_is_told(tmp_path: Path, mode: str) -> None:
    plain, kept = _run(None, "detach", True)
    # plain PyTorch: what the Linear's hook kept went through the ReLU after it (no negative left)
    assert kept and float(kept[0].min()) >= 0.0
    _, not_inplace = _run(None, "detach", False)
    assert float(not_inplace[0].min()) < 0.0  # the Linear's own output has negatives
    path = tmp_path / "run.tscope"
    losses, _ = _run(path, "detach", True, mode)
    assert [x.hex() for x in losses] == [x.hex() for x in plain]
    found = [dict(f) for f in diagnose(iter_events(path))]
    (f,) = [f for f in found if f["code"] == "P13"]
    assert f["title"] == "Module hook reads values changed in place" and f["modules"] == ["0"]
    assert f["steps"] == [0, 1, 2, 3] and "(Linear)" in f["message"] and ".clone()" in f["fix"]
    assert f["src"] == f"{Path(__file__).name}:{_hook_line()}"


def _hook_line() -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if "def hook(m: nn.Module" in text)


@pytest.mark.parametrize(("keep", "inplace"), [("clone", True), ("stats", True), ("detach", False)])
def test_a_copy_a_summary_or_no_in_place_op_is_no_finding(tmp_path: Path, keep: str, inplace: bool) -> None:
    path = tmp_path / "ok.tscope"
    _run(path, keep, inplace)
    assert [f["message"] for f in diagnose(iter_events(path)) if f["severity"] != "info"] == []
