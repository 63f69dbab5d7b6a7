"""Rank, world size and a session id shared by every rank of a torchrun job.

Ranks never talk to each other for this: each derives the same id from what torchrun puts
in every rank's environment (``TORCHELASTIC_RUN_ID``, else ``MASTER_ADDR:MASTER_PORT``),
plus the session name and, without a run id, a coarse start time (so two jobs reusing one
master port on different days do not merge).
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from dataclasses import dataclass

_COARSE_S = 3600  # ranks of one job start within minutes of each other


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    distributed: bool


def rank_info() -> RankInfo:
    """The rank of this process as torchrun (or a compatible launcher) announces it."""
    try:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        rank, world = 0, 1
    return RankInfo(rank=rank, world_size=max(world, 1), distributed=world > 1)


def session_id(name: str, info: RankInfo, now: float | None = None) -> str:
    """A 16-hex-digit id; identical on all ranks of one distributed job, random otherwise."""
    if not info.distributed:
        return uuid.uuid4().hex[:16]
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        # torchrun restarts a failed job's workers under the same run id: each attempt is a run
        # of its own (the server refuses frames after a stored run's end)
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        seed = f"run:{run_id}|{name}" if restart == "0" else f"run:{run_id}|{name}|attempt {restart}"
    else:
        addr = os.environ.get("MASTER_ADDR", "")
        port = os.environ.get("MASTER_PORT", "")
        coarse = int((now if now is not None else time.time()) // _COARSE_S)
        seed = f"master:{addr}:{port}|{name}|{coarse}"
    return hashlib.sha1(seed.encode()).hexdigest()[:16]


def rank_path(base: str, info: RankInfo) -> str:
    """Rank 0 keeps ``base``; rank R writes ``<stem>.rank<R>.tscope`` next to it."""
    if info.rank == 0:
        return base
    stem = base[: -len(".tscope")] if base.endswith(".tscope") else base
    return f"{stem}.rank{info.rank}.tscope"
