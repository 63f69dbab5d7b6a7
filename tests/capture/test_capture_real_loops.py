"""Loops people write, watched in every mode: the training is bit-for-bit the unwatched one, each
optimizer step is one step event with its micro-batches, their losses and the norms of the
gradients optimizer.step() used, every event is valid, and the doctor stays quiet -- except on
the loop that really has a pitfall.

Each loop here is one habit the other tests do not cover: a recurrent network, attention with a
padding mask, activation checkpointing, gradient accumulation under bf16 autocast with
clipping, a one-cycle schedule and a weight average, fused and foreach optimizers, two losses
through one graph, an evaluation pass and a checkpoint save between steps, layers unfrozen into
a new parameter group, sparse embedding gradients under their own optimizer, parametrized
(weight-normed, pruned, spectral-normed) weights, an embedding that renormalizes its weight in
place in the forward, and a causal transformer decoder."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as prune
from torch import nn
from torch.utils.checkpoint import checkpoint

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events
from torchscope.validate import validate_event

STEPS = 8


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        self.rnn = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.emb(x))
        return self.head(out[:, -1])


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        self.mha = nn.MultiheadAttention(16, 4, batch_first=True)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.emb(x)
        out, _ = self.mha(e, e, e, key_padding_mask=x == 0)  # token 0 is padding
        return self.head(out.mean(1))


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.block = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.block, x, use_reentrant=self.reentrant).relu())


class MaxNormBag(nn.Module):
    """An embedding with ``max_norm``: its forward renormalizes rows of the weight in place."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 8, max_norm=1.0)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(x).mean(1))


class CausalDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        layer = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.1, batch_first=True)
        self.dec = nn.TransformerDecoder(layer, 2)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.emb(x)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.dec(e, e, tgt_mask=mask, tgt_is_causal=True)[:, -1])


class SparseBag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 8, sparse=True)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(x).mean(1))


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 5))


def batch(kind: str, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    if kind in ("lstm", "attention", "sparse", "max-norm", "causal-decoder"):
        x = torch.randint(0, 30, (4, 7), generator=g)
        x[:, 0] = 1  # never a fully padded row
        return x, torch.randint(0, 5, (4,), generator=g)
    return torch.randn(6, 8, generator=g), torch.randint(0, 5, (6,), generator=g)


def model_of(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "lstm":
        return Recurrent()
    if kind == "attention":
        return Attention()
    if kind in ("checkpoint", "checkpoint-reentrant"):
        return Checkpointed(reentrant=kind == "checkpoint-reentrant")
    if kind == "sparse":
        return SparseBag()
    if kind == "max-norm":
        return MaxNormBag()
    if kind == "causal-decoder":
        return CausalDecoder()
    m = mlp()
    if kind == "weight-norm":
        nn.utils.parametrizations.weight_norm(m[0])
    if kind == "pruned":
        prune.l1_unstructured(m[0], "weight", amount=0.5)
    if kind == "spectral-norm":  # power iteration on buffers, in place, in each forward
        nn.utils.parametrizations.spectral_norm(m[0])
    if kind == "unfreeze":
        m[3].requires_grad_(False)  # trained from step 4 on, in a group of its own
    return m


def optimizers(kind: str, m: nn.Module) -> list[torch.optim.Optimizer]:
    """The optimizers of a loop; the watch is given the first."""
    if kind == "fused-adamw":
        return [torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)]
    if kind == "sgd-foreach":
        return [torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9, nesterov=True, foreach=True)]
    if kind == "unfreeze":
        return [torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-2)]
    if kind == "sparse":
        assert isinstance(m, SparseBag)
        return [
            torch.optim.Adam(m.head.parameters(), lr=1e-2),
            torch.optim.SparseAdam(m.emb.parameters(), lr=1e-2),
        ]
    return [torch.optim.Adam(m.parameters(), lr=1e-2)]


def step_of(
    kind: str, m: nn.Module, opts: list[torch.optim.Optimizer], i: int, extra: dict[str, Any]
) -> list[float]:
    """One optimizer step of the loop; the losses backward() was called on."""
    loss_fn = nn.functional.cross_entropy
    if kind == "accumulate":
        for o in opts:
            o.zero_grad()
        losses = []
        for k in range(4):
            x, y = batch(kind, 4 * i + k)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn(m(x), y) / 4
            loss.backward()
            losses.append(loss.item())
        nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        extra["norms"].append(grad_norms(m))
        opts[0].step()
        extra["schedule"].step()
        with torch.no_grad():  # an exponential moving average of the weights
            for pa, p in zip(extra["average"].parameters(), m.parameters(), strict=True):
                pa.mul_(0.9).add_(p.detach(), alpha=0.1)
        return losses
    if kind == "eval-between" and i % 3 == 2:
        m.eval()
        with torch.no_grad():
            m(batch(kind, 99)[0])
        with torch.inference_mode():
            m(batch(kind, 98)[0])
        m.train()
        torch.save(m.state_dict(), io.BytesIO())
    if kind == "unfreeze" and i == 4:
        assert isinstance(m, nn.Sequential)
        m[3].requires_grad_(True)
        opts[0].add_param_group({"params": list(m[3].parameters()), "lr": 1e-3})
    x, y = batch(kind, i)
    out = m(x)
    for o in opts:
        o.zero_grad()
    if kind == "two-losses":
        main, penalty = loss_fn(out, y), out.pow(2).mean()
        main.backward(retain_graph=True)
        penalty.backward()
        losses = [main.item(), penalty.item()]
    else:
        loss = loss_fn(out, y)
        loss.backward()
        losses = [loss.item()]
    extra["norms"].append(grad_norms(m))
    for o in opts:
        o.step()
    return losses


