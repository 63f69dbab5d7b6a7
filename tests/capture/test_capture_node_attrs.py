"""NodeRecord.attrs: what each grad_fn node saved for backward besides tensors (a convolution's
stride and padding, a reduction's dim and keepdim, a loss's ignore_index), as torchviz's
``show_attrs`` lists them -- checked against the same graph built by plain PyTorch, read here
with our own walk of ``next_functions`` and ``getattr`` of its ``_saved_*`` fields."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import torch
from capture_models import grad_fn_nodes
from torch import nn

import torchscope
from torchscope._autograd import _attrs_of

STEPS = 3


def make() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def step_loss(model: nn.Module, i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + i)
    x, y = torch.randn(2, 3, 8, 8, generator=g), torch.randint(0, 10, (2,), generator=g)
    out = model(x)
    ce = nn.CrossEntropyLoss(ignore_index=-100)(out, y)
    return ce + out.softmax(dim=1).sum(dim=1, keepdim=True).mean() * 0.01


def plain_value(v: Any) -> Any:
    """A saved field as JSON holds it: tuples as lists, and an int64 PyTorch hands back as its
    unsigned value (a dim of -1 is 2**64 - 1, ignore_index=-100 is 2**64 - 100) as the signed one."""
    if isinstance(v, (tuple, list)):
        return [plain_value(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool) and v >= 2**63:
        return v - 2**64
    return v


def plain_attrs(loss: torch.Tensor) -> collections.Counter[tuple[str, str]]:
    """(node class, its non-tensor saved fields as JSON) of every node below ``loss``: the
    ``_saved_*`` fields without a ``_raw_saved_*`` twin (those with one are tensors)."""
    out: collections.Counter[tuple[str, str]] = collections.Counter()
    for n in grad_fn_nodes([loss.grad_fn]):
        names = set(dir(n))
        attrs = {a.removeprefix("_saved_"): plain_value(getattr(n, a)) for a in sorted(names)
                 if a.startswith("_saved_") and "_raw" + a not in names}
        out[(type(n).__name__, json.dumps({k: v for k, v in attrs.items() if v is not None}, sort_keys=True))] += 1
    return out


def recorded_attrs(g: dict[str, Any]) -> collections.Counter[tuple[str, str]]:
    return collections.Counter((n["name"], json.dumps(n.get("attrs", {}), sort_keys=True)) for n in g["nodes"])


def train(mode: str | None, path: Path | None = None) -> dict[str, Any]:
    """STEPS steps of the model, watched in ``mode`` (None: not watched)."""
    model, opt = make()
    w = torchscope.watch(model, opt, server=None, record=path, mode=mode) if mode else None
    losses: list[float] = []
    expected: list[collections.Counter[tuple[str, str]]] = []
    try:
        for i in range(STEPS):
            loss = step_loss(model, i)
            expected.append(plain_attrs(loss))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        if w is not None:
            w.close()
    return {"losses": losses, "expected": expected, "params": [p.detach().clone() for p in model.parameters()]}


def by_name(g: dict[str, Any], name: str) -> dict[str, Any]:
    (node,) = [n for n in g["nodes"] if n["name"] == name]
    return node


def test_full_mode_records_the_attributes_pytorch_saved_and_changes_no_number(tmp_path: Path) -> None:
    path = tmp_path / "full.tscope"
    run = train("full", path)
    plain = train(None)
    # not a single training number changed: losses and weights bit-identical to the unwatched run's
    assert run["losses"] == plain["losses"]
    assert all(torch.equal(a, b) for a, b in zip(run["params"], plain["params"], strict=True))
    assert run["expected"] == plain["expected"]  # the graphs PyTorch built are the same too
    s = torchscope.load(str(path))
    assert s.graph_steps == list(range(STEPS))
    for step in range(STEPS):
        assert recorded_attrs(s.graph(step)) == run["expected"][step]
    g = s.graph(0)
    conv = by_name(g, "ConvolutionBackward0")["attrs"]
    assert conv["stride"] == [2, 2] and conv["padding"] == [1, 1] and conv["dilation"] == [1, 1]
    assert conv["groups"] == 1 and conv["transposed"] is False
    assert by_name(g, "SumBackward1")["attrs"] == {"dim": [1], "keepdim": True, "self_sym_sizes": [2, 10]}
    nll = by_name(g, "NllLossBackward0")["attrs"]
    assert nll["ignore_index"] == -100 and nll["reduction"] == 1  # PyTorch reads back 2**64 - 100
    assert by_name(g, "SoftmaxBackward0")["attrs"] == {"dim": 1}
    assert by_name(g, "ViewBackward0")["attrs"] == {"self_sym_sizes": [2, 4, 4, 4]}
    assert by_name(g, "AddmmBackward0")["attrs"]["alpha"] == 1
    # a node that saved no attribute has none recorded, and a parameter's AccumulateGrad neither
    assert all("attrs" not in n for n in g["nodes"] if n["name"] in ("AccumulateGrad", "ReluBackward0", "TBackward0"))


def test_default_mode_captured_graph_has_them(tmp_path: Path) -> None:
    path = tmp_path / "default.tscope"
    run = train("default", path)
    s = torchscope.load(str(path))
    assert 0 in s.graph_steps  # default mode captures the first step's graph
    g = s.graph(0)
    assert recorded_attrs(g) == run["expected"][0]
    assert by_name(g, "ConvolutionBackward0")["attrs"]["stride"] == [2, 2]


class _Attrs:
    """A node class's stand-in: 20 saved fields of every kind, one that fails to read."""

    _saved_long = tuple(range(40))
    _saved_text = "x" * 200
    _saved_dtype = torch.bfloat16
    _saved_device = torch.device("cpu")
    _saved_layout = torch.strided
    _saved_format = torch.channels_last
    _saved_nan = float("nan")
    _saved_none = None
    _saved_tensor = torch.zeros(2)
    _saved_tensors = (torch.zeros(1), 3)
    _saved_nested = ((1, 2), (3, 4))
    _saved_complex = 1j
    _saved_raw_twin = 5  # a tensor field: its _raw_ twin says so
    _raw_saved_raw_twin = None

    @property
    def _saved_broken(self) -> int:
        raise RuntimeError("cannot read")


