"""Two gloo ranks started by ``torch.multiprocessing.spawn``, each calling
``init_process_group(rank=r, world_size=2)`` with no ``RANK`` in its environment (as PyTorch's
DDP tutorial does), then ``torchscope.watch`` with one record path.

usage: python train_spawn_gloo.py RECORD PORT [tcp]   (tcp: init_method="tcp://...", no MASTER_* env)
Each rank prints ``RESULT <rank> <loss>``.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torchscope

STEPS = 6


def run(rank: int, record: str, port: str, tcp: bool) -> None:
    if tcp:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    else:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
        dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with torchscope.watch(model, opt, server=None, record=record):
        for i in range(STEPS):
            g = torch.Generator().manual_seed(2 * i + rank)
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(torch.randn(4, 8, generator=g)), torch.randn(4, 1, generator=g))
            loss.backward()
            opt.step()
    os.write(1, f"RESULT {rank} {loss.item()!r}\n".encode())  # one write: the ranks share the pipe
    dist.destroy_process_group()


if __name__ == "__main__":
    assert "RANK" not in os.environ
    mp.spawn(run, args=(sys.argv[1], sys.argv[2], sys.argv[3:] == ["tcp"]), nprocs=2)
