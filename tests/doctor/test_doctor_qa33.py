"""Doctor findings from QA round 33 (autograd exotica), each on a real watched training loop:

- P8 names only the nodes that saved the tensor an in-place op changed: not the Linear that
  produced it (whose saved list, readable, holds its input only), and a custom
  ``autograd.Function`` that saved it with ``ctx.save_for_backward`` (a node no op made);
- P1 on parameters whose ``.grad`` the loop set to None between backward() and step(): the
  captured graph shows their AccumulateGrad ran, so no "never received a gradient" and no cut
  or dead end is invented; light mode tells it from its own walk of the backward's graph;
- P2 on a bias whose gradient a user's tensor hook zeroes names the hook, not "cancels out of
  the loss, by design".
Each comes with a control: the correct detection of the same rule still happens.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.schema import Finding
from torchscope.sessionfile import iter_events


def _record(path: Path, model: nn.Module, loop: Callable[[torch.optim.Optimizer], None],
            mode: str = "default", raises: bool = False) -> list[Finding]:
    """Run ``loop(opt)`` watched, recording to ``path`` (a backward that raises ends the run, as
    it does a script), and diagnose the file."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        if raises:
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                loop(opt)
        else:
            loop(opt)
    return diagnose(iter_events(path))


def _of(found: list[Finding], code: str) -> list[Finding]:
    return [f for f in found if f["code"] == code]


