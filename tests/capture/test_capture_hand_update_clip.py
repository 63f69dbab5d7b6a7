"""A hand-written update after ``clip_grad_norm_`` (PyTorch's word_language_model example:
``watch(model)`` with no optimizer, ``model.zero_grad()`` before the forward, the clip, then
``p.data.add_(p.grad, alpha=-lr)``).  QA 43b: the step's gradient statistics were read as the
backward returned, before the clip scaled them (2.57x the ``.grad`` the update used), the step
had no ``clip``, its ``memory.grads`` read 0 (the step ends at the next forward, after the
loop's ``zero_grad()``), and an evaluation after the last update made one step more."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


def _train(path: Path | None, mode: str, update: str) -> tuple[list[float], list[list[float]], list[float], list[int]]:
    """Losses, each update's .grad norms and clip totals, and the gradients' bytes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(30, 16), nn.Flatten(), nn.Linear(16 * 5, 30))
    w = torchscope.watch(model, server=None, record=path, mode=mode) if path else None
    losses, norms, totals, grad_bytes = [], [], [], []
    for _ in range(5):
        x, y = torch.randint(0, 30, (8, 5)), torch.randint(0, 30, (8,))
        model.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        norms.append([p.grad.norm().item() for p in model.parameters()])
        totals.append(total.item())
        grad_bytes.append(sum(p.grad.untyped_storage().nbytes() for p in model.parameters()))
        if update == "data":
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.5)
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.5 * p.grad
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():  # an evaluation after the last update: no step of its own
        model(torch.randint(0, 30, (8, 5)))
    if w is not None:
        w.close()
    return losses, norms, totals, grad_bytes


@pytest.mark.parametrize("update", ["data", "inplace"])
@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_hand_update_after_clipping_records_the_clipped_gradients(tmp_path: Path, mode: str, update: str) -> None:
    path = tmp_path / "run.tscope"
    losses, norms, totals, grad_bytes = _train(path, mode, update)
    assert [v.hex() for v in losses] == [v.hex() for v in _train(None, mode, update)[0]]
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert len(steps) == len(losses) == 5
    assert all(t > 0.05 * 1.5 for t in totals)  # every step clipped: the two readings differ
    for e, want, total, nbytes in zip(steps, norms, totals, grad_bytes, strict=True):
        assert e["grads"]["norm"] == pytest.approx(want, rel=1e-5), e["step"]
        assert e["grads"]["clip"]["norm"] == pytest.approx(total, rel=1e-6)
        assert e["grads"]["clip"]["max_norm"] == 0.05
        assert e["memory"]["grads"] == nbytes
