"""A NaN born in the backward (finite forward, non-finite gradient): the node that made it is
found on the steps checked for NaN, as plain PyTorch's own gradients show, and the doctor says so."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _batch(step: int, constant: set[int]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    if step in constant:  # every row the same: the spread below is a norm of zeros
        return torch.zeros(32, 8), torch.zeros(32, 4)
    return torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g)


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, keep: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    out = model(x)
    sq = (out - out.flip(0)).pow(2).sum(1)
    norms = sq.sqrt()  # sqrt(0): finite, its gradient is not
    if keep is not None:
        for name, t in (("in", sq), ("out", norms)):
            t.retain_grad()
            keep[name] = t
    return nn.functional.mse_loss(out, y) + 0.1 * norms.mean()


def _train(model: nn.Module, steps: int, constant: set[int]) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        x, y = _batch(step, constant)
        opt.zero_grad()
        loss = _loss(model, x, y)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses


def _where_it_turned(model: nn.Module, step: int, constant: set[int]) -> str:
    """Plain PyTorch, no capture: the gradient reaching sqrt's output is finite and the one it
    passes to its input is not -- the node sqrt's output was made by is where it turned."""
    x, y = _batch(step, constant)
    keep: dict[str, torch.Tensor] = {}
    _loss(model, x, y, keep).backward()
    assert keep["out"].grad is not None and keep["in"].grad is not None
    assert torch.isfinite(keep["out"].grad).all() and not torch.isfinite(keep["in"].grad).all()
    return type(keep["out"].grad_fn).__name__


def _run(tmp_path: Path, mode: str, steps: int, constant: set[int]) -> tuple[list[dict[str, Any]], list[float], nn.Module]:
    model = _model()
    path = tmp_path / f"{mode}.tscope"
    with torchscope.watch(model, server=None, record=path, mode=mode):
        losses = _train(model, steps, constant)
    return list(iter_events(path)), losses, model


def _made(events: list[dict[str, Any]]) -> dict[int, list[str]]:
    return {e["step"]: [n["name"] for n in e["nodes"] if n.get("made_nonfinite")]
            for e in events if e["kind"] == "graph"}


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_nan_made_in_the_first_steps_backward_is_traced_to_its_node(tmp_path: Path, mode: str) -> None:
    plain = _model()
    plain_losses = _train(plain, 6, {0})
    events, losses, model = _run(tmp_path, mode, 6, {0})
    # the hooks that check each node change nothing
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(plain_losses), rtol=0, atol=0, equal_nan=True)
    for p, q in zip(plain.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, equal_nan=True)
    assert _made(events)[0] == [_where_it_turned(_model(), 0, {0})] == ["SqrtBackward0"]
    (p4,) = [f for f in diagnose(events) if f["code"] == "P4"]
    assert "first produced in the backward at step 0 by SqrtBackward0, the gradient of aten::sqrt" in p4["message"]
    assert p4["targets"][0]["node"] == next(n["id"] for e in events if e["kind"] == "graph" and e["step"] == 0
                                            for n in e["nodes"] if n.get("made_nonfinite"))
    assert p4["src"] and p4["src"].endswith(f"test_capture_backward_nan.py:{_src_line('sq.sqrt()')}")


def test_an_unchecked_backward_nan_is_said_to_come_from_the_backward(tmp_path: Path) -> None:
    events, losses, _ = _run(tmp_path, "light", 12, {8})
    assert losses[8] == losses[8] and losses[9] != losses[9]  # step 8's loss finite, the update poisons step 9's
    (p4,) = [f for f in diagnose(events) if f["code"] == "P4"]
    assert "Step 8's loss was finite" in p4["message"] and "its backward made the NaN/Inf" in p4["message"]
    assert "sqrt or a norm of exactly zero" in p4["fix"]


def test_no_node_is_flagged_on_a_healthy_run(tmp_path: Path) -> None:
    events, _, _ = _run(tmp_path, "full", 5, set())
    assert len(_made(events)) == 5 and not any(_made(events).values())
    # step 0's nodes were checked (isfinite, all, item per node): none of those ops is the user's
    ops = [[o["name"] for o in e["ops"]] for e in events if e["kind"] == "graph"]
    assert all(names == ops[1] for names in ops) and "aten::isfinite" not in ops[0]
    assert not [f for f in diagnose(events) if f["code"] == "P4"]


def _src_line(text: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_a_gradscaler_skipping_every_step_is_traced_to_the_node_that_overflows(tmp_path: Path) -> None:
    """A norm of a zero row in an AMP loop: the GradScaler skips every step however low its scale
    goes.  A skipped step arms the next step's checks (the loop's zero_grad clears the gradients
    before the watch could read them), so P14 names the node -- and training is unchanged."""

    def train(watched: bool) -> tuple[list[float], nn.Module]:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu")
        scales = []
        with torchscope.watch(model, opt, server=None, record=tmp_path / "amp.tscope") if watched else nullcontext():
            for step in range(12):
                x, y = _batch(step, set())
                opt.zero_grad()
                out = model(x)
                loss = nn.functional.mse_loss(out, y) + 0.1 * (out - out[:1]).pow(2).sum(1).sqrt().mean()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                scales.append(scaler.get_scale())
        return scales, model

    plain_scales, plain = train(False)
    scales, model = train(True)
    assert scales == plain_scales == [65536.0 / 2 ** (i + 1) for i in range(12)]  # every step skipped
    for p, q in zip(plain.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)
    events = list(iter_events(tmp_path / "amp.tscope"))
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 12  # the last one too, skipped and then closed by close()
    for i, ev in enumerate(steps):
        # read at scaler.update(), before the next zero_grad(): the overflow, not "no gradient"
        assert ev["scaler"] == {"skipped": True, "scale": 65536.0 / 2**i}  # the scale the step ran with
        assert ev["grads"]["none"] == [] and sum(ev["grads"]["nan"]) + sum(ev["grads"]["inf"]) > 0
    made = _made(events)
    assert len(made) >= 5 and all(names == ["SqrtBackward0"] for names in made.values())  # every other step checked
    (p14,) = [f for f in diagnose(events) if f["code"] == "P14"]
    assert f"Traced at step {max(made)}: SqrtBackward0, the gradient of aten::sqrt turned finite" in p14["message"]
    assert p14["targets"][0]["node"] >= 0 and p14["view"] == "graph"
