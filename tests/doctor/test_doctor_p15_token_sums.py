"""P15 on real captures of a fairseq-style update: each micro-batch's loss summed over its
non-pad tokens, the gradients divided by the update's token count after the backward passes
(fairseq's ``multiply_grads``).  Variable-length batches combine their graph structures anew
from step to step: a step never captured whole is judged by its micro-batches' structures,
each of which a capture showed summed and rescaled -- no finding.  The same loop with a
per-micro-batch mean and no division is P15."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

PAD, V = 0, 30


class _LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, 16, padding_idx=PAD)
        self.rnn = nn.GRU(16, 16, batch_first=True)
        self.out = nn.Linear(16, V)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.embed(tokens))[0])


def _sample(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    tokens = torch.randint(1, V, (4, 4 + i % 5), generator=g)
    target = torch.roll(tokens, -1, 1)
    target[:, -1] = PAD
    return tokens, target


def _run(path: Path, how: str) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = _LM()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    k = 0
    with torchscope.watch(model, opt, server=None, record=path, mode="default"):
        for _ in range(24):
            ntokens = 0
            for _ in range(3):  # update_freq
                tokens, target = _sample(k)
                k += 1
                logits = model(tokens).view(-1, V)
                reduction = "sum" if how == "token sums" else "mean"
                F.cross_entropy(logits, target.view(-1), ignore_index=PAD, reduction=reduction).backward()
                ntokens += int(target.ne(PAD).sum())
            if how == "token sums":
                for p in model.parameters():
                    p.grad.mul_(1.0 / ntokens)  # fairseq's optimizer.multiply_grads
            opt.step()
            opt.zero_grad()
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P15"]


@pytest.mark.parametrize("how", ["token sums", "means"])
def test_variable_length_micro_batches_are_judged_by_their_structures(tmp_path: Path, how: str) -> None:
    found = _run(tmp_path / "run.tscope", how)
    signatures = {str(e.get("graph_signature")) for e in iter_events(tmp_path / "run.tscope") if e.get("kind") == "step"}
    assert len(signatures) > 3  # the micro-batches' structures combine anew from step to step
    if how == "token sums":
        assert found == []
    else:
        assert [f["severity"] for f in found] == ["warning"] and "3 micro-batches" in found[0]["message"], found
