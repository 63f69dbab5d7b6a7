"""Rank, world size and a session id shared by every rank of a torchrun job (or of ranks that
``torch.multiprocessing.spawn`` started, their process group initialized before ``watch()``).

Ranks never talk to each other for this: each derives the same id from what torchrun puts
in every rank's environment (``TORCHELASTIC_RUN_ID``, else ``MASTER_ADDR:MASTER_PORT``, else
the parent process they share), plus the session name and, without a run id, a coarse start
time (so two jobs reusing one master port on different days do not merge).
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
    """The rank of this process: its initialized process group's, else as torchrun (or a
    compatible launcher) announces it in the environment."""
    try:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        rank, world = 0, 1
    rank, world = _process_group() or (rank, world)
    return RankInfo(rank=rank, world_size=max(world, 1), distributed=world > 1)


def _process_group() -> tuple[int, int] | None:
    """The default process group's rank and size, where one is initialized: the ranks that
    ``torch.multiprocessing.spawn`` starts call ``init_process_group(rank=r, world_size=n)``
    with no ``RANK`` in their environment, and each read as rank 0 of 1 (QA 49c).  Local
    calls, no collective."""
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # (a group being torn down) the environment's word stands
        return None
    return None


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
        # (a group set up by a tcp:// or file:// init_method: the ranks that one parent
        # process started, as torch.multiprocessing.spawn does, share that parent)
        seed = f"master:{addr}:{port}|{name}|{coarse}" if addr or port else f"parent:{os.getppid()}|{name}|{coarse}"
    return hashlib.sha1(seed.encode()).hexdigest()[:16]


def rank_path(base: str, info: RankInfo) -> str:
    """Rank 0 keeps ``base``; rank R writes ``<stem>.rank<R>.tscope`` next to it."""
    if info.rank == 0:
        return base
    stem = base[: -len(".tscope")] if base.endswith(".tscope") else base
    return f"{stem}.rank{info.rank}.tscope"
