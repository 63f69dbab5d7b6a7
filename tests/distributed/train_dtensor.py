"""A model whose parameters are DTensors -- tensor parallel (weights sharded by rows across
ranks) or FSDP2 (``fully_shard``: every parameter sharded, gathered for each layer's forward
and backward) -- trained plain and then watched in one mode, under torchrun with gloo.
Writes, per rank, JSON with whether the watched run's parameters equal the plain run's bit for
bit and the local shards' gradient norms and bytes the test compares with the recording.

    torchrun --nproc_per_node 2 train_dtensor.py OUT_DIR MODE tp|fsdp2
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from shard_loop import train_steps
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor

STEPS = 6


def model(mesh: object, layout: str) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    if layout == "fsdp2":
        for layer in (m[0], m[2]):
            fully_shard(layer, mesh=mesh)  # type: ignore[arg-type]
        return fully_shard(m, mesh=mesh)  # type: ignore[arg-type, return-value]

    def shard(name: str, mod: nn.Module, mesh: object) -> None:
        for n, p in list(mod.named_parameters(recurse=False)):
            placement = Shard(0) if p.dim() == 2 else Replicate()  # weights split by rows across ranks
            mod.register_parameter(n, nn.Parameter(distribute_tensor(p.detach(), mesh, [placement])))

    return distribute_module(m, mesh, shard)  # type: ignore[arg-type]


def train(mesh: object, record: Path | None, mode: str, layout: str) -> tuple[nn.Module, list[list[float | None]]]:
    m = model(mesh, layout)

    def loss_of(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if layout == "fsdp2":  # each rank its own batch, as data parallel does
            return m(x + dist.get_rank()).pow(2).mean()
        return m(distribute_tensor(x, mesh, [Replicate()])).full_tensor().pow(2).mean()  # type: ignore[arg-type, no-any-return]

    def norm_of(g: torch.Tensor | None) -> float:
        return float(g.to_local().norm())  # type: ignore[union-attr]

    return m, train_steps(m, record, mode, STEPS, loss_of, norm_of)


def main() -> None:
    out, mode, layout = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plain, _ = train(mesh, None, mode, layout)
    watched, norms = train(mesh, out / "dtensor.tscope", mode, layout)
    same = all(
        torch.equal(a.full_tensor(), b.full_tensor())  # type: ignore[operator]
        for a, b in zip(plain.parameters(), watched.parameters(), strict=True)
    )
    params = list(watched.parameters())
    assert all(isinstance(p, DTensor) for p in params)
    local_bytes = sum(p.to_local().untyped_storage().nbytes() for p in params)  # type: ignore[attr-defined]
    (out / f"rank{rank}.json").write_text(json.dumps({"same": same, "norms": norms, "local_bytes": local_bytes}))
    print(f"RANK {rank} DONE", flush=True)
    dist.destroy_process_group()
    # Everything this run reports is written.  Gloo's worker threads can still abort the
    # interpreter's teardown after FSDP2 ("terminate called without an active exception", seen
    # once in CI after both ranks were done; pytorch/pytorch#190489 and #179291 describe it)
    os._exit(0)


if __name__ == "__main__":
    main()
