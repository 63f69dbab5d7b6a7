"""Gradient statistics of many parameters at once equal what plain PyTorch computes from each
``.grad``: the CPU path stacks gradients of one shape (a model of hundreds of small
parameters would otherwise pay one dispatched op per parameter and column) and must give
the same columns as one reduction per gradient -- zeros, NaN and Inf, low precision and
complex gradients included."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from torchscope._grads import _GROUP_NUMEL, grad_stats


def _param(g: torch.Tensor) -> torch.Tensor:
    p = torch.nn.Parameter(torch.zeros_like(g))
    p.grad = g
    return p


def _expected(g: torch.Tensor) -> dict[str, float]:
    m = (g.abs() if g.is_complex() else g).double()
    return {
        "norm": m.norm().item(),
        "max_abs": m.abs().max().item(),
        "mean": m.mean().item(),
        "std": m.std().item() if m.numel() > 1 else math.nan,
        "zero_frac": (m == 0).double().mean().item(),
    }


def _params() -> list[torch.Tensor]:
    torch.manual_seed(0)
    out = []
    for _ in range(12):  # one shape, a group: a third of the values zero (dead ReLUs)
        g = torch.randn(16, 8)
        g[g > 0.4] = 0
        out.append(g)
    out[3][0, 0] = float("nan")
    out[5][1, 1] = float("inf")
    out += [torch.randn(16, 8, dtype=torch.bfloat16) for _ in range(3)]
    out += [torch.randn(4, 4, dtype=torch.complex64) for _ in range(2)]
    out += [torch.randn(8), torch.zeros(8), torch.randn(3, 5)]  # one vector group, a singleton
    out.append(torch.randn(_GROUP_NUMEL + 1))  # too large to stack: its own reductions
    return [_param(g) for g in out]


@pytest.mark.parametrize("full", [True, False])
def test_stats_of_many_parameters_equal_each_gradients_own(full: bool) -> None:
    params = _params()
    stats, _ = grad_stats(params, full=full)
    for i, p in enumerate(params):
        assert p.grad is not None
        exp = _expected(p.grad)
        cols = ["norm", "max_abs", "mean", "std", "zero_frac"] if full else ["norm"]
        for k in cols:
            got = stats[k][i]  # type: ignore[literal-required]
            if math.isnan(exp[k]):  # a NaN gradient's norm, max and mean; an Inf one's std
                assert math.isnan(got), (i, k, got)
            else:
                assert got == pytest.approx(exp[k], rel=2e-3, abs=1e-6), (i, k)
        g = p.grad.abs() if p.grad.is_complex() else p.grad
        assert stats["nan"][i] == int(torch.isnan(g).sum()) and stats["inf"][i] == int(torch.isinf(g).sum())


def test_which_gradients_hold_a_nonzero_before_backward() -> None:
    """``nonzero_grads`` (P5: a .grad not reset before backward) on many parameters: the
    stacked same-shape path and the one-by-one path name exactly the gradients that hold a
    non-zero -- a NaN counts, a value as small as 1e-30 does too."""
    from torchscope._grads import nonzero_grads

    grads = [torch.zeros(4, 4) for _ in range(10)] + [torch.zeros(_GROUP_NUMEL + 1)]
    grads += [torch.zeros(2, dtype=torch.complex64) for _ in range(4)]
    grads[2][1, 1] = -3.0
    grads[5][0, 0] = float("nan")
    grads[7][3, 3] = 1e-30
    grads[10][5] = 1.0
    grads[12][0] = 1j
    params: list[torch.Tensor | None] = [_param(g) for g in grads]
    expected = [i for i, g in enumerate(grads) if bool((g != 0).any())]
    assert expected == [2, 5, 7, 10, 12]
    assert nonzero_grads(params + [None]) == (expected, False, False)
    assert nonzero_grads([_param(torch.zeros(3)) for _ in range(5)]) == ([], False, True)


def test_a_sparse_gradient_has_the_stats_of_its_dense_form() -> None:
    """An Embedding(sparse=True)'s gradient (uncoalesced: a row looked up twice is stored twice)
    gets the columns of its dense form -- it had none (no norm, no NaN check)."""
    emb = torch.nn.Embedding(10, 4, sparse=True)
    dense = torch.nn.Linear(4, 1)
    dense(emb(torch.tensor([[1, 3, 3, 7]])).mean(1)).sum().backward()
    assert emb.weight.grad is not None and emb.weight.grad.is_sparse and not emb.weight.grad.is_coalesced()
    for full in (True, False):
        stats, _ = grad_stats([emb.weight, dense.weight], full=full)
        for i, p in enumerate((emb.weight, dense.weight)):
            assert p.grad is not None
            exp = _expected(p.grad.to_dense())
            for k in ["norm", "max_abs", "mean", "std", "zero_frac"] if full else ["norm"]:
                assert stats[k][i] == pytest.approx(exp[k], rel=1e-5, abs=1e-7), (i, k)  # type: ignore[literal-required]
        assert stats["none"] == [] and stats["nan"] == [0, 0]


def _offset_grads() -> list[torch.Tensor]:
    """Gradients whose |mean| is ~1000x their std (a bias fed a near-constant signal, a scale
    parameter): sum(g^2) - sum(g)^2 / n cancels to a few digits there in float32."""
    torch.manual_seed(1)
    out = [5.0 + 0.005 * torch.randn(4096), -3.0 + 0.003 * torch.randn(300)]
    out += [2.0 + 0.002 * torch.randn(8, 16) for _ in range(6)]  # one shape: the stacked path
    out.append(1e3 + 1e-3 * torch.randn(5000, dtype=torch.float64))
    return out


@pytest.mark.parametrize("native", [True, False])
def test_std_of_a_gradient_far_from_zero_mean(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded std equals the gradient's own to float32 precision however far its mean is
    from zero, in C++ (shifted sums) and through torch (its variance), stacked or one by one."""
    from torchscope import _native

    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, _native._error
    params = [_param(g) for g in _offset_grads()]
    stats, _ = grad_stats(params, full=True)
    for i, p in enumerate(params):
        assert p.grad is not None
        exp = p.grad.double()
        assert stats["std"][i] == pytest.approx(exp.std().item(), rel=1e-5), i  # type: ignore[typeddict-item]
        assert stats["mean"][i] == pytest.approx(exp.mean().item(), rel=1e-6), i  # type: ignore[typeddict-item]


