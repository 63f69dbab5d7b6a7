"""QA 39a's findings in the module outputs and the update ratio, each against plain PyTorch:
a parameter's sample runs through the whole of it, a module returning its own Parameter gets
no hook that stays, a checkpointed segment's recompute is no second call, and a bfloat16
weight's norm is not rounded to bfloat16."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

import torchscope
from torchscope.session import load


def test_the_update_ratio_of_an_embedding_trained_on_its_last_rows_is_read(tmp_path: Path) -> None:
    """125 x 64 = 8,000 elements: a sample of the first 4,096 (rows 0-63) read 0.0 for an
    embedding whose batches use rows 64 and up."""
    torch.manual_seed(0)
    emb, head = nn.Embedding(125, 64), nn.Linear(64, 1)
    model = nn.Sequential(emb)
    opt = torch.optim.SGD([*emb.parameters(), *head.parameters()], lr=0.05)
    true: list[float] = []
    path = tmp_path / "emb.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(3):
            x, y = torch.randint(64, 125, (4, 5)), torch.randn(4, 1)
            loss = F.mse_loss(head(model(x).mean(1)), y)
            opt.zero_grad()
            loss.backward()
            before = emb.weight.detach().clone()
            opt.step()
            true.append(float((emb.weight.detach() - before).norm() / before.norm()))
    got = [e["grads"]["update_ratio"][0] for e in load(path).steps]
    assert all(t > 0 for t in true)
    assert got == pytest.approx(true, rel=0.1), (got, true)


def test_a_module_returning_its_own_parameter_keeps_no_hook_on_it(tmp_path: Path) -> None:
    class Pos(nn.Module):  # a learned position table, returned as it is
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.randn(6, 8) * 0.1)

        def forward(self) -> torch.Tensor:
            return self.table

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pos, self.out = Pos(), nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(x + self.pos())

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with torchscope.watch(model, opt, server=None, record=tmp_path / "pos.tscope", mode="full"):
        for _ in range(20):
            loss = F.mse_loss(model(torch.randn(4, 6, 8)), torch.randn(4, 6, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            assert not model.pos.table._backward_hooks  # none added, none left (was one a step)


def _ckpt_rows(tmp_path: Path, ckpt: bool) -> dict[str, dict[str, Any]]:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.act = nn.Linear(16, 16), nn.GELU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.act(self.fc(x))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp, self.b1, self.head = nn.Linear(8, 16), Block(), nn.Linear(16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            z = self.inp(x)
            z = checkpoint(self.b1, z, use_reentrant=False) if ckpt else self.b1(z)
            return self.head(z)

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    path = tmp_path / f"ckpt-{ckpt}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        loss = F.mse_loss(model(torch.randn(8, 8)), torch.randn(8, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    step = load(path).steps[0]
    return {r["module"]: r for r in step["activations"]} | {"grads:" + r["module"]: r for r in step.get("activation_grads", [])}


def test_a_checkpointed_segment_recomputed_in_the_backward_is_one_call(tmp_path: Path) -> None:
    plain, ckpt = _ckpt_rows(tmp_path, False), _ckpt_rows(tmp_path, True)
    for key in ("b1.fc", "b1.act", "b1", "grads:b1.fc"):
        assert key in ckpt and ckpt[key].get("calls", 1) == 1, (key, ckpt.get(key))
        assert ckpt[key]["norm"] == pytest.approx(plain[key]["norm"], rel=1e-6), key


def test_a_bfloat16_weight_norm_is_not_rounded_to_bfloat16(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1)).to(torch.bfloat16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    exact: list[float] = []
    path = tmp_path / "bf16.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(4):
            x, y = torch.randn(8, 8, dtype=torch.bfloat16), torch.randn(8, 1, dtype=torch.bfloat16)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            exact.append(float(model[0].weight.detach().double().norm()))
    got = [e["grads"]["weight_norm"][0] for e in load(path).steps]
    assert got == pytest.approx(exact, rel=1e-5), (got, exact)
    assert len(set(got)) == 4  # each step its own (rounded to bfloat16, one value for all four)


def test_an_indices_and_probabilities_tuple_or_a_dataclass_output_has_its_rows(tmp_path: Path) -> None:
    """A module returning ``(indices, probs)`` has the probabilities' row (its first tensor, the
    indices, is no float: it had none); one returning a dataclass, its field's."""
    import dataclasses

    @dataclasses.dataclass
    class Out:
        h: torch.Tensor

    class Pick(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            p = torch.softmax(self.fc(x), -1)
            return p.argmax(-1), p

    class Wrap(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> Out:
            return Out(self.fc(x))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pick, self.wrap = Pick(), Wrap()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            _, p = self.pick(x)
            return self.wrap(p).h

    torch.manual_seed(0)
    model = Net()
    seen: dict[str, torch.Tensor] = {}
    model.pick.register_forward_hook(lambda m, a, o: seen.__setitem__("pick", o[1].detach().clone()))
    model.wrap.register_forward_hook(lambda m, a, o: seen.__setitem__("wrap", o.h.detach().clone()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "outs.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        opt.zero_grad()
        model(torch.randn(5, 4)).pow(2).mean().backward()
        opt.step()
    step = load(path).steps[0]
    rows = {r["module"]: r for r in step["activations"]}
    grads = {r["module"] for r in step["activation_grads"]}
    for name in ("pick", "wrap"):
        assert rows[name]["norm"] == pytest.approx(float(seen[name].double().norm()), rel=1e-6), name
        assert rows[name]["numel"] == seen[name].numel() and name in grads


def test_a_parameter_the_optimizer_does_not_hold_has_no_update_ratio(tmp_path: Path) -> None:
    """The update ratio is what the watched optimizer did: a parameter outside it (trained by
    hand, or not at all) reads None, not 0.0 -- a zero learning rate on the chart."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model[2].parameters(), lr=0.1)  # the head only
    path = tmp_path / "part.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(6, 4)).pow(2).mean().backward()
            opt.step()
    names = [p["name"] for p in load(path).meta["params"]]
    for e in load(path).steps:
        ratio = dict(zip(names, e["grads"]["update_ratio"], strict=True))
        assert ratio["0.weight"] is None and ratio["0.bias"] is None, ratio
        assert ratio["2.weight"] is not None and ratio["2.weight"] > 0, ratio
