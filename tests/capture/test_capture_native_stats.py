"""The native extension's one-pass gradient statistics (capture/native/stats.cpp): the values
torch's reductions give, for every dtype it reads, NaN and Inf included; None where the torch
path must take them; and a watch reports the same statistics with it as without it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from capture_models import make
from torch import nn

import torchscope
from torchscope import _native
from torchscope.sessionfile import iter_events


@pytest.fixture(scope="module")
def ext() -> Any:
    ext = _native.get(block=True)
    assert ext is not None, f"the native extension did not build: {_native._error}"
    return ext


def _sample(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=g, dtype=torch.float64)
    t[t < -0.3] = 0.0  # zeros to count, as a ReLU's gradient has
    return t.to(dtype)


def _by_torch(t: torch.Tensor) -> tuple[float, float, float, int, float, float]:
    """norm, min, max, non-zeros, sum, population variance -- in float64, from the tensor's own
    values."""
    d = t.double()
    return (
        torch.linalg.vector_norm(d).item(),
        d.min().item(),
        d.max().item(),
        int(torch.count_nonzero(t)),
        d.sum().item(),
        d.var(correction=0).item(),
    )


def _close(a: float, b: float, rel: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == pytest.approx(b, rel=rel, abs=1e-12)


# sizes: shorter than a block, a block and a tail, and several chunks of the thread pool
@pytest.mark.parametrize("n", [7, 1000, 200_003])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_statistics_equal_torchs(ext: Any, n: int, dtype: torch.dtype) -> None:
    ts = [_sample(n, dtype, 0), _sample(max(n // 3, 1), dtype, 1).reshape(1, -1)]
    rel = 1e-6 if dtype == torch.float64 else 1e-5  # float lanes sum blocks of 16 values
    vals = ext.grads_stats(ts, True)
    k = len(ts)
    assert len(vals) == 6 * k
    for i, t in enumerate(ts):
        norm, lo, hi, nz, total, var = _by_torch(t)
        assert _close(vals[i], norm, rel)
        assert vals[k + i] == lo and vals[2 * k + i] == hi  # exact: min and max round nothing
        assert vals[3 * k + i] == nz
        assert vals[4 * k + i] == pytest.approx(total, rel=1e-4, abs=1e-6 * norm * math.sqrt(n))
        assert vals[5 * k + i] == pytest.approx(var, rel=1e-5)
    assert ext.grads_stats(ts, False) == pytest.approx(vals[:k], rel=1e-12)
    one = ext.tensor_stats(ts[0], False)
    assert list(one) == pytest.approx([vals[0], vals[k], vals[2 * k], vals[3 * k]], rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_nan_and_inf_are_counted_and_propagate(ext: Any, dtype: torch.dtype) -> None:
    t = _sample(5000, dtype, 2)
    t[[3, 700, 4999]] = float("nan")
    t[[10, 11]] = float("inf")
    t[12] = float("-inf")
    norm, lo, hi, nz, nans, infs = ext.tensor_stats(t, True)
    assert math.isnan(norm) and math.isnan(lo) and math.isnan(hi)  # as torch's norm, aminmax
    assert math.isnan(torch.linalg.vector_norm(t.float()).item()) and torch.aminmax(t.float()).min.isnan()
    assert nz == int(torch.count_nonzero(t))  # NaN is not zero
    assert (nans, infs) == (3, 3)
    t[[3, 700, 4999]] = 1.0
    norm, lo, hi, _, nans, infs = ext.tensor_stats(t, True)
    assert math.isinf(norm) and lo == -math.inf and hi == math.inf and (nans, infs) == (0, 3)
    # a gradient's sum of +inf and -inf is NaN, as torch's sum is
    s = ext.grads_stats([t], True)[4]
    assert math.isnan(s) and math.isnan(t.double().sum().item())


def test_what_it_cannot_read_goes_to_torch(ext: Any) -> None:
    x = torch.randn(8, 6)
    assert ext.tensor_stats(x.t(), False) is None  # not contiguous
    assert ext.tensor_stats(x.to(torch.int32), False) is None
    assert ext.tensor_stats(torch.randn(4, dtype=torch.complex64), False) is None
    assert ext.tensor_stats(torch.empty(0), False) is None
    assert ext.tensor_stats(torch._neg_view(x), False) is None  # its values are the negated data
    # a contiguous view into its storage is read from its own offset
    tail = x.flatten()[5:]
    assert ext.tensor_stats(tail, False)[0] == pytest.approx(torch.linalg.vector_norm(tail).item(), rel=1e-6)
    # one unreadable gradient sends them all to the torch path
    assert ext.grads_stats([x, x.t()], True) is None
    assert ext.grads_stats([x], False) is not None


def _watch(tmp_path: Path, kind: str, mode: str, native: bool, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    torch.manual_seed(0)
    model, batch = make(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / f"{kind}-{mode}-{native}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode, sample_every=5):
        for i in range(12):  # columns of every gradient at steps 0 and 10; default captures 0, 5, 10
            x, y = batch(i)
            opt.zero_grad()
            out = model(x)
            loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y)
            if i == 7:
                loss = loss * float("nan")  # non-finite gradients: counted, and the next steps armed
            loss.backward()
            opt.step()
            if i == 7:
                with torch.no_grad():
                    for p in model.parameters():
                        p.nan_to_num_(0.0)  # train on from finite weights
    return [e for e in iter_events(path) if e["kind"] == "step"]


@pytest.mark.parametrize(("kind", "mode"), [("zoo", "default"), ("cnn", "light"), ("transformer", "default")])
def test_a_watch_reports_the_same_statistics_with_and_without_it(
    ext: Any, kind: str, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _native.loaded() is ext
    on = _watch(tmp_path, kind, mode, True, monkeypatch)
    off = _watch(tmp_path, kind, mode, False, monkeypatch)
    assert len(on) == len(off) == 12
    full_cols = 0
    for a, b in zip(on, off, strict=True):
        assert a["loss"] == b["loss"] or (math.isnan(a["loss"]) and math.isnan(b["loss"]))
        ga, gb = a["grads"], b["grads"]
        assert set(ga) == set(gb)
        for col in ("nan", "inf", "none"):
            assert ga[col] == gb[col], (a["step"], col)
        for col in ("norm", "max_abs", "mean", "std", "zero_frac"):
            if col not in gb:
                continue
            full_cols += 1
            for i, (x, y) in enumerate(zip(ga[col], gb[col], strict=True)):
                assert (x is None) == (y is None)
                if x is None:
                    continue
                if col == "mean" and math.isfinite(y):  # a sum that cancels: to the norm's scale
                    assert x == pytest.approx(y, rel=1e-4, abs=1e-6 * gb["norm"][i]), (a["step"], i, x, y)
                else:
                    assert _close(x, y, 1e-4), (a["step"], col, i, x, y)
        acts_a = {r["module"]: r for r in a.get("activation_grads", [])}
        acts_b = {r["module"]: r for r in b.get("activation_grads", [])}
        assert acts_a.keys() == acts_b.keys()
        for m, r in acts_b.items():
            for col, y in r.items():
                x = acts_a[m][col]
                assert x == y if isinstance(y, (str, int)) else _close(x, y, 1e-4), (a["step"], m, col, x, y)
    assert full_cols > 12  # norms every step, the other columns on some
    assert any(s["grads"]["nan"][i] > 0 for s in on for i in range(len(s["grads"]["nan"])))
    if mode == "default":
        assert sum(bool(s.get("activation_grads")) for s in on) >= 3


def test_module_output_gradients_taken_in_cpp_hooks(ext: Any, tmp_path: Path) -> None:
    """The C++ pre-hooks on module outputs' nodes give the statistics computed by hand, also
    for an expanded gradient (``out.sum()``: stride 0, read from a copy), step after step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "acts.tscope"
    hand: list[dict[str, torch.Tensor]] = []

    def keep(name: str) -> Any:  # the gradient reaching the module's output, as PyTorch gives it
        def hook(m: nn.Module, args: Any, out: torch.Tensor) -> None:
            out.register_hook(lambda g: hand[-1].__setitem__(name, g.clone()))

        return hook

    model[0].register_forward_hook(keep("0"))
    model[1].register_forward_hook(keep("1"))
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for step in range(3):
            hand.append({})
            opt.zero_grad()
            (model(torch.randn(4, 5)).sum() * (step + 1)).backward()  # the last module's gradient: step + 1, expanded
            opt.step()
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert [s["step"] for s in steps] == [0, 1, 2]
    for step, (ev, grads) in enumerate(zip(steps, hand, strict=True)):
        got = {a["module"]: a for a in ev["activation_grads"]}
        assert got["2"]["norm"] == pytest.approx((step + 1) * math.sqrt(4 * 3)) and got["2"]["max_abs"] == step + 1
        assert got["2"]["zero_frac"] == 0.0 and got["2"]["nan"] == 0 and got["2"]["inf"] == 0
        for m in ("0", "1"):
            g = grads[m].double()
            assert got[m]["norm"] == pytest.approx(torch.linalg.vector_norm(g).item(), rel=1e-6)
            assert got[m]["max_abs"] == pytest.approx(g.abs().max().item(), rel=1e-6)
            assert got[m]["zero_frac"] == pytest.approx((g == 0).double().mean().item())


def test_compiled_autograd_runs_past_the_cpp_hooks(ext: Any, tmp_path: Path) -> None:
    """Compiled autograd collects a node's hooks to trace them: ours opt out of its graph
    (that step has no module-output statistics) instead of failing the user's backward."""
    import torch._dynamo.compiled_autograd as compiled_autograd

    def train(watched: bool) -> torch.Tensor:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        w = torchscope.watch(model, opt, server=None, record=tmp_path / "ca.tscope", mode="full") if watched else None
        for _ in range(2):
            opt.zero_grad()
            out = model(torch.randn(4, 5))
            with compiled_autograd._enable(lambda gm: torch.compile(gm, backend="eager")):
                out.sum().backward()
            opt.step()
        if w is not None:
            w.close()
        return model[0].weight.detach().clone()

    assert torch.equal(train(True), train(False))
    assert [e["step"] for e in iter_events(tmp_path / "ca.tscope") if e["kind"] == "step"] == [0, 1]
