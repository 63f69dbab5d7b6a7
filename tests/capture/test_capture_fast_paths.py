"""PyTorch's fused fast paths are taken as unwatched: an eval-mode ``nn.TransformerEncoderLayer``
or ``nn.MultiheadAttention`` under ``no_grad`` skips its fused kernel while any torch-function
mode is on the stack, and the regular path rounds differently.  A frozen transformer teacher
run where the capture's mode is on (after the student's forward; before it on the steps that
count copies) would hand the student other targets; the watched transformer's own evaluation
runs under the eval-dropout probe on its first call."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.overrides import TorchFunctionMode

import torchscope


class _Student(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(32, 2, 64, batch_first=True, dropout=0.1)
        self.head = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(x))


def _distill(path: Path | None, mode: str) -> list[torch.Tensor]:
    """12 steps of a student fitted to a frozen teacher's outputs, the teacher run before and
    after the student's forward, and the student evaluated after each step: the student's
    final parameters, the teacher's outputs and the evaluations."""
    torch.manual_seed(0)
    teacher = nn.TransformerEncoderLayer(32, 2, 64, batch_first=True).eval()
    attn = nn.MultiheadAttention(32, 2, batch_first=True).eval()
    student = _Student()
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    watch = torchscope.watch(student, opt, server=None, record=path, mode=mode) if path else None
    seen: list[torch.Tensor] = []
    for _ in range(12):
        x = torch.randn(4, 8, 32)
        with torch.no_grad():
            before = teacher(x)
        student.train()
        out = student(x)
        with torch.no_grad():
            after = teacher(x) + attn(x, x, x, need_weights=False)[0]
        loss = ((out - before) ** 2).mean() + ((out - after) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        student.eval()
        with torch.no_grad():
            seen += [before, after, student(x)]
    if watch is not None:
        watch.close()
    return [p.detach().clone() for p in student.parameters()] + seen


class _PassThrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def test_the_teachers_fast_path_rounds_otherwise_than_its_regular_path() -> None:
    """What the test below guards against, in plain PyTorch: under any torch-function mode the
    layer takes its regular path, and the result is not bit-identical."""
    torch.manual_seed(0)
    teacher = nn.TransformerEncoderLayer(32, 2, 64, batch_first=True).eval()
    x = torch.randn(4, 8, 32)
    with torch.no_grad():
        fast = teacher(x)
        with _PassThrough():
            regular = teacher(x)
    assert torch.allclose(fast, regular, atol=1e-5) and not torch.equal(fast, regular)


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_frozen_transformer_teacher_and_the_students_evaluations_are_unchanged(tmp_path: Path, mode: str) -> None:
    plain = _distill(None, mode)
    watched = _distill(tmp_path / "run.tscope", mode)
    assert [i for i, (a, b) in enumerate(zip(plain, watched, strict=True)) if not torch.equal(a, b)] == []
    # the global hooks that lift the watch's modes are gone with it
    assert not module_hooks._global_forward_pre_hooks and not module_hooks._global_forward_hooks
