"""A model wrapped in FSDP1 (``FullyShardedDataParallel``: the parameters flattened into one
FlatParameter per wrapped module and sharded across ranks), trained plain and then watched in
one mode, under torchrun with gloo on the CPU.  With ``use_orig_params=True`` the model's
parameters are views into this rank's shard: a parameter wholly on the other rank is empty here
and gets no gradient by design.  Writes, per rank, JSON with whether the watched run's full
parameters equal the plain run's bit for bit, the local gradient norms (None: no gradient) and
the local parameters' element counts.

    torchrun --nproc_per_node 2 train_fsdp1.py OUT_DIR MODE flat|orig
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
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

STEPS = 5


def train(record: Path | None, mode: str, orig: bool) -> tuple[list[torch.Tensor], list[list[float | None]], FSDP]:
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    m = FSDP(inner, use_orig_params=orig, device_id=torch.device("cpu"))

    def loss_of(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x + dist.get_rank()).pow(2).mean()  # type: ignore[no-any-return]  # each rank its own batch

    def norm_of(g: torch.Tensor | None) -> float | None:
        return float(g.norm()) if g is not None else None  # None: this rank's shard of it is empty

    norms = train_steps(m, record, mode, STEPS, loss_of, norm_of)
    with FSDP.summon_full_params(m):
        full = [p.detach().clone() for p in m.parameters()]
    return full, norms, m


def main() -> None:
    out, mode, orig = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "orig"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    plain, _, _ = train(None, mode, orig)
    watched, norms, m = train(out / "fsdp1.tscope", mode, orig)
    same = all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
    numel = [p.numel() for p in m.parameters()]
    (out / f"rank{rank}.json").write_text(json.dumps({"same": same, "norms": norms, "numel": numel}))
    print(f"RANK {rank} DONE", flush=True)
    dist.destroy_process_group()
    os._exit(0)  # everything is written; see train_dtensor.py on gloo's teardown


if __name__ == "__main__":
    main()
