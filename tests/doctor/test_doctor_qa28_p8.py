"""P8 from real captures (QA round 28): ``nn.Embedding(max_norm=...)`` renormalises the rows it
looks up in place, in its forward (``aten::embedding_renorm_``).  A differentiable use of its
weight before the lookup -- here a linear layer reading ``emb.weight[:8]`` -- saved a view of it
for backward, and backward raises "... output 0 of AsStrided ...": a node of no graph.  The
doctor names the in-place op and its line from the captured failing step (the op whose node saved
a tensor of the message's shape, and the in-place op that wrote its storage after), with the fix
PyTorch's documentation gives (clone the weight for that use); without a graph (mode='light') it
says the op is not known and that the tensor could be a view of the embedding's weight."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope import _native
from torchscope.doctor import diagnose
from torchscope.schema import Finding
from torchscope.sessionfile import iter_events


class TiedRows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.lin = nn.Embedding(50, 16, max_norm=1.0), nn.Linear(16, 16)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        q = self.lin(self.emb.weight[:8])  # a differentiable use of the weight first: addmm saves the view
        e = self.emb(idx)  # then the max_norm lookup renormalises the weight in place
        return (e.mean(1) @ q.T).mean(1, keepdim=True)


class Tied(nn.Module):
    """The whole weight, transposed (a tied output layer's logits before the lookup)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.proj = nn.Embedding(50, 16, max_norm=1.0), nn.Linear(16, 16)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits = self.proj(torch.ones(16, 16)) @ self.emb.weight.T  # mm saves the weight
        e = self.emb(idx)  # renormalised in place
        return e.mean() + logits.mean(1, keepdim=True)


RENORM_LINE = TiedRows.forward.__code__.co_firstlineno + 2
TIED_LINE = Tied.forward.__code__.co_firstlineno + 2


def _crash(model: nn.Module, path: Path, mode: str) -> list[Finding]:
    """A plain training loop: its first backward raises, and the script stops there."""
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode), \
            pytest.raises(RuntimeError, match="modified by an inplace operation"):
        for _ in range(4):
            idx, y = torch.randint(0, 50, (16, 6), generator=g), torch.randn(16, 1, generator=g)
            opt.zero_grad()
            loss = ((model(idx) - y) ** 2).mean()
            loss.backward()
            opt.step()
    return [f for f in diagnose(iter_events(path)) if f["code"] == "P8"]


@pytest.mark.parametrize(("mode", "native"), [("default", False), ("full", False), ("full", True)],
                         ids=["default", "full-python", "full-native"])
def test_embedding_max_norm_after_a_use_of_its_weight_names_the_renorm(
        tmp_path: Path, mode: str, native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, f"the native extension did not build: {_native._error}"
    (p8,) = _crash(TiedRows(), tmp_path / f"rows-{mode}-{native}.tscope", mode)
    msg = p8["message"]
    assert "AsStrided" in p8["data"]["error"]  # the case under test: torch names a node of no graph
    assert "(aten::embedding_renorm_ in 'emb' (Embedding))" in msg and "AddmmBackward0 (in 'lin') saved" in msg, msg
    assert "[8, 16]" in msg and "max_norm" in msg, msg
    assert p8["src"] == f"{Path(__file__).name}:{RENORM_LINE}", p8["src"]
    assert "emb.weight.clone()" in p8["fix"], p8["fix"]
    assert p8["targets"][0]["module"] == "emb" and "op" in p8["targets"][0], p8["targets"]


def test_a_tied_weight_used_whole_names_the_renorm(tmp_path: Path) -> None:
    (p8,) = _crash(Tied(), tmp_path / "tied.tscope", "default")
    assert "(aten::embedding_renorm_ in 'emb' (Embedding))" in p8["message"], p8["message"]
    assert p8["src"] == f"{Path(__file__).name}:{TIED_LINE}", p8["src"]
    assert "emb.weight.clone()" in p8["fix"], p8["fix"]


def test_without_a_graph_the_embedding_is_named_as_a_suspect(tmp_path: Path) -> None:
    (p8,) = _crash(TiedRows(), tmp_path / "rows-light.tscope", "light")
    msg = p8["message"]
    assert "output 0 of AsStrided" in msg and "AsStrided needed" not in msg, msg
    assert "mode='light'" in msg and "could be a view of the weight of 'emb'" in msg, msg
    assert "emb.weight.clone()" in p8["fix"], p8["fix"]
