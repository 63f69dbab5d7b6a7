"""Optimizers that rewrite or hide the gradients: a differential-privacy wrapper (Opacus's
``DPOptimizer`` shape), sparse embedding gradients, and zeros written in place between an
LBFGS closure's passes.  Each is checked against what plain PyTorch holds at the update.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class PrivateSGD(torch.optim.Optimizer):
    """Opacus's ``DPOptimizer`` in miniature: an Optimizer subclass that never runs
    ``Optimizer.__init__`` (so it has no step hooks) and delegates to
    ``.original_optimizer`` after clipping the gradients and adding noise to them."""

    def __init__(self, inner: torch.optim.Optimizer, max_norm: float, sigma: float) -> None:  # noqa: D107
        self.original_optimizer = inner
        self.max_norm, self.sigma = max_norm, sigma

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.original_optimizer.param_groups

    def zero_grad(self, set_to_none: bool = False) -> None:
        self.original_optimizer.zero_grad(set_to_none)

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, self.max_norm)
        for p in params:
            p.grad.add_(torch.randn_like(p.grad), alpha=self.sigma)
        self.original_optimizer.step()


def _private_run(tmp_path: Path, watched: bool) -> tuple[Path, list[float], dict[str, torch.Tensor], str]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))
    for p in model.parameters():
        p.grad_sample = None  # type: ignore[attr-defined]  # what Opacus's GradSampleModule marks
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = PrivateSGD(inner, max_norm=0.5, sigma=0.3)
    applied: list[float] = []
    inner.register_step_pre_hook(
        lambda o, a, k: applied.append(math.sqrt(sum(float(p.grad.double().norm()) ** 2 for p in model.parameters())))
    )
    path = tmp_path / "private.tscope"
    w = torchscope.watch(model, opt, server=None, record=path) if watched else None
    for _ in range(6):
        x, y = torch.randn(16, 10), torch.randint(0, 2, (16,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    if w is not None:
        w.close()
    return path, applied, {k: v.clone() for k, v in model.state_dict().items()}, ""


def test_a_private_optimizer_is_followed_through_its_inner_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, applied, params, _ = _private_run(tmp_path, watched=True)
    told = capsys.readouterr().err
    _, _, plain, _ = _private_run(tmp_path / "plain", watched=False)
    assert all(torch.equal(params[k], plain[k]) for k in plain)
    assert "no step hooks" not in told
    events = list(iter_events(path))
    assert events[0].get("per_sample_grads") is True
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 6
    # the gradient the update applied (clipped, noised), not the one backward left
    recorded = [math.sqrt(sum(v * v for v in st["grads"]["norm"] if v is not None)) for st in steps]
    assert recorded == pytest.approx(applied, rel=1e-5)


def _bag_run(tmp_path: Path, forget: bool) -> Path:
    torch.manual_seed(0)
    emb = nn.EmbeddingBag(50, 8, mode="mean", sparse=True)
    head = nn.Linear(8, 2)
    model = nn.ModuleDict({"emb": emb, "head": head})
    sparse_opt = torch.optim.SparseAdam(list(emb.parameters()), lr=1e-2)
    dense_opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    path = tmp_path / f"bag_{forget}.tscope"
    with torchscope.watch(model, dense_opt, server=None, record=path):
        for _ in range(5):
            ids, offsets = torch.randint(0, 50, (40,)), torch.arange(0, 40, 5)
            y = torch.randint(0, 2, (8,))
            dense_opt.zero_grad()
            if not forget:
                sparse_opt.zero_grad()
            nn.functional.cross_entropy(head(emb(ids, offsets)), y).backward()
            sparse_opt.step()
            dense_opt.step()
    return path


def test_a_sparse_gradient_left_from_the_last_step_is_seen(tmp_path: Path) -> None:
    path = _bag_run(tmp_path, forget=True)
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert all(st["grads"]["pre_nonzero"] == [0] for st in steps[1:])  # emb.weight, every later step
    p5 = [f for f in diagnose(iter_events(path)) if f["code"] == "P5"]
    assert p5 and p5[0]["severity"] == "error"
    clean = _bag_run(tmp_path, forget=False)
    assert all(st["grads"].get("pre_nonzero", []) == [] for st in iter_events(clean) if st["kind"] == "step")
    assert [f for f in diagnose(iter_events(clean)) if f["code"] in ("P5", "P15")] == []


def test_zeros_written_in_place_between_closure_passes_are_a_reset(tmp_path: Path) -> None:
    """LBFGS evaluates its closure several times per step; a closure that clears with
    ``zero_grad(set_to_none=False)`` starts each pass from zeros: no accumulation (P15)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    x, y = torch.randn(32, 6), torch.randn(32, 1)

    def closure() -> torch.Tensor:
        opt.zero_grad(set_to_none=False)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    path = tmp_path / "lbfgs.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(4):
            opt.step(closure)
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert len(steps) == 4
    for st in steps:
        assert st["micro_batches"] >= 2  # several passes in each step
        assert st["zero_grad"] == st["micro_batches"]  # each one from zeros
    assert [f for f in diagnose(iter_events(path)) if f["code"] in ("P5", "P15")] == []


