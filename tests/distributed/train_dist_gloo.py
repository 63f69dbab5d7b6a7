"""A real torch.distributed run (gloo, CPU) under torchrun: DistributedDataParallel, a
DataLoader with worker processes, and ``torchscope.watch`` on every rank.

usage: python -m torch.distributed.run --standalone --nproc_per_node 2 train_dist_gloo.py RECORD SERVER OUTDIR
Each DataLoader worker writes OUTDIR/worker-<pid>.json: how many TCP connections to the
server's port it ever held, checked from inside the worker at every item it produced.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import torchscope

record, server, outdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
STEPS = 24
port = int(server.rsplit(":", 1)[1])


def _server_sockets() -> int:
    """TCP sockets of this process connected to the server's port (from /proc, no psutil)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            remote_port = int(parts[2].rsplit(":", 1)[1], 16)
            if remote_port == port and parts[9] in inodes:
                count += 1
    return count


class Numbers(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        seen = _server_sockets()
        path = outdir / f"worker-{os.getpid()}.json"
        old = json.loads(path.read_text())["max_sockets"] if path.exists() else 0
        path.write_text(json.dumps({"max_sockets": max(old, seen), "rank": int(os.environ["RANK"])}))
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        return x, x.sum(0, keepdim=True)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = Numbers()
    loader = DataLoader(data, batch_size=16, num_workers=2, sampler=DistributedSampler(data), persistent_workers=True)
    with torchscope.watch(ddp, opt, server=server, record=record, name="dist-test"):
        it = iter(loader)
        for _ in range(STEPS):
            x, y = next(it)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    # every rank's weights agree after the all-reduce: the run really was distributed
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(gathered[0], g) for g in gathered)
    print(f"RANK {rank} DONE", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
