"""``torch.func`` transforms in a watched loop: per-sample gradients (``vmap(grad(...))``, as
DP-SGD computes them) and forward-mode AD (``jvp``).  Inside a transform the model's forward
runs on functorch's wrapped tensors and its zero tangents are ZeroTensors without a storage:
the capture counts such a forward and records none of its tensors, and no part of it turns
off -- before, one per-sample step ended the recording of every later step in ``default`` and
``full`` (a wrapped tensor escaped the transform), and one ``jvp`` turned off the op and
backward capture for the rest of the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, jvp, vmap

import torchscope
from torchscope.sessionfile import iter_events


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(6, 8, generator=g), torch.randint(0, 2, (6,), generator=g)) for _ in range(n)]


def _per_sample_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    """DP-SGD's shape: per-sample gradients, clipped, averaged into .grad, one step."""

    def loss_of(params: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(functional_call(model, params, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    params = {k: v.detach() for k, v in model.named_parameters()}
    per_sample = vmap(grad(loss_of), in_dims=(None, 0, 0))(params, x, y)
    for k, p in model.named_parameters():
        p.grad = per_sample[k].clamp(-1.0, 1.0).mean(0)
    opt.step()


def _jvp_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    """A loss with a directional-derivative penalty from forward-mode AD, then backward."""
    out, tangent = jvp(model, (x,), (torch.ones_like(x),))
    loss = nn.functional.cross_entropy(out, y) + tangent.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def _train(step: Any, watched: bool, mode: str, path: Path) -> nn.Module:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _batches(4)
    if not watched:
        for x, y in batches:
            step(model, opt, x, y)
        return model
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for x, y in batches:
            step(model, opt, x, y)
    return model


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("kind", ["per_sample", "jvp"])
def test_torch_func_transforms_keep_every_step(
    mode: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step = _per_sample_step if kind == "per_sample" else _jvp_step
    path = tmp_path / "run.tscope"
    model = _train(step, True, mode, path)
    plain = _train(step, False, mode, path)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), plain.parameters(), strict=True))
    events = list(iter_events(path))
    assert not [e for e in events if e["kind"] == "log" and e.get("level") == "error"]
    assert "internal error" not in capsys.readouterr().err
    steps = [e for e in events if e["kind"] == "step"]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    # the gradients the optimizer used, per parameter (set by hand or by backward)
    assert all(s["grads"]["none"] == [] and len(s["grads"]["norm"]) == 4 for s in steps)
    if kind == "jvp":
        # the backward is recorded (its saved bytes, and in full mode its graph every step);
        # the model was called, inside the transform: no "called without model(x)" notice
        assert all(s["micro_batches"] == 1 and s["memory"]["saved"] > 0 for s in steps)
        assert not [e for e in events if e["kind"] == "log" and "without a call" in e.get("message", "")]
        if mode == "full":
            assert [e["step"] for e in events if e["kind"] == "graph"] == [0, 1, 2, 3]


def test_a_functional_loop_that_records_no_step_is_told(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``grad_and_value`` over ``functional_call`` and an update by hand (no optimizer, no
    backward): nothing torchscope sees ends a step, so none is recorded -- said once, on
    stderr and in the session's log, not left to a file of 0 steps; a loop that writes the
    gradients into ``.grad`` and steps an optimizer records each step and is told nothing."""
    from torch.func import grad_and_value

    def run(name: str, with_optimizer: bool) -> tuple[list[dict[str, Any]], str]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1) if with_optimizer else None
        path = tmp_path / f"{name}.tscope"

        def loss_fn(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            return functional_call(model, params, (x,)).pow(2).mean()

        with torchscope.watch(model, opt, server=None, record=path, mode="light"):
            for _ in range(120):
                params = {k: v.detach() for k, v in model.named_parameters()}
                grads, _ = grad_and_value(loss_fn)(params, torch.randn(4, 4))
                if opt is None:
                    with torch.no_grad():
                        for k, p in model.named_parameters():
                            p -= 0.1 * grads[k]
                else:
                    for k, p in model.named_parameters():
                        p.grad = grads[k]
                    opt.step()
        return list(iter_events(path)), capsys.readouterr().err

    events, err = run("by-hand", False)
    told = [e["message"] for e in events if e["kind"] == "log" and "torch.func transforms" in e["message"]]
    assert len(told) == 1 and err.count("ran inside torch.func transforms") == 1
    assert "records no step" in told[0] and not [e for e in events if e["kind"] == "step"]
    events, err = run("optimizer", True)
    assert len([e for e in events if e["kind"] == "step"]) == 120 and "torch.func transforms" not in err