class ClippedSGD(torch.optim.SGD):
    """A subclass whose step() clips, then calls SGD's: torch wraps both classes' step() (each
    patched by the first Optimizer.__init__ of its class) and runs the step hooks in each."""

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for group in self.param_groups:
            torch.nn.utils.clip_grad_norm_(group["params"], 0.5)
        return super().step(closure)


def test_a_subclass_step_calling_super_is_one_step(tmp_path: Path) -> None:
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # SGD's own step() is wrapped now
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = ClippedSGD(model.parameters(), lr=0.1)
    hooks_ran: list[int] = []
    opt.register_step_pre_hook(lambda o, a, k: hooks_ran.append(1))
    path = tmp_path / "sub.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(5):
            opt.zero_grad()
            nn.functional.mse_loss(model(torch.randn(8, 6)), torch.randn(8, 2)).backward()
            opt.step()
    assert len(hooks_ran) == 10  # torch's own behaviour: the hooks run twice a step
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [0, 1, 2, 3, 4]
    assert all(e["micro_batches"] == 1 and e["grads"]["norm"][0] is not None for e in steps)
    assert [f for f in diagnose(iter_events(path)) if f["severity"] != "info"] == []


def test_a_subclass_step_calling_super_has_the_gradients_it_applied(tmp_path: Path) -> None:
    """ClippedSGD clips in its own step(), then calls SGD's: the gradient statistics are those
    SGD's update used, clipped, not those backward left (read before the subclass's step ran)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = ClippedSGD(model.parameters(), lr=0.1)
    applied: list[list[float]] = []  # each parameter gradient's norm after the step: what SGD applied
    path = tmp_path / "clipped.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(4):
            opt.zero_grad()
            (10.0 * nn.functional.mse_loss(model(torch.randn(8, 6)), torch.randn(8, 2))).backward()
            raw = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
            opt.step()
            applied.append([float(p.grad.norm()) for p in model.parameters()])
            assert raw > 0.5  # the clip did something
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert len(steps) == 4
    for e, norms in zip(steps, applied, strict=True):
        assert e["grads"]["norm"] == pytest.approx(norms, rel=1e-5)
        total = sum(n * n for n in e["grads"]["norm"]) ** 0.5
        assert total <= 0.5 + 1e-5


@pytest.mark.parametrize("native", ["1", "0"])
def test_full_mode_records_every_step_of_a_sparse_embedding(tmp_path: Path, native: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``Embedding(sparse=True)`` in ``full`` mode: the Python recorder's NaN check of an op's
    output ran aminmax on the sparse gradient, which it does not take -- an internal error that
    turned the op capture off for the rest of the run (graphs of 0 ops from step 1 on)."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", native)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 4, sparse=True), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "sparse.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(3):
            opt.zero_grad()
            model(torch.randint(0, 20, (8,))).pow(2).mean().backward()
            opt.step()
    events = list(iter_events(path))
    graphs = [e for e in events if e["kind"] == "graph"]
    assert len(graphs) == 3 and all(len(g["ops"]) == len(graphs[0]["ops"]) > 0 for g in graphs)
    assert [e for e in events if e["kind"] == "log" and e["level"] == "error"] == []
