"""A module called several times in one step: its output gradient is all its calls' together.

An RNN cell unrolled over the time steps, one block applied to two branches, a layer run on
each micro-batch: the gradient flowing out of the module is every call's, not the first
call's only.  Checked against tensor hooks the test registers on every call's output, with and
without the native extension (its C++ pass and the torch path take the statistics apart).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events

STEPS_T = 6  # the cell's calls per forward
LONG_T = 40  # past the calls watched per module (ACT_CALLS)


class Unrolled(nn.Module):
    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps
        self.cell = nn.RNNCell(4, 8)
        self.shared = nn.Linear(8, 8)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], 8)
        for t in range(self.steps):
            h = self.cell(x[:, t % x.shape[1]], h)
        # one block, two branches: its two calls' gradients differ
        return self.head(torch.relu(torch.cat([self.shared(h), self.shared(h * 2 - 1)], dim=1)))


def _train(tmp_path: Path, steps_t: int, accum: int) -> tuple[list[dict[str, Any]], list[dict[str, list[torch.Tensor]]]]:
    torch.manual_seed(0)
    model = Unrolled(steps_t)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    by_hand: list[dict[str, list[torch.Tensor]]] = []

    def keep(path: str) -> Any:
        def fwd_hook(m: nn.Module, args: Any, out: torch.Tensor) -> None:
            grads = by_hand[-1].setdefault(path, [])
            out.register_hook(lambda g: grads.append(g.detach().clone()))

        return fwd_hook

    for path in ("cell", "shared", "head"):
        model.get_submodule(path).register_forward_hook(keep(path))
    path = tmp_path / "unrolled.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(3):
            by_hand.append({})
            opt.zero_grad()
            for _ in range(accum):
                x, y = torch.randn(5, 3, 4), torch.randint(0, 3, (5,))
                (nn.functional.cross_entropy(model(x), y) / accum).backward()
            opt.step()
    return list(iter_events(path)), by_hand


def _expected(grads: list[torch.Tensor]) -> dict[str, float]:
    flat = torch.cat([g.flatten() for g in grads]).double()
    return {
        "norm": flat.norm().item(),
        "max_abs": flat.abs().max().item(),
        "zero_frac": (flat == 0).double().mean().item(),
    }


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_every_call_of_a_module_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    events, by_hand = _train(tmp_path, STEPS_T, accum=2)
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 3
    for st, hand in zip(steps, by_hand, strict=True):
        got = {a["module"]: a for a in st["activation_grads"]}
        # the cell: 6 calls in each of 2 micro-batches; the shared block: 2 in each
        assert len(hand["cell"]) == 2 * STEPS_T and len(hand["shared"]) == 4 and len(hand["head"]) == 2
        for path, grads in hand.items():
            a = got[path]
            want = _expected(grads)
            assert a["norm"] == pytest.approx(want["norm"], rel=1e-5)
            assert a["max_abs"] == pytest.approx(want["max_abs"], rel=1e-6)
            assert a["zero_frac"] == pytest.approx(want["zero_frac"], abs=1e-9)
            assert a["nan"] == 0 and a["inf"] == 0
            assert a["calls"] == len(grads)
        # the first call alone is not the answer (the test could tell the two apart)
        first = hand["shared"][0].double().norm().item()
        assert not math.isclose(got["shared"]["norm"], first, rel_tol=1e-3)
        # the zeros the ReLU after it leaves are counted over both branches' outputs
        assert 0 < got["shared"]["zero_frac"] < 1


def test_a_long_unrolled_cell_is_capped(tmp_path: Path) -> None:
    """Past ACT_CALLS calls in a step, the rest go unwatched (no hook each): the row gathers
    the first ones, and says how many."""
    from torchscope._watch import ACT_CALLS

    assert LONG_T > ACT_CALLS
    events, by_hand = _train(tmp_path, LONG_T, accum=1)
    for st, hand in zip([e for e in events if e["kind"] == "step"], by_hand, strict=True):
        cell = next(a for a in st["activation_grads"] if a["module"] == "cell")
        assert cell["calls"] == ACT_CALLS
        # the hooks of the test see the gradients in backward order: the latest call first
        first_calls = list(reversed(hand["cell"]))[:ACT_CALLS]
        assert cell["norm"] == pytest.approx(_expected(first_calls)["norm"], rel=1e-5)


class _ComplexMixer(nn.Module):
    """A complex-valued layer (spectral or signal models): its output gradient is complex."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8, dtype=torch.complex64) / 8)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.w


