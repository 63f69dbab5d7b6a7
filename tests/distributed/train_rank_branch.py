"""DistributedDataParallel with ``find_unused_parameters=True`` over a model whose forward
branches on the rank (the bug: ``if dist.get_rank() == 0`` meant for logging takes ``proj``
out of rank 1's forward) or, fixed, takes the same path on every rank -- trained plain and
then watched, under torchrun with gloo.  Writes, per rank, whether the watched run's
parameters equal the plain run's bit for bit and whether ``proj`` had a gradient on each step.

    torchrun --nproc_per_node 2 train_rank_branch.py OUT_DIR MODE bug|fixed
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torchscope

STEPS = 6


class Net(nn.Module):
    def __init__(self, rank_branch: bool) -> None:
        super().__init__()
        self.enc, self.proj, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 3)
        self.rank_branch = rank_branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.relu(self.enc(x))
        if not self.rank_branch or dist.get_rank() == 0:
            z = z + torch.relu(self.proj(z))
        return self.head(z)  # type: ignore[no-any-return]


def train(record: Path | None, mode: str, bug: bool) -> tuple[list[torch.Tensor], list[bool]]:
    torch.manual_seed(0)
    model = DistributedDataParallel(Net(bug), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + dist.get_rank())  # each rank its own batches
    w = torchscope.watch(model, opt, server=None, record=record, mode=mode) if record else None
    had_grad = []
    for _ in range(STEPS):
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        had_grad.append(model.module.proj.weight.grad is not None)
        opt.step()
    if w is not None:
        w.close()
    return [p.detach().clone() for p in model.parameters()], had_grad


def main() -> None:
    out, mode, bug = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "bug"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    plain, _ = train(None, mode, bug)
    watched, had_grad = train(out / "branch.tscope", mode, bug)
    same = all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
    (out / f"rank{rank}.json").write_text(json.dumps({"same": same, "proj_grad": had_grad}))
    print(f"RANK {rank} DONE", flush=True)
    dist.destroy_process_group()
    os._exit(0)  # everything is written; see train_dtensor.py on gloo's teardown


if __name__ == "__main__":
    main()
