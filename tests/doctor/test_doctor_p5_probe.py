"""A linear probe watched by its backbone: ``watch(backbone, head_optimizer)`` with the backbone
run under ``torch.no_grad()`` each step.  The optimizer steps none of the watched model's
parameters, which P5 read as a model the optimizer lost (an error, "another instance of the
model ... created again after the optimizer was"; QA 46a).  Every forward of the model ran
without autograd: it is a feature extractor, and the doctor says to watch what trains (a
warning).  A model the optimizer really lost -- its forwards record a graph -- stays an error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _probe(path: Path, mode: str, frozen: bool) -> list[dict]:
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
    head = nn.Linear(16, 3)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    with torchscope.watch(backbone, opt, server=None, record=path, mode=mode):
        for _ in range(6):
            x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
            if frozen:
                with torch.no_grad():
                    features = backbone(x)
            else:  # the backbone builds a graph and its gradients, which no optimizer applies
                features = backbone(x)
            loss = nn.functional.cross_entropy(head(features), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [f for f in diagnose(list(iter_events(path))) if f["code"] == "P5"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_linear_probe_watched_by_its_backbone_is_a_warning_to_watch_what_trains(tmp_path: Path, mode: str) -> None:
    (finding,) = _probe(tmp_path / "probe.tscope", mode, frozen=True)
    assert finding["severity"] == "warning"
    assert "frozen feature extractor" in finding["message"] and "ran without autograd" in finding["message"]
    assert "torchscope.watch(head, optimizer)" in finding["fix"]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_backbone_with_a_graph_that_no_optimizer_steps_stays_an_error(tmp_path: Path, mode: str) -> None:
    (finding,) = _probe(tmp_path / "lost.tscope", mode, frozen=False)
    assert finding["severity"] == "error"
    assert "steps none of the 4 trainable parameters" in finding["message"]
    assert "feature extractor" not in finding["message"]


@pytest.mark.parametrize("frozen", [False, True], ids=["deepcopy", "requires_grad_false"])
@pytest.mark.parametrize("mode", ["light", "default"])
def test_an_ema_teacher_watched_in_place_of_the_student_stays_an_error(tmp_path: Path, mode: str, frozen: bool) -> None:
    """The teacher, a deepcopy of the student that follows it by EMA, watched with the
    student's optimizer: its forward runs under no_grad, as a probe's backbone does, but its
    weights move every step -- the wrong model watched, not a feature extractor (QA 47c: "The
    watched model only computes features ... a linear probe").  The capture tells its parameters
    moved (``frozen_moved`` at step 10), and P5 keeps the error naming an EMA teacher."""
    import copy

    torch.manual_seed(0)
    student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    teacher = copy.deepcopy(student)
    if frozen:  # no parameter of the watched model requires grad (QA 47c: "no problems found")
        teacher.requires_grad_(False)
    opt = torch.optim.Adam(student.parameters(), lr=1e-2)
    path = tmp_path / "ema.tscope"
    with torchscope.watch(teacher, opt, server=None, record=path, mode=mode):
        for _ in range(12):
            x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
            with torch.no_grad():
                target = teacher(x)
            out = student(x)
            loss = nn.functional.cross_entropy(out, y) + nn.functional.mse_loss(out, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                for t, s in zip(teacher.parameters(), student.parameters(), strict=True):
                    t.mul_(0.9).add_(s, alpha=0.1)
    (finding,) = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P5"]
    assert finding["severity"] == "error" and "an EMA teacher" in finding["message"], finding["message"]


def test_a_backbone_frozen_with_requires_grad_false_watched_beside_its_head_is_the_probe_warning(tmp_path: Path) -> None:
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16)).requires_grad_(False)
    head = nn.Linear(16, 3)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    path = tmp_path / "frozen.tscope"
    with torchscope.watch(backbone, opt, server=None, record=path):
        for _ in range(12):
            loss = nn.functional.cross_entropy(head(backbone(torch.randn(4, 8))), torch.randint(0, 3, (4,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    (finding,) = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P5"]
    assert finding["severity"] == "warning" and finding["title"] == "The watched model only computes features"
