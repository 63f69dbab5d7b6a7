"""A BatchNorm inside ``torch.utils.checkpoint``: the backward's recompute runs its forward again,
so its running statistics are updated twice a step (plain PyTorch: ``num_batches_tracked``
counts two a step), an effective momentum of 1 - (1 - m)^2.  No rule said so (QA 47d).  The
capture marks the graph's nodes whose saved tensors checkpoint packed (``NodeRecord.checkpointed``,
format 1.12); P11 tells it as an info, for the non-reentrant and the reentrant checkpoint.  Not
for a BatchNorm outside the segment, one in eval mode, one without running statistics, or a
segment without a BatchNorm."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

STEPS = 4


class _Net(nn.Module):
    def __init__(self, bn: str, inside: bool, reentrant: bool, momentum: float) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 3, 1)
        norm: nn.Module = nn.Identity() if bn == "none" else nn.BatchNorm2d(
            8, momentum=momentum, track_running_stats=bn != "untracked")
        self.block = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), norm, nn.ReLU())
        self.inside, self.reentrant = inside, reentrant
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        if self.inside:
            h = checkpoint(self.block, h, use_reentrant=self.reentrant)
        else:  # the convolution checkpointed, the BatchNorm and ReLU after it
            h = self.block[2](self.block[1](checkpoint(self.block[0], h, use_reentrant=self.reentrant)))
        return self.head(h.mean((2, 3)))


def _train(mode: str | None, path: Path, bn: str = "train", inside: bool = True, reentrant: bool = False,
           momentum: float = 0.1) -> tuple[_Net, list[dict]]:
    torch.manual_seed(0)
    model = _Net(bn, inside, reentrant, momentum)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode) if mode else None
    for _ in range(STEPS):
        model.train()
        if bn == "eval":
            model.block[1].eval()
        x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 2, (4,))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    if watch is None:
        return model, []
    watch.close()
    return model, list(iter_events(path))


def _twice(events: list[dict]) -> list[dict]:
    return [f for f in diagnose(events) if f["code"] == "P11" and "twice" in f["title"]]


@pytest.mark.parametrize(("mode", "reentrant"), [("default", False), ("full", False), ("default", True)])
def test_a_batchnorm_in_a_checkpoint_is_said_to_update_twice(tmp_path: Path, mode: str, reentrant: bool) -> None:
    plain, _ = _train(None, tmp_path / "plain.tscope", reentrant=reentrant)
    model, events = _train(mode, tmp_path / "run.tscope", reentrant=reentrant)
    # the premise, in plain PyTorch: two updates a step
    assert int(plain.block[1].num_batches_tracked) == 2 * STEPS
    # and the capture changed no number
    for a, b in zip(plain.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    found = _twice(events)
    assert len(found) == 1 and found[0]["severity"] == "info", [f["message"] for f in diagnose(events)]
    assert found[0]["modules"] == ["block.1"] and "0.19 instead of 0.1" in found[0]["message"]
    assert found[0]["steps"] == list(range(STEPS))


def test_the_graph_marks_the_checkpointed_nodes(tmp_path: Path) -> None:
    _, events = _train("default", tmp_path / "run.tscope")
    graph = next(e for e in events if e["kind"] == "graph")
    marked = {n["module"] for n in graph["nodes"] if n.get("checkpointed")}
    others = {n["module"] for n in graph["nodes"] if not n.get("checkpointed") and n["name"] != "AccumulateGrad"}
    # the segment's three nodes (convolution, batch norm, ReLU) and nothing outside it
    assert marked == {"block.0", "block.1", "block.2"}, graph["nodes"]
    assert not any(m.startswith("block") for m in others)


def test_the_momentum_is_read_from_the_module(tmp_path: Path) -> None:
    _, events = _train("default", tmp_path / "run.tscope", momentum=0.05)
    found = _twice(events)
    assert len(found) == 1 and "0.0975 instead of 0.05" in found[0]["message"]


@pytest.mark.parametrize("case", ["outside", "eval", "untracked", "none"])
def test_no_finding_without_a_second_update(tmp_path: Path, case: str) -> None:
    plain, _ = _train(None, tmp_path / "plain.tscope", bn="train" if case == "outside" else case,
                      inside=case != "outside")
    if case in ("outside", "eval"):  # the premise: one update a step, or none
        assert int(plain.block[1].num_batches_tracked) == (STEPS if case == "outside" else 0)
    _, events = _train("default", tmp_path / "run.tscope", bn="train" if case == "outside" else case,
                       inside=case != "outside")
    assert _twice(events) == []
