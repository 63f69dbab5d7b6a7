"""Gradient statistics read one boundary later (what the capture does on CUDA, so that no step
waits for the GPU), run here on CPU by adding "cpu" to ``GradRead.DEFER_ON``: the events are
the same as when read at once, in the same order, none lost at close; a step whose gradients
first turn non-finite reports lower-bound NaN counts and the next step exact ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope._grads import GradRead, _elements_of, _stack
from torchscope.sessionfile import iter_events


def _train(path: Path, mode: str) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode, sample_every=4):
        for _ in range(11):
            loss = nn.functional.cross_entropy(model(torch.randn(8, 6)), torch.randint(0, 3, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [e for e in iter_events(path) if e["kind"] in ("step", "graph")]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_deferred_reads_give_the_same_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    # both reads with torch's reductions: the native one-pass statistics (read at once on the
    # CPU) round differently in the last bits (test_capture_native compares them)
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "0")
    now = _train(tmp_path / "now.tscope", mode)
    monkeypatch.setattr(GradRead, "DEFER_ON", ("cuda", "cpu"))
    later = _train(tmp_path / "later.tscope", mode)
    assert [(e["kind"], e["step"]) for e in later] == [(e["kind"], e["step"]) for e in now]
    steps_now = [e for e in now if e["kind"] == "step"]
    steps_later = [e for e in later if e["kind"] == "step"]
    assert [s["step"] for s in steps_later] == list(range(11))  # the last one too: close finishes it
    for a, b in zip(steps_now, steps_later, strict=True):
        assert b["loss"] == a["loss"] and b["losses"] == a["losses"]
        assert b["grads"] == a["grads"]
    if mode == "default":  # each graph follows its own step's event
        kinds = [(e["kind"], e["step"]) for e in later]
        for k, (kind, step) in enumerate(kinds):
            if kind == "graph":
                assert kinds[k - 1] == ("step", step)


def test_deferred_nonfinite_counts_are_lower_bounds_then_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(GradRead, "DEFER_ON", ("cuda", "cpu"))
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "nan.tscope"
    exact: list[list[int]] = []
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for i in range(5):
            x = torch.randn(3, 4)
            if i >= 2:
                x[0, 0] = float("nan")
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            exact.append([int(torch.isnan(p.grad).sum()) for p in model.parameters()])  # type: ignore[arg-type]
            opt.step()  # NaN parameters from here on: every later gradient is NaN throughout
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert [s["grads"]["nan"] for s in steps[:2]] == [[0, 0], [0, 0]]
    first = steps[2]["grads"]["nan"]
    assert exact[2][0] > 1 and first == [1 if n else 0 for n in exact[2]]  # lower bounds
    assert exact[3] == [8, 2]
    assert [s["grads"]["nan"] for s in steps[3:]] == exact[3:]  # exact again from the next step


def _scaled(path: Path) -> list[dict[str, Any]]:
    """A GradScaler loop and a loop without an optimizer (``Watch.step()`` boundaries)."""
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    with torchscope.watch(model, opt, server=None, record=path, mode="light", scaler=scaler):
        for _ in range(5):
            opt.zero_grad()
            loss = model(torch.randn(4, 6)).pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    other = nn.Linear(6, 3)
    with torchscope.watch(other, server=None, record=path.with_suffix(".manual.tscope"), mode="light") as w:
        for _ in range(4):
            other(torch.randn(4, 6)).sum().backward()
            w.step()
    return [e for p in (path, path.with_suffix(".manual.tscope")) for e in iter_events(p) if e["kind"] == "step"]


def test_deferred_reads_with_a_scaler_and_manual_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "0")  # both with torch's reductions (see above)
    now = _scaled(tmp_path / "now.tscope")
    monkeypatch.setattr(GradRead, "DEFER_ON", ("cuda", "cpu"))
    later = _scaled(tmp_path / "later.tscope")
    assert len(now) == len(later) == 9
    for a, b in zip(now, later, strict=True):
        assert (b["step"], b["loss"], b["grads"], b.get("scaler")) == (a["step"], a["loss"], a["grads"], a.get("scaler"))
    assert [s["scaler"]["scale"] for s in later[:5]] == [256.0] * 5


@pytest.mark.parametrize("later", [False, True], ids=["read-now", "read-later"])
def test_half_precision_gradient_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, later: bool) -> None:
    """fp16 gradients of 90,000 values: the non-zero count and the sum are read exactly on both
    paths (stacked with the fp16 norms, they were fp16 too: 90,000 is past fp16's largest value)."""
    if later:
        monkeypatch.setattr(GradRead, "DEFER_ON", ("cuda", "cpu"))
    torch.manual_seed(0)
    model = nn.Linear(300, 300).half()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    path = tmp_path / "half.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        opt.zero_grad()
        model(torch.randn(4, 300).half()).pow(2).mean().backward()  # an fp16 loss too
        g = model.weight.grad.double()  # type: ignore[union-attr]
        opt.step()
    grads = next(e for e in iter_events(path) if e["kind"] == "step")["grads"]  # step 0: every column
    assert grads["zero_frac"][0] == pytest.approx(float((g == 0).double().mean()), abs=1e-6)
    assert grads["mean"][0] == pytest.approx(float(g.mean()), rel=1e-3, abs=1e-9)
    assert grads["norm"][0] == pytest.approx(float(g.norm()), rel=1e-3)


def test_stacked_values_use_the_buffer_they_are_elements_of() -> None:
    """``_stack`` takes the buffer a multi-tensor kernel returned its values in (CUDA's
    ``_foreach_norm``) as is, and stacks anything else; the values are the same either way."""
    buf = torch.arange(5.0)
    views = [buf[i] for i in range(5)]
    assert _elements_of(views) is not None and _elements_of(views).data_ptr() == buf.data_ptr()
    assert _elements_of(views[1:]) is None  # not the whole buffer
    assert _elements_of([buf[i] for i in (0, 2, 1, 3, 4)]) is None  # not in order
    assert _elements_of([torch.tensor(float(i)) for i in range(5)]) is None  # separate tensors
    rest = [torch.tensor(7), torch.tensor(0.5, dtype=torch.float16)]
    for norms in (views, [torch.tensor(float(i)) for i in range(5)]):
        out = _stack(norms, rest)
        assert out.dtype == torch.float32 and out.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 7.0, 0.5]
