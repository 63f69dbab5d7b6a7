"""Each allocation's lifetime on a captured step (OpRecord.freed, format 1.9): the storages
alive when the forward ends are what plain PyTorch holds then -- the activations autograd
saved for backward (``saved_tensors_hooks`` sees each), the model's output and the loss --
and the bytes of those alive at every op add up to the timeline's live bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import alive_after_each_op
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
