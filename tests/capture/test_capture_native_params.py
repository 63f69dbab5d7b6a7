"""The native extension's per-parameter facts of a step boundary (native/stats.cpp's
param_grads and grads_nonzero, native/storage.cpp): the same values the Python paths give, and
None wherever a tensor is one those paths must read themselves."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from torchscope import _grads, _memory, _native
from torchscope._watch import _ptr_sum


@pytest.fixture(scope="module")
def ext() -> Any:
    ext = _native.get(block=True)
    assert ext is not None, f"the native extension did not build: {_native._error}"
    return ext


class _Without:
    """The extension without some of its functions (they answer None, as for a tensor they
    cannot read), so the Python code takes the path it takes without them."""

    def __init__(self, ext: Any, names: set[str]) -> None:
        self._ext, self._names = ext, names

    def __getattr__(self, name: str) -> Any:
        if name in self._names:
            return lambda *args, **kwargs: None
        return getattr(self._ext, name)


def _param(grad: torch.Tensor | None, shape: tuple[int, ...] = (3,), dtype: torch.dtype = torch.float32) -> nn.Parameter:
    p = nn.Parameter(torch.zeros(shape, dtype=dtype))
    p.grad = grad
    return p


def _mixed() -> list[nn.Parameter | None]:
    """Every kind of parameter a step boundary meets."""
    gen = torch.Generator().manual_seed(0)
    big = torch.randn(70_000, generator=gen)
    big[big < -0.5] = 0.0
    frozen = nn.Parameter(torch.zeros(2), requires_grad=False)
    bad = torch.tensor([1.0, math.nan, math.inf, -math.inf, 2.0], dtype=torch.float64)
    return [
        _param(big.reshape(700, 100).clone(), (700, 100)),
        None,  # a parameter gone
        _param(None),  # requires grad, got none: in "none"
        frozen,  # no grad, does not require one
        _param(bad, (5,), torch.float64),  # NaN and Inf counted
        _param(torch.randn(33, generator=gen).half(), (33,), torch.float16),
        _param(torch.randn(9, generator=gen).bfloat16(), (9,), torch.bfloat16),
        _param(torch.tensor([4.0]), (1,)),  # one value: std is NaN
        _param(torch.zeros(0), (0,)),  # empty: no statistics
    ]


def _same(a: Any, b: Any) -> bool:
    """Equal, bit for bit where floats (the same pass and the same arithmetic), NaN to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) and type(a) is type(b)


@pytest.mark.parametrize("full", [True, False])
def test_param_grads_are_the_python_columns(ext: Any, full: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    params = _mixed()
    loss = torch.tensor(0.25)
    monkeypatch.setattr(_native, "loaded", lambda: ext)
    native_stats, native_extra = _grads.GradRead(params, [loss], full, defer=False).result()
    # the path before param_grads: per-tensor passes (grads_stats) and the columns in Python
    monkeypatch.setattr(_native, "loaded", lambda: _Without(ext, {"param_grads"}))
    py_stats, py_extra = _grads.GradRead(params, [loss], full, defer=False).result()
    assert native_extra == py_extra == [0.25]
    assert set(native_stats) == set(py_stats)
    for column, values in py_stats.items():
        assert _same(native_stats[column], values), column  # type: ignore[literal-required]
    assert native_stats["none"] == [2]
    assert native_stats["nan"][4] == 1 and native_stats["inf"][4] == 2
    assert native_stats["norm"][8] is None  # empty
    if full:
        assert math.isnan(native_stats["std"][7])  # type: ignore[typeddict-item]
        assert native_stats["zero_frac"][0] == pytest.approx(  # type: ignore[typeddict-item]
            float((params[0].grad == 0).double().mean()), rel=1e-12  # type: ignore[union-attr]
        )


def test_param_grads_leave_what_they_cannot_read_to_torch(ext: Any) -> None:
    transposed = _param(torch.randn(4, 3).t(), (3, 4))  # not contiguous
    assert ext.param_grads([_param(torch.ones(3)), transposed], True) is None
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (3,), check_invariants=True)
    assert ext.param_grads([_param(torch.ones(3)), _param(sparse)], True) is None  # Embedding(sparse=True)'s
    non_leaf = torch.ones(3, requires_grad=True) * 2
    assert ext.param_grads([non_leaf], False) is None  # reading its .grad warns: Python's call
    with pytest.raises(TypeError):
        ext.param_grads([torch.ones(1), "not a tensor"], False)
    # and GradRead then gives torch's values
    stats, _ = _grads.GradRead([transposed], [], True, defer=False).result()
    assert stats["norm"][0] == pytest.approx(float(transposed.grad.norm()), rel=1e-6)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "grads",
    [
        [None, None],
        [torch.zeros(5), torch.zeros(3, dtype=torch.float64)],
        [torch.full((4,), -0.0), torch.zeros(2, dtype=torch.float16)],  # -0.0 is zero
        [torch.zeros(5), torch.tensor([0.0, math.nan])],  # NaN is not
        [torch.zeros(100_003), torch.zeros(7, dtype=torch.bfloat16)],
        [torch.cat([torch.zeros(100_002), torch.tensor([1e-40])]), torch.tensor([0.0, 6e-8]).half()],  # subnormals
        [torch.zeros(0), torch.tensor([0.0, 3.0], dtype=torch.bfloat16)],
    ],
)
def test_grads_nonzero_is_the_python_check(
    ext: Any, grads: list[torch.Tensor | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    params: list[torch.Tensor | None] = [None] + [_param(g, tuple(g.shape), g.dtype) if g is not None else _param(None) for g in grads]
    got = ext.grads_nonzero(params)
    assert got is not None
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "0")  # torch's reductions
    assert got == _grads.nonzero_grads(params)
    assert ext.grads_nonzero([_param(torch.zeros(4, 3).t(), (3, 4))]) is None  # not contiguous: torch's


def test_storages_are_the_python_ones(ext: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    base = torch.zeros(10)
    params: list[Any] = [
        _param(base[2:5], (3,)),  # a view: its whole storage
        _param(base[5:8], (3,)),  # the same storage once
        _param(None),
        None,
        _param(torch.ones(4, dtype=torch.float16), (4,), torch.float16),
    ]
    live = [p for p in params if p is not None]
    native_grads, native_sum, native_st = ext.grad_storages(params), ext.ptr_sum(live), ext.storages(live)
    assert ext.grad_storages(live) == native_grads  # None items are skipped
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "0")
    assert native_grads == _memory.grad_storages(live) == {base.untyped_storage().data_ptr(): 40, params[4].grad.untyped_storage().data_ptr(): 8}
    assert native_sum == _ptr_sum(live) == sum(p.data_ptr() for p in live)
    assert native_st == _memory.storages(live)


def test_storages_leave_what_they_cannot_name_to_python(ext: Any) -> None:
    lazy = nn.LazyLinear(3).weight  # no storage of its own yet: Python tells it is lazy
    assert ext.storages([nn.Parameter(torch.ones(2)), lazy]) is None
    meta = torch.empty(3, device="meta")
    assert ext.ptr_sum([torch.ones(2), meta]) is None
    with pytest.raises(TypeError):
        ext.storages([torch.ones(1), 3])
