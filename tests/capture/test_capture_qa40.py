"""QA 39a's last open items, each against plain PyTorch: a module assigned after ``watch()``
(a new task head) is followed from the step of the swap, parameters replaced by
``load_state_dict(..., assign=True)`` keep their gradient columns on that step, an LBFGS
``step(closure)`` has its update ratio, and so has a complex parameter."""

from __future__ import annotations

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

MODES = ["default", "full"]


def _ratio(p: torch.Tensor, before: torch.Tensor) -> float:
    return float((p.detach() - before).abs().norm() / before.abs().norm())


@pytest.mark.parametrize("mode", MODES)
def test_a_head_assigned_after_watch_is_followed_from_the_step_of_the_swap(tmp_path: Path, mode: str) -> None:
    """Fine-tuning a new task head: ``model[2] = nn.Linear(...)`` at step 3, added to the
    optimizer.  The optimizer still holds the old head (its parameters never die), so nothing
    but the assignment tells the capture: its output rows were gone for the rest of the run,
    and on step 3 the new head's parameters read "no gradient" (a false P1)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    path = tmp_path / "swap.tscope"
    true: dict[int, list[float]] = {}
    outs: dict[int, float] = {}
    with torchscope.watch(model, opt, server=None, record=path, mode=mode, sample_every=2):
        for i in range(6):
            if i == 3:
                model[2] = nn.Linear(16, 1)
                opt.add_param_group({"params": list(model[2].parameters())})
            handle = model[2].register_forward_hook(lambda _m, _a, out, i=i: outs.__setitem__(i, float(out.detach().norm())))
            loss = F.mse_loss(model(torch.randn(8, 8)), torch.randn(8, 1))
            handle.remove()
            opt.zero_grad()
            loss.backward()
            true[i] = [float(p.grad.norm()) for p in model.parameters()]
            opt.step()
    steps = {e["step"]: e for e in load(path).steps}
    for i in range(6):
        assert steps[i]["grads"]["none"] == [], (i, steps[i]["grads"]["none"])
        assert steps[i]["grads"]["norm"] == pytest.approx(true[i], rel=1e-5), i
    for i in (3, 4) if mode == "full" else (4,):  # captured steps after the swap
        rows = {r["module"]: r for r in steps[i]["activations"]}
        assert "2" in rows, (i, sorted(rows))
        assert rows["2"]["norm"] == pytest.approx(outs[i], rel=1e-5)
    if mode == "full":  # (default reads updates on captured steps and every 10th)
        assert steps[3]["grads"]["update_ratio"][2] is not None
    assert not [f for f in diagnose(iter_events(path)) if f["code"] == "P1"]


def test_parameters_replaced_by_load_state_dict_assign_keep_their_gradient_columns(tmp_path: Path) -> None:
    """A rollback with ``assign=True`` and the optimizer re-pointed: the swap step's columns
    were all None with ``none == []``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    path = tmp_path / "assign.tscope"
    true: dict[int, list[float]] = {}
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        snap: dict[str, torch.Tensor] = {}
        for i in range(6):
            if i == 2:
                snap = {k: v.clone() for k, v in model.state_dict().items()}
            if i == 4:
                model.load_state_dict(snap, assign=True)
                opt.param_groups[0]["params"] = list(model.parameters())
                opt.state.clear()
            loss = F.mse_loss(model(torch.randn(8, 8)), torch.randn(8, 1))
            opt.zero_grad()
            loss.backward()
            true[i] = [float(p.grad.norm()) for p in model.parameters()]
            opt.step()
    for e in load(path).steps:
        assert e["grads"]["norm"] == pytest.approx(true[e["step"]], rel=1e-5), e["step"]
        assert all(r is not None for r in e["grads"]["update_ratio"]), e["step"]


@pytest.mark.parametrize("mode", MODES)
def test_an_lbfgs_step_has_its_update_ratio(tmp_path: Path, mode: str) -> None:
    """LBFGS makes the gradients inside step(): a sample of the parameters with a gradient at
    step()'s entry had none on step 0, and in default mode the step's capture, decided by its
    first forward (in the closure), came too late for any."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    x = torch.randn(32, 4)
    y = x.sum(1, keepdim=True).sin()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    path = tmp_path / "lbfgs.tscope"
    true: list[float] = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode, sample_every=4):
        for _ in range(5):
            before = model[0].weight.detach().clone()
            opt.step(closure)
            true.append(_ratio(model[0].weight, before))
    got = {e["step"]: (e["grads"].get("update_ratio") or [None])[0] for e in load(path).steps}
    expect = range(5) if mode == "full" else (0, 4)  # default: the steps with full statistics
    for i in expect:
        assert got[i] == pytest.approx(true[i], rel=1e-3), (i, got, true)


def test_a_complex_parameter_has_its_update_ratio_and_weight_norm(tmp_path: Path) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 8, dtype=torch.cfloat) * 0.3)
            self.out = nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> Any:
            return self.out((x.to(torch.cfloat) @ self.w).abs())

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    path = tmp_path / "complex.tscope"
    true: list[tuple[float, float]] = []
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(3):
            loss = F.mse_loss(model(torch.randn(6, 8)), torch.randn(6, 1))
            opt.zero_grad()
            loss.backward()
            before = model.w.detach().clone()
            opt.step()
            true.append((_ratio(model.w, before), float(model.w.detach().abs().norm())))
    for e, (ratio, norm) in zip(load(path).steps, true, strict=True):
        assert e["grads"]["update_ratio"][0] == pytest.approx(ratio, rel=1e-4)
        assert e["grads"]["weight_norm"][0] == pytest.approx(norm, rel=1e-5)


def test_a_huge_but_finite_output_has_a_finite_norm(tmp_path: Path) -> None:
    """Values ~1e20 (a diverging run's activations, still finite in float32): the C++ pass's
    float lanes squared them past float32's range and read a norm of inf beside finite min
    and max and no Inf counted; the sums are taken again in doubles then."""

    class Scale(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 1e20

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), Scale())
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    path = tmp_path / "huge.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        out = model(torch.randn(16, 8))
        out.mean().backward()
        opt.step()
    assert bool(torch.isfinite(out).all())
    [row] = [r for r in load(path).steps[0]["activations"] if r["module"] == "1"]
    assert row["norm"] == pytest.approx(float(out.detach().double().norm()), rel=1e-6)
    assert row["rms"] == pytest.approx(float(out.detach().double().pow(2).mean().sqrt()), rel=1e-6)