@pytest.mark.parametrize("native", [True, False])
def test_a_watched_runs_std_of_an_offset_gradient(
        tmp_path: Path, native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a run: a Linear fed inputs near 5 (unnormalised features), its weight's gradient
    about 1000x its spread from zero -- the step's std is the .grad's own."""
    import torchscope
    from torchscope import _native
    from torchscope.sessionfile import iter_events

    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, _native._error
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    seen: list[float] = []
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(3):
            x = 5.0 + 0.005 * torch.randn(64, 512)
            opt.zero_grad()
            model(x).sum().backward()
            seen.append(model.weight.grad.double().std().item())  # type: ignore[union-attr]
            opt.step()
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    got = [st["grads"]["std"][0] for st in steps if st["grads"].get("std")]
    assert got, "no step recorded the full columns"
    for st in steps:
        if st["grads"].get("std"):
            assert st["grads"]["std"][0] == pytest.approx(seen[st["step"]], rel=1e-5), st["step"]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("full", [True, False])
def test_a_finite_gradient_past_float32s_norm_is_not_read_as_inf(
        native: bool, full: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A diverging run's gradients reach 1e27 a value, finite in float32 while their float32
    norm overflows: without the C++ statistics the step read "Inf" (counts 0) and the doctor's
    explosion went untold (its jump factors need the norms)."""
    from torchscope import _native

    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, _native._error
    torch.manual_seed(0)
    grads = [1e27 * torch.randn(32, 8) for _ in range(6)]  # one shape: stacked
    grads += [1e26 * torch.randn(300), torch.randn(5)]  # one by one, and a normal one beside
    params = [_param(g) for g in grads]
    stats, _ = grad_stats(params, full=full)
    for i, g in enumerate(grads):
        assert torch.isfinite(g).all()
        exp = _expected(g)
        assert stats["nan"][i] == stats["inf"][i] == 0, i
        assert stats["norm"][i] == pytest.approx(exp["norm"], rel=1e-5), i
        if full:
            assert stats["std"][i] == pytest.approx(exp["std"], rel=1e-4), i  # type: ignore[typeddict-item]
            assert stats["max_abs"][i] == pytest.approx(exp["max_abs"], rel=1e-6), i  # type: ignore[typeddict-item]