def _classify(model: nn.Module, steps: int, between: Callable[[], None] = lambda: None,
              ) -> Callable[[torch.optim.Optimizer], None]:
    """A plain classification loop; ``between`` runs after backward(), before step()."""
    def loop(opt: torch.optim.Optimizer) -> None:
        g = torch.Generator().manual_seed(1)
        for _ in range(steps):
            x, y = torch.randn(10, 8, generator=g), torch.randint(0, 3, (10,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            between()
            opt.step()
    return loop


# ---------------------------------------------------------------- P8: the nodes that saved the tensor
class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return 2 * x * g


class SavedThenChanged(nn.Module):
    """``h = l1(x)``, a consumer saves h, then ``h.add_(1.0)``: l1's addmm made h but saved only x."""

    def __init__(self, consumer: str) -> None:
        super().__init__()
        self.consumer = consumer
        self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.l1(x)
        if self.consumer == "exp":  # control: exp saves its own output, then mul saves it too
            h = torch.exp(h)
        y = Square.apply(h) if self.consumer == "function" else h * h
        h.add_(1.0)
        return self.l2(y)


@pytest.mark.parametrize(("consumer", "saver"), [("mul", "MulBackward0"), ("function", "SquareBackward")])
def test_p8_names_the_node_that_saved_the_tensor_not_the_one_that_made_it(
        tmp_path: Path, consumer: str, saver: str) -> None:
    torch.manual_seed(0)
    model = SavedThenChanged(consumer)
    (p8,) = _of(_record(tmp_path / f"{consumer}.tscope", model, _classify(model, 2), raises=True), "P8")
    msg = p8["message"]
    assert "(aten::add_)" in msg and f"that {saver} saved for backward" in msg, msg
    assert "AddmmBackward0" not in msg, msg  # l1's node saved x, not h
    # known from its unreadable saved tensors, and said so
    assert "torch found what it saved modified in place" in msg, msg


def test_p8_still_names_every_node_that_saved_the_tensor(tmp_path: Path) -> None:
    """Control: exp saves its output h and ``h * h`` saves h: both are named, l1's node is not."""
    torch.manual_seed(0)
    model = SavedThenChanged("exp")
    (p8,) = _of(_record(tmp_path / "exp.tscope", model, _classify(model, 2), raises=True), "P8")
    msg = p8["message"]
    assert "(aten::add_)" in msg and "that ExpBackward0 and MulBackward0 saved for backward" in msg, msg
    assert "AddmmBackward0" not in msg, msg


# ---------------------------------------------------------------- P1: .grad cleared between backward and step
class Three(nn.Module):
    def __init__(self, detach: bool = False) -> None:
        super().__init__()
        self.detach = detach
        self.l1, self.l2, self.l3 = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.l1(x))
        if self.detach:
            h = h.detach()
        return self.l3(torch.tanh(self.l2(h)))


def _drop_l1_grads(model: Three) -> Callable[[], None]:
    def drop() -> None:
        for p in model.l1.parameters():
            p.grad = None  # "freeze" l1 by discarding its gradient before the update
    return drop


@pytest.mark.parametrize("mode", ["default", "full"])
def test_p1_a_gradient_cleared_after_backward_is_not_a_cut(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = Three()
    found = _record(tmp_path / f"null-{mode}.tscope", model, _classify(model, 4, _drop_l1_grads(model)), mode)
    (p1,) = _of(found, "P1")
    msg = p1["message"]
    assert p1["severity"] == "warning" and p1["params"] == ["l1.weight", "l1.bias"], p1
    assert "never received" not in msg and "nll_loss" not in msg and "never uses" not in msg, msg
    assert "holds their AccumulateGrad" in msg and "cleared between backward() and step()" in msg, msg
    assert p1["title"] == "Gradient cleared before optimizer.step()"
    assert not _of(found, "P5")  # not every gradient was cleared: no misplaced zero_grad()


def test_p1_in_light_mode_tells_a_cleared_gradient_from_an_unused_layer(tmp_path: Path) -> None:
    """light writes no graph, but walks the backward's (the first step's, a changed
    structure's) and tells which trainable parameters it does not reach: l1, reached, had its
    gradient cleared (a warning); a layer the forward never calls is still P1's error."""
    torch.manual_seed(0)
    model = Three()
    (p1,) = _of(_record(tmp_path / "null-light.tscope", model, _classify(model, 4, _drop_l1_grads(model)),
                        "light"), "P1")
    msg = p1["message"]
    assert p1["severity"] == "warning" and p1["title"] == "Gradient cleared before optimizer.step()", p1
    assert "although the backward reached them" in msg and "never received" not in msg, msg
    torch.manual_seed(0)
    model = Three()
    model.spare = nn.Linear(16, 16)  # built, never called
    (p1,) = _of(_record(tmp_path / "unused-light.tscope", model, _classify(model, 4), "light"), "P1")
    assert p1["severity"] == "error" and p1["params"] == ["spare.weight", "spare.bias"], p1
    assert "the backward's graph does not reach them" in p1["message"], p1["message"]


def test_p1_a_real_cut_is_still_an_error_at_the_detach(tmp_path: Path) -> None:
    """Control: the same parameters cut off by a ``.detach()`` never reach their AccumulateGrad."""
    torch.manual_seed(0)
    model = Three(detach=True)
    (p1,) = _of(_record(tmp_path / "detach.tscope", model, _classify(model, 4)), "P1")
    assert p1["severity"] == "error" and "never received a gradient" in p1["message"], p1
    assert "to the loss break" in p1["message"] and "at Tensor.detach()" in p1["message"], p1["message"]


def test_p1_leaves_every_gradient_cleared_by_zero_grad_to_p5(tmp_path: Path) -> None:
    """Control: zero_grad() between backward() and step() empties every gradient: P5's
    misplaced zero_grad, not P1 (one cause, one finding)."""
    torch.manual_seed(0)
    model = Three()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    found = _record(tmp_path / "misplaced.tscope", model, _classify(model, 4, lambda: opt.zero_grad()))
    assert not _of(found, "P1")
    (p5,) = _of(found, "P5")
    assert "zero_grad() is called between backward() and step()" in p5["message"], p5["message"]


# ---------------------------------------------------------------- P2: a hook zeroing a bias's gradient
class Siamese(nn.Module):
    """A distance of two inputs through one network: the last layer's bias cancels out of
    ``f(a) - f(b)`` (its gradient is exactly zero) while its weight learns."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l3 = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(torch.tanh(self.l1(x)))


def _p2(tmp_path: Path, hook: bool, spectral: bool = False) -> list[Finding]:
    torch.manual_seed(0)
    model = Siamese()
    if spectral:  # its weight is then l3.parametrizations.weight.original, held by that module
        model.l3 = nn.utils.parametrizations.spectral_norm(model.l3)
    if hook:
        model.l3.bias.register_hook(lambda g: g * 0.0)

    def loop(opt: torch.optim.Optimizer) -> None:
        g = torch.Generator().manual_seed(1)
        for _ in range(6):
            a, b = torch.randn(10, 8, generator=g), torch.randn(10, 8, generator=g)
            opt.zero_grad()
            out = model(a) if hook else model(a) - model(b)
            nn.functional.cross_entropy(out, torch.randint(0, 3, (10,), generator=g)).backward()
            opt.step()
    return _of(_record(tmp_path / f"p2-{hook}.tscope", model, loop), "P2")


def test_p2_a_bias_a_hook_zeroes_names_the_hook_not_a_design(tmp_path: Path) -> None:
    (p2,) = _p2(tmp_path, hook=True)
    assert "by design" not in p2["message"] and "bias=False" not in p2["fix"], p2
    assert "a tensor hook (register_hook) on l3.bias" in p2["message"], p2["message"]
    assert p2["params"] == ["l3.bias"]


@pytest.mark.parametrize("spectral", [False, True])
def test_p2_a_bias_that_cancels_out_is_still_said_so(tmp_path: Path, spectral: bool) -> None:
    """Control: no hook, ``f(a) - f(b)``: the bias cancels out of the loss, by design -- its
    layer's weight under ``spectral_norm`` too (QA 44d: a "dead branch" warning, the weight
    being held by ``l3.parametrizations.weight``, not by ``l3``)."""
    (p2,) = _p2(tmp_path, hook=False, spectral=spectral)
    assert p2["severity"] == "info" and "cancels out of the loss, by design" in p2["message"], p2
    assert p2["params"] == ["l3.bias"]