class _ComplexNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.mix = _ComplexMixer()
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.mix(self.inp(x).to(torch.complex64))
        return self.out(torch.cat([z.real, z.imag], dim=-1))


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_a_complex_output_has_its_gradient_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """A module whose output is complex gets an activation-gradient row, by magnitudes: the
    norm of |g| (the complex norm), max |g| and the zero fraction of the output's gradient; and
    a row of its values, the norm of |out|."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    torch.manual_seed(0)
    model = _ComplexNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []

    def keep(m: nn.Module, args: Any, out: torch.Tensor) -> None:
        out.register_hook(lambda g: seen.append(g.detach().clone()))
        outs.append(out.detach().clone())

    model.mix.register_forward_hook(keep)
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        opt.zero_grad()
        model(torch.randn(5, 4)).pow(2).mean().backward()
        opt.step()
    st = next(e for e in iter_events(path) if e["kind"] == "step")
    row = next((a for a in st["activation_grads"] if a["module"] == "mix"), None)
    assert row is not None, [a["module"] for a in st["activation_grads"]]
    assert len(seen) == 1
    mag = seen[0].abs().double()
    assert row["norm"] == pytest.approx(mag.norm().item(), rel=1e-5)
    assert row["max_abs"] == pytest.approx(mag.max().item(), rel=1e-6)
    assert row["zero_frac"] == pytest.approx((mag == 0).double().mean().item(), abs=1e-9)
    # ... and a row of the output's own values, by magnitude too (QA 46b: none)
    out_row = next((a for a in st["activations"] if a["module"] == "mix"), None)
    assert out_row is not None, [a["module"] for a in st["activations"]]
    assert out_row["norm"] == pytest.approx(outs[0].abs().double().norm().item(), rel=1e-5)


class _Checkpointed(nn.Module):
    """Two blocks inside one reentrant checkpoint: their forward runs again inside the backward,
    with no root forward around it."""

    def __init__(self, reentrant: bool | None) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.b1 = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.b2 = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.out = nn.Linear(8, 1)
        self.reentrant = reentrant

    def _inner(self, h: torch.Tensor) -> torch.Tensor:
        return self.b2(self.b1(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        if self.reentrant is None:
            return self.out(self._inner(h))
        from torch.utils.checkpoint import checkpoint

        return self.out(checkpoint(self._inner, h, use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [True, False])
def test_modules_inside_a_checkpoint_have_their_rows(tmp_path: Path, reentrant: bool) -> None:
    """Every block inside a checkpoint gets its row, equal to the same model's uncheckpointed
    output gradients: the reentrant recompute's outermost block was left on the module stack
    and had none."""
    x = torch.randn(6, 4)
    torch.manual_seed(0)
    plain = _Checkpointed(None)
    outs: dict[str, torch.Tensor] = {}
    for name in ("b1", "b2", "b1.0", "b2.0"):
        plain.get_submodule(name).register_forward_hook(
            lambda m, a, o, name=name: (o.retain_grad(), outs.__setitem__(name, o), None)[-1])
    plain(x).pow(2).mean().backward()
    torch.manual_seed(0)
    model = _Checkpointed(reentrant)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "ckpt.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    st = next(e for e in iter_events(path) if e["kind"] == "step")
    got = {a["module"]: a for a in st["activation_grads"]}
    for name, o in outs.items():
        assert name in got, (name, sorted(got))
        assert o.grad is not None
        assert got[name]["norm"] == pytest.approx(o.grad.double().norm().item(), rel=1e-6), name
