"""Autocast regions and the casts autocast inserts (M7), on CPU with bfloat16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


class HalfAutocast(nn.Module):
    """``a`` runs under autocast; the user casts its output back themselves; ``b`` runs outside."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.a(x)
            h = h.to(torch.float32)  # the user's own cast, inside the region
        return self.b(h)


def _to_copy_nodes(loss: torch.Tensor) -> int:
    """ToCopyBackward0 nodes below the loss, by our own walk."""
    seen, stack, n = set(), [loss.grad_fn], 0
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        n += type(fn).__name__ == "ToCopyBackward0"
        stack.extend(c for c, _ in fn.next_functions)
    return n


@pytest.mark.parametrize("mode", ["default", "full"])
def test_autocast_region_and_casts(mode: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = HalfAutocast()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "amp.tscope"
    walked = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(2):
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).float().pow(2).mean()
            walked.append(_to_copy_nodes(loss))
            loss.backward()
            opt.step()
    events = list(iter_events(path))
    g = next(e for e in events if e["kind"] == "graph" and e["step"] == 0)
    fwd = [o for o in g["ops"] if o["phase"] == "forward"]
    flags = [set(o.get("flags", ())) for o in fwd]
    in_a = [f for o, f in zip(fwd, flags, strict=True) if o["module"] == "a"]
    in_b = [f for o, f in zip(fwd, flags, strict=True) if o["module"] == "b"]
    assert in_a and all("autocast" in f for f in in_a)
    assert in_b and not any("autocast" in f for f in in_b)
    tensors = {t["id"]: t for t in g["tensors"]}
    casts = [o for o, f in zip(fwd, flags, strict=True) if "autocast_cast" in f]
    # nn.Linear under CPU autocast casts its input, weight and bias to bfloat16
    assert len(casts) == 3
    for o in casts:
        assert o["name"] == "aten::_to_copy" and o["module"] == "a"
        assert tensors[o["inputs"][0]]["dtype"] == "float32"
        assert tensors[o["outputs"][0]]["dtype"] == "bfloat16"
    # the user's own .to(torch.float32) is a _to_copy in the region, but not autocast's
    user = [
        o
        for o, f in zip(fwd, flags, strict=True)
        if o["name"] == "aten::_to_copy" and "autocast_cast" not in f
    ]
    assert len(user) == 1 and tensors[user[0]["outputs"][0]]["dtype"] == "float32"
    assert "autocast" in set(user[0].get("flags", ()))
    # the graph: weight and bias casts require grad (x does not) -> two ToCopyBackward0 nodes
    # marked as autocast's; the user's cast is the third ToCopyBackward0, unmarked
    to_copy = [n for n in g["nodes"] if n["name"] == "ToCopyBackward0"]
    assert len(to_copy) == walked[0] == 3
    assert sorted(bool(n.get("autocast_cast")) for n in to_copy) == [False, True, True]
    cast_ids = {o["id"] for o in casts}
    assert all(n["op"] in cast_ids for n in to_copy if n.get("autocast_cast"))
    # the step says autocast was on, though the region began inside the model's forward (a
    # captured step sees that from its ops)
    assert next(e for e in events if e["kind"] == "step")["autocast"] is True
