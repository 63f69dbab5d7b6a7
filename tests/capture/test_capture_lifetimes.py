"""Each allocation's lifetime on a captured step (OpRecord.freed, format 1.9): the storages
alive when the forward ends are what plain PyTorch holds then -- the activations autograd
saved for backward (``saved_tensors_hooks`` sees each), the model's output and the loss --
and the bytes of those alive at every op add up to the timeline's live bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import alive_after_each_op, untracked_frees
from torch import nn
from torch.nn import functional as F

import torchscope
from torchscope.session import load


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("mode", ["default", "full"])
def test_what_is_alive_when_the_forward_ends_is_what_pytorch_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, native: bool) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    torch.manual_seed(0)
    model = _model()
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    # plain PyTorch: the storages autograd saves for backward (parameters left out) and the
    # output and loss the loop holds, when the forward is done
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params | {x.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()}:
            saved[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
        loss = F.mse_loss(out, y)
    held = {**saved, out.untyped_storage().data_ptr(): out.untyped_storage().nbytes(),
            loss.untyped_storage().data_ptr(): loss.untyped_storage().nbytes()}
    expect = sum(held.values())

    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    path = tmp_path / "life.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        out = model(x)
        loss = F.mse_loss(out, y)
        loss.backward()
        opt.step()
    ev = dict(load(path).graph(0))
    forward = [o["id"] for o in ev["ops"] if o["phase"] == "forward"]
    steps = alive_after_each_op(ev)
    at_end = dict(steps)[forward[-1]]
    assert sum(at_end.values()) == expect, (sorted(at_end.values()), sorted(held.values()))
    assert len(at_end) == len(held)
    # and at every op: the step's baseline plus what is alive is the timeline's live bytes
    ops = {o["id"]: o for o in ev["ops"]}
    first = ops[min(ops)]
    baseline = first["live"] - first["alloc"] + first["free"]
    for op_id, alive in steps:
        assert baseline + sum(alive.values()) == ops[op_id]["live"], op_id
    if mode == "full":  # the backward frees the saved activations: something freed in it
        assert any(o.get("freed") for o in ev["ops"] if o["phase"] == "backward")


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_gradients_zero_grad_frees_after_the_forward_are_not_counted_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """PyTorch's tutorial order -- forward, loss, ``zero_grad()``, backward, step: the step before's
    ``.grad`` tensors die between the forward and the backward, outside any op.  Counted as held
    on through the backward, on top of the new ones, they put the in-step peak a gradient's worth
    too high (QA 41a: 792.9 KiB where the allocator held 661.3 KiB).  The same steps with
    ``zero_grad()`` first hold the same bytes from the backward on, and the frees no allocation
    of the step accounts for are exactly the old gradients' bytes, on the backward's first op."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")

    def run(path: Path, tutorial: bool) -> list[dict[str, Any]]:
        torch.manual_seed(0)
        model = _model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = torch.randn(16, 32), torch.randn(16, 8)
        with torchscope.watch(model, opt, server=None, record=path, mode="full"):
            for _ in range(3):
                if not tutorial:
                    opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                if tutorial:
                    opt.zero_grad()
                loss.backward()
                opt.step()
        return [dict(load(path).graph(step)) for step in (1, 2)]

    grad_bytes = sum(p.numel() * p.element_size() for p in _model().parameters())
    for tut, first in zip(run(tmp_path / "tutorial.tscope", True), run(tmp_path / "first.tscope", False), strict=True):
        assert tut["recorder"] == first["recorder"] == ("native" if native else "python")
        back = [o for o in sorted(tut["ops"], key=lambda o: o["id"]) if o["phase"] == "backward"]
        back_first = [o for o in sorted(first["ops"], key=lambda o: o["id"]) if o["phase"] == "backward"]
        assert [o["name"] for o in back] == [o["name"] for o in back_first] and back
        assert [o["live"] for o in back] == [o["live"] for o in back_first]
        untracked = [(i, n) for i, n in untracked_frees(tut) if n]
        assert untracked == [(back[0]["id"], grad_bytes)], untracked
        assert not [n for _, n in untracked_frees(first) if n]
