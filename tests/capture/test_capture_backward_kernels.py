"""Full mode's C++ recorder and the backward kernels of ops that have a CPU kernel beside a
math (CompositeImplicitAutograd) one: ``silu_backward``, ``mish_backward``.  Taken for
composite (decomposed into the ops they call), they were left out -- they run their own kernel,
which calls none -- so their outputs were missing from the step's ledger: the peak of a SiLU MLP
12% under PyTorch's own (QA 45b).  Checked against the kernels a dispatch mode sees."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import torchscope
from torchscope import _native


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.seen[f"aten::{func.overloadpacket.__name__}"] += 1
        return func(*args, **(kwargs or {}))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 32), nn.Mish(), nn.Linear(32, 1))


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_backward_kernels_with_a_cpu_kernel_of_their_own_are_recorded(tmp_path: Path, native: bool,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if native:
        assert _native.get(block=True) is not None, _native._error
    else:
        monkeypatch.setenv("TORCHSCOPE_NATIVE", "0")
    x = torch.randn(8, 16)
    plain = _model()
    with _Count() as count:
        plain(x).pow(2).mean().backward()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "acts.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(2):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    graph = torchscope.load(path).graph(1)
    backward = collections.Counter(o["name"] for o in graph["ops"] if o.get("phase") == "backward")
    for name in ("aten::silu_backward", "aten::mish_backward"):
        assert count.seen[name] == 1 and backward[name] == 1, (name, count.seen[name], dict(backward))
