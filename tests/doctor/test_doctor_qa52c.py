"""QA 52b F1b: LoRA with gradient checkpointing and a frozen embedding -- the base model frozen,
adapters on the blocks' Linears, each block run under ``torch.utils.checkpoint(block, h,
use_reentrant=True)`` (transformers' default path) with no input that requires grad (no
``enable_input_require_grads()``).  Reentrant checkpointing runs the blocks under no_grad, the
loss has no grad_fn and backward() raises.  The doctor blamed a ``torch.no_grad()`` block the
script does not have; it names the checkpoint call and its fix instead (light, which records no
op, at least lists the checkpoint beside no_grad and gives its fix).  A real no_grad around the
blocks keeps its finding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import forkrun
import pytest

from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

SCRIPT = '''
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
import torchscope

variant, blocks, mode, record = sys.argv[1:5]
torch.manual_seed(0)


class LoRA(nn.Module):
    def __init__(self, base, rank=2):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.A = nn.Parameter(torch.randn(rank, base.in_features) * 0.1)
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + x @ self.A.t() @ self.B.t()  # LORA


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        return x + F.gelu(self.fc(self.ln(x)))


class LM(nn.Module):
    def __init__(self, vocab=20, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d) if blocks == "module" else
                                     nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU()) for _ in range(2)])
        self.out = nn.Linear(d, vocab)

    def checkpointed(self, t):
        h = self.emb(t)
        for b in self.blocks:
            h = checkpoint(b, h, use_reentrant=True)  # CKPT
        return self.out(h)

    def frozen(self, t):
        h = self.emb(t)
        for b in self.blocks:
            with torch.no_grad():  # NO_GRAD
                h = b(h)
        return self.out(h)

    def forward(self, t):
        return self.checkpointed(t) if variant == "checkpoint" else self.frozen(t)


model = LM()
model.requires_grad_(False)
for b in model.blocks:
    if blocks == "module":
        b.fc = LoRA(b.fc)
    else:
        b[1] = LoRA(b[1])
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
torchscope.watch(model, opt, server=None, record=record, mode=mode)
for i in range(2):
    t = torch.randint(0, 20, (4, 9))
    opt.zero_grad()
    loss = F.cross_entropy(model(t[:, :-1]).reshape(-1, 20), t[:, 1:].reshape(-1))
    try:
        loss.backward()
    except RuntimeError as exc:
        assert "does not have a grad_fn" in str(exc), exc
    opt.step()
'''


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(SCRIPT.splitlines(), 1) if f"# {marker}" in text)


def _p1(tmp_path: Path, variant: str, blocks: str, mode: str) -> dict[str, Any]:
    script = tmp_path / "lora.py"
    script.write_text(SCRIPT)
    record = tmp_path / f"{variant}_{blocks}_{mode}.tscope"
    res = forkrun.run([str(script), variant, blocks, mode, str(record)], timeout=240, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    found = [dict(f) for f in diagnose(iter_events(record))]
    (p1,) = [f for f in found if f["code"] == "P1" and f["severity"] == "error"]
    assert p1["title"] == "Loss cut from the autograd graph" and p1["steps"] == [0, 1], p1
    return p1


# "module": the blocks' ops are recorded at lines of Block.forward; "seq": nn.Sequential blocks,
# whose ops are recorded at the checkpoint call itself
@pytest.mark.parametrize("blocks", ["module", "seq"])
@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_lora_under_reentrant_checkpoint_names_the_checkpoint_not_a_no_grad_block(tmp_path: Path, mode: str,
                                                                                  blocks: str) -> None:
    p1 = _p1(tmp_path, "checkpoint", blocks, mode)
    message, fix = str(p1["message"]), str(p1["fix"])
    assert "use_reentrant=False" in fix and "enable_input_require_grads" in fix, p1
    assert "ops run under torch.no_grad()" not in message and "out of the torch.no_grad()" not in fix, p1
    if mode == "light":  # no op recorded: the checkpoint is listed beside the other cuts, no_grad claimed by none
        assert "torch.utils.checkpoint(use_reentrant=True)" in message, p1
        return
    assert p1["src"] == f"lora.py:{_line('CKPT')}", p1
    assert f"the torch.utils.checkpoint call at lora.py:{_line('CKPT')}" in message, p1
    assert "use_reentrant=True" in message and "none did" in message, p1
    assert p1["data"]["cut"] == "checkpoint_segment", p1


@pytest.mark.parametrize("blocks", ["module", "seq"])
@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_real_no_grad_around_the_blocks_keeps_its_finding(tmp_path: Path, mode: str, blocks: str) -> None:
    p1 = _p1(tmp_path, "no_grad", blocks, mode)
    assert p1["data"]["cut"] == "no_grad", p1
    assert "ops run under torch.no_grad()" in p1["message"] and "checkpoint" not in p1["message"], p1
    assert "out of the torch.no_grad()" in p1["fix"] and "use_reentrant" not in p1["fix"], p1
    assert p1["src"] == f"lora.py:{_line('LORA')}", p1
