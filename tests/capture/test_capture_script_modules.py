"""Model code torch reaches through wrappers (QA round 29): a ``torch.jit.script``-ed submodule in
an eager model, and a ``forward`` decorated with ``@torch.autocast``.  The forward capture stays on
(it turned itself off with an internal error on the ScriptModule), the scripted block's ops are
recorded, training is unchanged, and a decorated forward's ops name the user's own line."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) + x


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = torch.jit.script(Block())
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 2)

    @torch.autocast("cpu", dtype=torch.bfloat16)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2.0  # the decorated forward's line
        return self.lin(h).float()


class Twin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Head()
        self.lin = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.lin(x)


def _train(model: nn.Module, path: Path | None, mode: str, steps: int = 4) -> list[torch.Tensor]:
    torch.manual_seed(1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode) if path else None
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.randn(5, 6)), torch.randn(5, 2)).backward()
        opt.step()
    if watch is not None:
        watch.close()
    return [p.detach().clone() for p in model.parameters()]


def _events(path: Path) -> list[dict[str, Any]]:
    return [dict(e) for e in iter_events(path)]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_scripted_submodule_keeps_the_forward_capture_on(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = Net()
    torch.manual_seed(0)
    plain = Net()
    path = tmp_path / "script.tscope"
    # the profiling executor optimizes a scripted graph after its first runs in a process: off,
    # the watched and the plain run execute the same graph
    with torch.jit.optimized_execution(False):
        watched = _train(model, path, mode)
        assert all(torch.equal(a, b) for a, b in zip(watched, _train(plain, None, mode), strict=True))
    events = _events(path)
    logs = [e["message"] for e in events if e["kind"] == "log"]
    assert not [m for m in logs if "turned off" in m or "without a call of the model" in m], logs
    graphs = [e for e in events if e["kind"] == "graph"]
    assert graphs and graphs[0]["step"] == 0
    for g in graphs:
        names = [o["name"] for o in g["ops"] if o["phase"] == "forward"]
        # the scripted block's ops (run by the TorchScript interpreter, which takes no module
        # hooks: they count as its caller's) and the eager head's
        assert "aten::tanh" in names and names.count("aten::addmm") == 2, names
        assert [o["module"] for o in g["ops"] if o["phase"] == "forward" and o["name"] == "aten::addmm"] == ["", "head"]


def test_a_decorated_forward_names_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "deco.tscope"
    _train(Twin(), path, "full", steps=2)
    graph = next(e for e in _events(path) if e["kind"] == "graph")
    (mul,) = [o for o in graph["ops"] if o["phase"] == "forward" and o["name"] == "aten::mul"]
    lines, first = inspect.getsourcelines(Head.forward)
    line = first + next(i for i, text in enumerate(lines) if "the decorated forward's line" in text)
    assert mul["module"] == "a" and mul["src"] == f"test_capture_script_modules.py:{line}", mul