def grad_norms(m: nn.Module) -> list[float | None]:
    """Each parameter's gradient norm as optimizer.step() is about to see it (None: no
    gradient), computed here in float64 (a sparse one's of its dense form)."""
    return [None if p.grad is None else float(p.grad.double().to_dense().norm()) for p in m.parameters()]


def run(kind: str, watch: Callable[[nn.Module, torch.optim.Optimizer], Any] | None) -> dict[str, Any]:
    m = model_of(kind)
    opts = optimizers(kind, m)
    extra: dict[str, Any] = {"norms": []}
    if kind == "accumulate":
        extra["schedule"] = torch.optim.lr_scheduler.OneCycleLR(opts[0], max_lr=0.05, total_steps=STEPS + 1)
        extra["average"] = model_of(kind)
    torch.manual_seed(1)
    w = watch(m, opts[0]) if watch is not None else None
    try:
        losses = [step_of(kind, m, opts, i, extra) for i in range(STEPS)]
    finally:
        if w is not None:
            w.close()
    return {
        "losses": losses,
        "norms": extra["norms"],
        "params": [p.detach().clone() for p in m.parameters()],
        "rng": torch.get_rng_state(),
    }


LOOPS = [
    "lstm",
    "attention",
    "checkpoint",
    "accumulate",
    "fused-adamw",
    "sgd-foreach",
    "two-losses",
    "eval-between",
    "unfreeze",
    "sparse",
    "weight-norm",
    "pruned",
    "spectral-norm",
    "max-norm",
    "causal-decoder",
]


def watched(
    kind: str, mode: str, path: Path, given: bool = True
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The loop unwatched, then watched; ``given=False``: ``watch(model)``, which finds the
    optimizer itself."""
    plain = run(kind, None)
    ran = run(
        kind,
        lambda m, o: torchscope.watch(
            m, o if given else None, server=None, record=path, mode=mode, sample_every=3
        ),
    )
    return plain, ran, list(iter_events(path))


def check(mode: str, plain: dict[str, Any], ran: dict[str, Any], events: list[dict[str, Any]]) -> None:
    assert ran["losses"] == plain["losses"]
    for a, b in zip(plain["params"], ran["params"], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(plain["rng"], ran["rng"])
    for e in events:
        validate_event(e)
    steps = [e for e in events if e["kind"] == "step"]
    assert [s["step"] for s in steps] == list(range(STEPS))
    assert [s["micro_batches"] for s in steps] == [len(ls) for ls in plain["losses"]]
    for s, ls, norms in zip(steps, plain["losses"], plain["norms"], strict=True):
        assert s["losses"] == pytest.approx(ls, rel=1e-6)
        assert s["grads"]["none"] == []  # every trainable parameter got its gradient
        # the statistics are of the gradients optimizer.step() used (after clipping, summed
        # over micro-batches), parameter by parameter in the model's order
        # None (a frozen parameter) compared as is: pytest >= 9.1 rejects None inside approx()
        assert s["grads"]["norm"] == [n if n is None else pytest.approx(n, rel=1e-5) for n in norms]
    assert [e["message"] for e in events if e["kind"] == "log" and e["level"] == "error"] == []
    graphs = [e for e in events if e["kind"] == "graph"]
    assert (len(graphs) == STEPS) if mode == "full" else (len(graphs) > 0) == (mode == "default")
    assert [(f["code"], f["message"]) for f in diagnose(events)] == []  # no false alarm


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("kind", LOOPS)
def test_real_loop_is_untouched_recorded_and_clean(kind: str, mode: str, tmp_path: Path) -> None:
    check(mode, *watched(kind, mode, tmp_path / "r.tscope"))


@pytest.mark.parametrize("kind", LOOPS)
def test_real_loop_with_the_optimizer_found(
    kind: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The README's one line, ``watch(model)``: the optimizer that steps the model's parameters
    is followed (with two, the first to step: the dense one beside ``SparseAdam``)."""
    check("default", *watched(kind, "default", tmp_path / "r.tscope", given=False))
    assert "torchscope: following " in capfd.readouterr().err


@pytest.mark.parametrize("mode", ["light", "default"])
def test_reentrant_checkpoint_of_an_input_without_grad_is_p1(mode: str, tmp_path: Path) -> None:
    """The classic trap: ``checkpoint(..., use_reentrant=True)`` of a segment whose input does
    not require grad returns an output without a graph, so the segment's weights never learn
    (torch only warns).  The doctor names those weights; the others are not named."""
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad"):
        plain, ran, events = watched("checkpoint-reentrant", mode, tmp_path / "r.tscope")
    assert ran["losses"] == plain["losses"]
    steps = [e for e in events if e["kind"] == "step"]
    session = next(e for e in events if e["kind"] == "session")
    names = [p["name"] for p in session["params"]]
    none = {names[i] for i in steps[-1]["grads"]["none"]}
    assert none == {"block.0.weight", "block.0.bias", "block.2.weight", "block.2.bias"}
    p1 = [f for f in diagnose(events) if f["code"] == "P1"]
    assert p1, "the doctor did not report the weights that never get a gradient"
    told = " ".join(str(f) for f in p1)
    assert "block.0.weight" in told and "head.weight" not in told
