"""QA 40a, the doctor on realistic training code: an output left out of the loss blamed on a
``.detach()`` nobody wrote (the Python op recorder took autograd's saving of a Tanh's output
for an op), a policy gradient's and SimSiam's losses called unbounded below (in
test_doctor_divergence.py), a ResNet block's ``out += identity`` after ``ReLU(inplace=True)``
blamed on the ReLU, two objectives backpropagated one by one called an undivided
accumulation, and an explosion's layer-to-layer ratio told as vanishing gradients."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import torchscope
from torchscope.doctor import diagnose
from torchscope.session import load
from torchscope.sessionfile import iter_events

RECORDERS = pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])


def _run(path: Path, model: nn.Module, opt: torch.optim.Optimizer, step: Callable[[int], Any], steps: int = 6,
         mode: str = "default") -> list[dict[str, Any]]:
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for i in range(steps):
            step(i)
    return [dict(f) for f in diagnose(iter_events(path))]


class _Encoder(nn.Module):
    """A BERT-like encoder returning (sequence, pooled): a token classifier uses the first only."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.pooler = nn.Sequential(nn.Linear(16, 16), nn.Tanh())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return h, self.pooler(h)


class _Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc, self.cls = _Encoder(), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq, _pooled = self.enc(x)
        return self.cls(seq)


@RECORDERS
def test_an_output_left_out_of_the_loss_is_no_detach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      native: bool) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    torch.manual_seed(0)
    model = _Tagger()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(_: int) -> None:
        loss = F.cross_entropy(model(torch.randn(8, 8)), torch.randint(0, 3, (8,)))
        opt.zero_grad()
        loss.backward()
        opt.step()

    path = tmp_path / "tagger.tscope"
    found = _run(path, model, opt, step)
    p1 = [f for f in found if f["code"] == "P1"]
    assert len(p1) == 1, [f["message"] for f in p1]
    assert set(p1[0]["params"]) == {"enc.pooler.0.weight", "enc.pooler.0.bias"}
    assert "whose result the loss never uses" in p1[0]["message"] and "detach" not in p1[0]["message"], p1[0]
    # the forward ops as PyTorch ran them: autograd saving tanh's and log_softmax's results
    # for backward is no op of the forward, with either recorder
    names = [o["name"] for o in load(path).graph(0)["ops"] if o["phase"] == "forward"]
    assert "aten::detach" not in names, names
    assert names.count("aten::addmm") == 3 and "aten::tanh" in names, names


@RECORDERS
def test_a_users_own_detach_is_still_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """The same Tanh's output detached by the model itself: its ``.detach()`` stays an op of the
    forward (the function mode's marker, then aten::detach), and P1 names it."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")

    class Cut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.t, self.b = nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.t(self.a(x)).detach())

    torch.manual_seed(0)
    model = Cut()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def step(_: int) -> None:
        loss = model(torch.randn(8, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    path = tmp_path / "cut.tscope"
    found = _run(path, model, opt, step)
    names = [o["name"] for o in load(path).graph(0)["ops"]]
    assert names.count("aten::detach") == 1 and "torch::Tensor.detach" in names, names
    (p1,) = [f for f in found if f["code"] == "P1"]
    assert "detach" in p1["message"], p1["message"]


class _Block(nn.Module):
    """torchvision's BasicBlock with the residual added after the ReLU, in place."""

    def __init__(self, c: int, bug: bool) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.bug:
            out = self.relu(out)
            out += identity  # marker: the write
        else:
            out += identity
            out = self.relu(out)
        return out


def test_a_residual_added_in_place_after_an_inplace_relu_is_named(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), _Block(8, True),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "resnet.tscope"
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), \
            torchscope.watch(model, opt, server=None, record=path):
        loss = F.cross_entropy(model(torch.randn(4, 3, 16, 16)), torch.randint(0, 10, (4,)))
        loss.backward()
    (p8,) = [f for f in diagnose(iter_events(path)) if f["code"] == "P8"]
    assert "aten::add_" in p8["message"] and "aten::relu_" not in p8["message"], p8["message"]
    line = next(i for i, s in enumerate(Path(__file__).read_text().splitlines(), 1) if "marker: the write" in s)
    assert p8["src"] == f"{Path(__file__).name}:{line}", p8["src"]


def test_two_objectives_backpropagated_one_by_one_are_no_accumulation(tmp_path: Path) -> None:
    """A domain-adaptation step: the source's cross-entropy and the target's entropy, each
    backpropagated on its own line (freeing each graph early): ``(a + b).backward()``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(_: int) -> None:
        xs, ys, xt = torch.randn(32, 20), torch.randint(0, 4, (32,)), torch.randn(32, 20) + 0.5
        opt.zero_grad()
        F.cross_entropy(model(xs), ys).backward()
        p = F.softmax(model(xt), 1)
        (0.1 * -(p * torch.log(p + 1e-8)).sum(1).mean()).backward()
        opt.step()

    found = _run(tmp_path / "da.tscope", model, opt, step)
    assert [f for f in found if f["code"] == "P15"] == [], found


def test_micro_batches_from_one_line_stay_p15(tmp_path: Path) -> None:
    """The same loss over slices in a loop, undivided: still P15 (one line, one kind of loss)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(_: int) -> None:
        x, y = torch.randn(32, 20), torch.randint(0, 4, (32,))
        opt.zero_grad()
        for xb, yb in zip(x.chunk(4), y.chunk(4), strict=True):
            F.cross_entropy(model(xb), yb).backward()
        opt.step()

    found = _run(tmp_path / "accum.tscope", model, opt, step)
    assert [f["code"] for f in found if f["code"] == "P15"] == ["P15"], found


def test_an_explosion_is_not_also_told_as_vanishing_layers(tmp_path: Path) -> None:
    """An LSTM at SGD lr=3 on an unnormalised target: the loss explodes; the output layer's
    gradient blown up against saturated gates reads as a huge layer ratio on those steps."""
    torch.manual_seed(0)

    class R(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn, self.out = nn.LSTM(3, 32, num_layers=2, batch_first=True), nn.Linear(32, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h, _ = self.rnn(x)
            return self.out(h[:, -1]).squeeze(-1)

    model = R()
    opt = torch.optim.SGD(model.parameters(), lr=3.0, momentum=0.9)

    def step(_: int) -> None:
        x = torch.randn(16, 50, 3) * 3
        loss = F.mse_loss(model(x), x[:, :, 0].sum(1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    found = _run(tmp_path / "lstm.tscope", model, opt, step, steps=25)
    p3 = [f["message"] for f in found if f["code"] == "P3"]
    assert any("explod" in m or "diverg" in m for m in p3), p3
    assert not [m for m in p3 if m.startswith("Gradients shrink")], p3
