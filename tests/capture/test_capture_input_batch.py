"""The input batch in a captured step's op ledger: made before recording began (by the data
loader), it is no op's allocation, yet it is alive through the step and often saved for
backward by the first layer -- counted in the step's baseline beside the parameters, gradients
and optimizer state.  Left out, a batch of images larger than the model put the in-step
timeline's peak far below the per-step peak (the saved activations counted it) and the step's
``temporaries`` at zero (forty-second session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import torchscope
from torchscope.session import load


class _Images(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3 * 16 * 16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x.flatten(1))))  # (flatten: a view of the batch's storage)


class _Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(50, 16), nn.Linear(16, 4)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.emb(input_ids) * attention_mask.unsqueeze(-1)
        return self.head(h.mean(1))


def _bytes(*tensors: torch.Tensor) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def _step(tmp_path: Path, mode: str, model: nn.Module, call: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    path = tmp_path / "batch.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        opt.zero_grad()
        loss = call(model)
        loss.backward()
        opt.step()
    run = load(str(path))
    return dict(run.graph(0)), dict(run.steps[0]["memory"])


def _baseline(ev: dict[str, Any]) -> int:
    ops = {o["id"]: o for o in ev["ops"]}
    first = ops[min(ops)]
    return int(first["live"] - first["alloc"] + first["free"])


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_batch_of_images_is_in_the_steps_baseline_and_not_a_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, native: bool) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    torch.manual_seed(0)
    model = _Images()
    x, y = torch.randn(64, 3, 16, 16), torch.randint(0, 4, (64,))
    params = _bytes(*model.parameters())
    assert _bytes(x) > params  # (the batch outweighs the model: left out, the peak is far off)
    ev, mem = _step(tmp_path, mode, model, lambda m: F.cross_entropy(m(x), y))
    # fresh gradients (none before the step), SGD without momentum (no state): the parameters
    # and the batch the forward was called with -- not the targets, which only the loss reads
    assert _baseline(ev) == params + _bytes(x), (_baseline(ev), params, _bytes(x))
    # fc1 saved the batch (through its flattened view): in ``saved``, so not a temporary too
    top = max(o["live"] for o in ev["ops"])
    assert mem["saved"] >= _bytes(x)
    assert mem["temporaries"] == max(top - params - mem["saved"], 0) > 0, (mem, top, params)
    assert mem["peak"] >= top


@pytest.mark.parametrize("mode", ["default", "full"])
def test_keyword_inputs_and_integer_token_ids_are_counted_once(tmp_path: Path, mode: str) -> None:
    """``model(**batch)`` with int64 ids and a float mask: both in the baseline, each once."""
    torch.manual_seed(0)
    model = _Tokens()
    batch = {"input_ids": torch.randint(0, 50, (32, 24)), "attention_mask": torch.ones(32, 24)}
    y = torch.randint(0, 4, (32,))
    ev, _ = _step(tmp_path, mode, model, lambda m: F.cross_entropy(m(**batch), y))
    assert _baseline(ev) == _bytes(*model.parameters()) + _bytes(*batch.values())