for _i in range(20):
    setattr(_Attrs, f"_saved_z{_i:02d}", _i)


def test_values_are_json_and_capped() -> None:
    attrs = _attrs_of(_Attrs())
    assert attrs is not None and len(attrs) == 16  # at most 16 a node, in name order
    assert attrs["long"] == list(range(16))  # a list's first 16
    assert attrs["text"] == "x" * 80
    assert (attrs["dtype"], attrs["device"], attrs["layout"], attrs["format"]) == ("bfloat16", "cpu", "strided", "channels_last")
    assert attrs["nan"] != attrs["nan"]  # NaN kept, as the schema's other floats
    # left out: None, tensors, lists holding a tensor or a tuple, a complex number, a field that
    # raised, and the tensor field (one with a _raw_ twin)
    for gone in ("none", "tensor", "tensors", "nested", "complex", "broken", "raw_twin"):
        assert gone not in attrs
    assert [k for k in attrs if k.startswith("z")] == [f"z{i:02d}" for i in range(9)]
    json.dumps(attrs)  # nothing JSON cannot write (NaN as NaN, as the writer's allow_nan=True)


def test_a_long_tuple_is_cut_to_its_first_16(tmp_path: Path) -> None:
    sizes = [1] * 20
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "long.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        loss = model(torch.randn(1, 4)).reshape(sizes).permute(*reversed(range(len(sizes)))).sum()
        loss.backward()
        opt.step()
    g = torchscope.load(str(path)).graph(0)
    assert by_name(g, "PermuteBackward0")["attrs"] == {"dims": list(reversed(range(20)))[:16]}
