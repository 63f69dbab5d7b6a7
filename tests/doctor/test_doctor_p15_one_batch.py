"""P15's "one batch cut into slices, each slice's mean loss added up" on real captures (QA round
29): micro-batches are one loss of one model output each.  A multi-task sum over the halves of a
mixed batch (cross-entropy of one head + MSE of another) and SimSiam's symmetric loss over two
views stacked in one tensor (each term reads the other view's output, detached) are no
accumulation; the same loss of the same output over the slices, added up undivided, still is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class Heads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
        self.cls = nn.Linear(32, 3)
        self.reg = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, task: str = "a") -> torch.Tensor:
        h = self.trunk(x)
        return self.cls(h) if task == "a" else self.reg(h)


class SimSiam(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16))
        self.predictor = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 16))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.encoder(x)
        return z, self.predictor(z)


def _d(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return -F.cosine_similarity(p, z.detach(), dim=-1).mean()


def _p15(tmp_path: Path, how: str, mode: str) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model: nn.Module = SimSiam() if how == "simsiam" else Heads()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / f"{how}-{mode}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(12):
            batch = torch.randn(32, 10)
            if how == "simsiam":
                views = torch.stack([batch + 0.1 * torch.randn_like(batch), batch + 0.1 * torch.randn_like(batch)])
                (z1, p1), (z2, p2) = model(views[0]), model(views[1])
                loss = _d(p1, z2) + _d(p2, z1)
            elif how == "multitask":
                loss = (F.cross_entropy(model(batch[:16], "a"), torch.randint(0, 3, (16,)))
                        + F.mse_loss(model(batch[16:], "b"), torch.randn(16, 1)))
            else:  # the bug: one batch's slices through the same head, their means added up
                y = torch.randint(0, 3, (32,))
                loss = sum(F.cross_entropy(model(xs), ys) for xs, ys in zip(batch.chunk(4), y.chunk(4), strict=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P15"]


@pytest.mark.parametrize("mode", ["default", "full"])
@pytest.mark.parametrize("how", ["multitask", "simsiam"])
def test_different_losses_or_views_of_one_batch_are_no_accumulation(tmp_path: Path, how: str, mode: str) -> None:
    assert _p15(tmp_path, how, mode) == []


@pytest.mark.parametrize("mode", ["default", "full"])
def test_the_same_loss_over_slices_added_up_is_still_p15(tmp_path: Path, mode: str) -> None:
    (f,) = _p15(tmp_path, "chunks", mode)
    assert f["severity"] == "warning" and "4" in f["message"], f["message"]


class TaskHeads(nn.Module):
    def __init__(self, tasks: int = 3) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
        self.heads = nn.ModuleList(nn.Linear(32, 1) for _ in range(tasks))

    def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:
        return self.heads[k](self.trunk(x))


@pytest.mark.parametrize("mode", ["default", "full"])
@pytest.mark.parametrize("same_head", [False, True], ids=["per_task", "one_head"])
def test_one_backward_per_task_head_is_no_accumulation(tmp_path: Path, mode: str, same_head: bool) -> None:
    """A multi-task loop's backward() per task head, from one line, then one step: a sum of the
    tasks' objectives through heads of their own -- no P15 (QA 48a: "each optimizer step is 3x
    larger than intended").  The same loop through one head is accumulation, and still P15."""
    torch.manual_seed(0)
    model = TaskHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    w = torch.randn(3, 10)
    path = tmp_path / "tasks.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(8):
            for k in range(3):
                x = torch.randn(32, 10)
                F.mse_loss(model(x, 0 if same_head else k), (x @ w[k]).unsqueeze(1)).backward()
            opt.step()
            opt.zero_grad()
    p15 = [f for f in diagnose(iter_events(path)) if f["code"] == "P15"]
    assert len(p15) == (1 if same_head else 0), [f["message"] for f in p15]


def _dcgan_d_steps(tmp_path: Path, mode: str, looped: bool) -> list[dict[str, Any]]:
    """The DCGAN tutorial's discriminator step: ``errD_real.backward()`` on real images, then
    ``errD_fake.backward()`` on the generator's (``looped``: the same two batches through one
    ``backward()`` line in a loop, accumulation as it is written)."""
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(4, 10), nn.Tanh())
    disc = nn.Sequential(nn.Linear(10, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1), nn.Sigmoid())
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.01)
    crit = nn.BCELoss()
    path = tmp_path / f"dcgan-{mode}-{looped}.tscope"
    with torchscope.watch(disc, opt_d, server=None, record=path, mode=mode):
        for _ in range(3):
            disc.zero_grad()
            real, fake = torch.randn(8, 10), gen(torch.randn(8, 4))
            if looped:
                for x, label in ((real, 1.0), (fake.detach(), 0.0)):
                    loss = crit(disc(x).view(-1), torch.full((8,), label))
                    loss.backward()
            else:
                err_real = crit(disc(real).view(-1), torch.full((8,), 1.0))
                err_real.backward()
                err_fake = crit(disc(fake.detach()).view(-1), torch.full((8,), 0.0))
                err_fake.backward()
            opt_d.step()
    return [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P15"]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_dcgan_real_and_fake_backwards_are_one_loss(tmp_path: Path, mode: str) -> None:
    """Each backward() a line of its own is a sum of objectives (D's loss is errD_real +
    errD_fake), as the tutorial means it: no "accumulation without dividing" (QA 49a, in every
    mode); one backward() line in a loop over the batches is still accumulation."""
    assert _dcgan_d_steps(tmp_path, mode, looped=False) == []
    assert [f["severity"] for f in _dcgan_d_steps(tmp_path, mode, looped=True)] == ["warning"]
