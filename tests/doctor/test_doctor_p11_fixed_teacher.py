"""A distillation teacher inside the watched model, frozen with ``requires_grad_(False)`` and put
in eval() once -- the epoch's ``model.train()`` puts it back in train mode, its Dropout drops
activations on every step and the soft targets are noisy.  The doctor said only "Batch-norm
statistics updating in frozen layers ... (A momentum copy ... is meant to: nothing to fix
there.)", which is wrong for a teacher (QA 47b).  The capture now says which frozen parameters
changed by steps 10 and 20 (``frozen_moved``): the teacher's never do, a fixed network, and its
dropout in train mode is told with how to keep a teacher in eval -- an info, since a frozen
backbone under fine-tuning looks the same and its dropout can be meant (QA 47d).  A mean teacher
(an EMA of the student, its weights moving), a teacher kept in eval(), and a frozen embedding
table inside a fine-tuned model are not told."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class _KD(nn.Module):
    def __init__(self, keep_eval: bool) -> None:
        super().__init__()
        self.teacher = nn.Sequential(nn.Linear(20, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 5))
        self.student = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 5))
        self.teacher.requires_grad_(False)
        self.teacher.eval()
        self.keep_eval = keep_eval

    def train(self, mode: bool = True) -> _KD:
        super().train(mode)
        if self.keep_eval:
            self.teacher.eval()
        return self

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            target = self.teacher(x)
        return self.student(x), target


class _Embedded(nn.Module):
    """A frozen embedding table with its dropout, inside a model whose other layers train."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Sequential(nn.Linear(20, 8), nn.Dropout(0.1))
        self.emb.requires_grad_(False)
        self.body = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 5))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.body(self.emb(x))
        return out, out.detach()


def _run(path: Path | None, mode: str, kind: str) -> tuple[list[dict], list[float]]:
    torch.manual_seed(0)
    model: nn.Module = _Embedded() if kind == "embedding" else _KD(keep_eval=kind == "kept_eval")
    params = model.body.parameters() if kind == "embedding" else model.student.parameters()
    opt = torch.optim.AdamW(params, lr=1e-3)
    losses = []
    w = torchscope.watch(model, opt, server=None, record=path, mode=mode) if path is not None else None
    for step in range(24):
        if step % 4 == 0:
            model.train()  # each epoch
        x, y = torch.randn(32, 20), torch.randint(0, 5, (32,))
        out, target = model(x)
        loss = F.kl_div(F.log_softmax(out, -1), F.log_softmax(target, -1), reduction="batchmean", log_target=True)
        loss = loss + F.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if kind == "mean_teacher":  # the teacher follows the student's weights: a momentum copy
            with torch.no_grad():
                for t in model.teacher.parameters():  # (.data: no version counter moves)
                    t.data.mul_(0.9).add_(model.student[0].weight.data.mean(), alpha=0.1)
        losses.append(loss.item())
    if w is not None:
        w.close()
    return ([f for f in diagnose(list(iter_events(path))) if f["code"] == "P11"] if path is not None else []), losses


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_fixed_teachers_dropout_in_train_mode_is_told(tmp_path: Path, mode: str) -> None:
    findings, losses = _run(tmp_path / "kd.tscope", mode, "teacher_reset")
    assert losses == _run(None, mode, "teacher_reset")[1]
    (finding,) = findings
    assert finding["severity"] == "info" and finding["title"] == "Dropout on in a frozen network"
    assert finding["modules"] == ["teacher.3"]
    assert "inside 'teacher', whose parameters are frozen and did not change through step 20" in finding["message"]
    assert "'teacher.1' (BatchNorm1d) normalises with each batch's statistics" in finding["message"]
    assert "a distillation teacher's soft targets should not be" in finding["message"]
    assert "self.teacher.eval()" in finding["fix"]


@pytest.mark.parametrize("kind", ["kept_eval", "mean_teacher", "embedding"])
def test_no_finding_for_a_teacher_kept_in_eval_a_momentum_copy_or_a_frozen_embedding(tmp_path: Path, kind: str) -> None:
    findings, _ = _run(tmp_path / f"{kind}.tscope", "default", kind)
    assert not [f for f in findings if f["title"] == "Dropout on in a frozen network"], [f["message"] for f in findings]
    if kind == "mean_teacher":  # its batch-norm moving with the batches: the momentum copy's info, as before
        (finding,) = findings
        assert "A momentum copy of the trained layers" in finding["message"]


def test_a_backbone_unfrozen_after_step_ten_is_no_fixed_network(tmp_path: Path) -> None:
    """A frozen backbone with dropout, unfrozen at step 15 and given to the optimizer: its
    parameters had not moved by step 10, but they train from step 15 -- no fixed network (QA 47d:
    "frozen and never change")."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 32)), nn.Linear(32, 5))
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(model[1].parameters(), lr=0.01)
    path = tmp_path / "unfreeze.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for step in range(24):
            if step == 15:
                model[0].requires_grad_(True)
                opt.add_param_group({"params": model[0].parameters()})
            loss = F.cross_entropy(model(torch.randn(16, 20)), torch.randint(0, 5, (16,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    findings = diagnose(list(iter_events(path)))
    assert not [f for f in findings if f["title"] == "Dropout on in a frozen network"], [f["message"] for f in findings]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_frozen_model_in_eval_mode_whose_input_trains_is_no_training_in_eval(tmp_path: Path, mode: str) -> None:
    """Prompt tuning (or style transfer): the watched model frozen whole and in eval mode, the
    optimizer over a tensor added to its input.  Eval mode is meant there (QA 47d: "Training
    while the model is in eval mode")."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3)).requires_grad_(False).eval()
    prompt = nn.Parameter(torch.zeros(8))
    opt = torch.optim.Adam([prompt], lr=1e-2)
    path = tmp_path / "prompt.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(12):
            loss = F.cross_entropy(model(torch.randn(16, 8) + prompt), torch.randint(0, 3, (16,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    findings = diagnose(list(iter_events(path)))
    assert not [f for f in findings if f["code"] == "P11"], [f["message"] for f in findings]
