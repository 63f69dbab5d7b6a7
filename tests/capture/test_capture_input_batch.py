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


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_batch_sliced_out_of_a_dataset_counts_its_slice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, native: bool) -> None:
    """``X[i:i + 64]`` of a dataset kept in one tensor: the part of the storage it spans, as
    ``saved`` counts it, not the dataset, which the loop holds anyway (QA 43a: an MNIST-sized
    dataset put 180 MiB in every step's peak); a slice and its copy read the same."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    data = torch.randn(4096, 3, 16, 16)  # 12 MiB
    y = torch.randint(0, 4, (64,))
    got = []
    for x in (data[128:192], data[128:192].clone()):
        torch.manual_seed(0)
        model = _Images()
        ev, mem = _step(tmp_path, mode, model, lambda m, x=x: F.cross_entropy(m(x), y))
        assert _baseline(ev) == _bytes(*model.parameters()) + x.numel() * 4
        got.append((_baseline(ev), mem["peak"], mem["temporaries"]))
    assert got[0] == got[1] and got[0][1] < _bytes(data)


def _two_forwards(tmp_path: Path, mode: str, accum: bool) -> tuple[dict[str, Any], dict[str, Any], int]:
    """One step: an evaluation on a batch dying at once, then the training forward on another
    (``accum``: two micro-batches, the second batch made after the first's backward)."""
    torch.manual_seed(0)
    model = nn.Linear(1024, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    path = tmp_path / "two.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        opt.zero_grad()
        if accum:
            for _ in range(2):
                model(torch.randn(256, 1024)).pow(2).mean().backward()
        else:
            with torch.no_grad():
                model(torch.randn(256, 1024))  # an evaluation's batch: 1 MiB, freed with the call
            x = torch.randn(256, 1024)
            model(x).pow(2).mean().backward()
        opt.step()
    run = load(str(path))
    return dict(run.graph(0)), dict(run.steps[0]["memory"]), _bytes(*model.parameters())


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("mode", ["default", "full"])
def test_an_earlier_forwards_batch_is_freed_and_a_later_ones_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, native: bool) -> None:
    """The ledger follows every recorded forward's inputs (QA 43a): the evaluation's batch,
    the first forward's, is freed when it dies -- before, it stayed in the ledger to the
    step's end, a second MiB in the peak no plain step ever held -- and the training batch,
    the second forward's, is live through its forward -- before, counted nowhere."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    batch = 256 * 1024 * 4
    ev, mem, params = _two_forwards(tmp_path, mode, accum=False)
    evaluation, training = [o for o in ev["ops"] if o["name"] == "aten::addmm"]
    assert sum(o["free"] for o in ev["ops"] if evaluation["id"] < o["id"] <= training["id"]) >= batch
    held = training["live"] - training["alloc"]  # the training forward's batch, the evaluation's gone
    assert params + batch <= held < params + batch + 64 * 1024, (held, params)
    assert mem["peak"] < params + 2 * batch, mem  # never both batches at once


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_a_second_micro_batch_is_counted_where_the_first_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    batch = 256 * 1024 * 4
    ev, mem, params = _two_forwards(tmp_path, "full", accum=True)
    first, second = [o for o in ev["ops"] if o["name"] == "aten::addmm"]
    # the first micro-batch's batch is freed after its backward (before, never), the second's
    # counted from its forward on (before, never): each forward holds its own
    assert sum(o["free"] for o in ev["ops"] if first["id"] < o["id"] <= second["id"]) >= batch
    for o in (first, second):
        assert o["live"] - o["alloc"] >= params + batch, (o, params)
    assert mem["peak"] < params + 2 * batch + 64 * 1024, mem


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_a_full_steps_peak_is_what_its_ledger_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """Full mode records optimizer.step() too: the ledger saw the whole step, and its highest
    point is the step's peak -- not ``live + saved``, which adds Adam's first-step state to
    activations the backward freed before it was made (QA 43a: +57% on a transformer)."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
    opt = torch.optim.Adam(model.parameters())
    path = tmp_path / "adam.tscope"
    x = torch.randn(512, 256)
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    run = load(str(path))
    ev, mem = dict(run.graph(0)), run.steps[0]["memory"]
    top = max(o["live"] for o in ev["ops"])
    assert mem["peak"] == top
    assert mem["live"] + mem["saved"] > top  # the estimate the step used to report instead


def test_a_mapping_batch_is_counted(tmp_path: Path) -> None:
    """A ``collections.UserDict`` batch (Hugging Face's ``BatchEncoding`` is one) as a dict."""
    import collections

    torch.manual_seed(0)
    model = _Tokens()
    batch = collections.UserDict(input_ids=torch.randint(0, 50, (32, 24)), attention_mask=torch.ones(32, 24))

    class _Call(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, b: Any) -> torch.Tensor:
            return self.inner(b["input_ids"], b["attention_mask"])

    wrapped = _Call()
    y = torch.randint(0, 4, (32,))
    ev, _ = _step(tmp_path, "default", wrapped, lambda m: F.cross_entropy(m(batch), y))
    assert _baseline(ev) == _bytes(*model.parameters()) + _bytes(*batch.values())
