"""A real 2-rank gloo run under torchrun streams to one real server: one session holding
ranks 0 and 1, each rank's file complete, and DataLoader workers never connect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ServerProc, run_two_ranks

from torchscope.session import load
from torchscope.sessionfile import index

SCRIPT = Path(__file__).with_name("train_dist_gloo.py")
STEPS = 24


def test_dist_two_ranks_one_session(tmp_path: Path, server: ServerProc) -> None:
    record = tmp_path / "dist.tscope"
    out = tmp_path / "workers"
    out.mkdir()
    run_two_ranks(SCRIPT, str(record), server.url, str(out))

    files = {0: record, 1: tmp_path / "dist.rank1.tscope"}
    sessions = {r: load(p) for r, p in files.items()}
    for r, s in sessions.items():
        assert s.rank == r and s.world_size == 2
        assert s.status == "finished"
        assert [e["step"] for e in s.steps] == list(range(STEPS))
    sid = sessions[0].session_id
    assert sessions[1].session_id == sid  # one distributed run, one session

    listed = [s for s in server.get("/api/sessions") if isinstance(s, dict)]  # type: ignore[union-attr]
    assert [s["id"] for s in listed] == [sid], listed
    detail = server.get(f"/api/sessions/{sid}")
    assert isinstance(detail, dict)
    assert detail["ranks"] == [0, 1] and detail["status"] == "finished"
    per_rank = {ri["rank"]: ri for ri in detail["rank_info"]}
    for r, path in files.items():
        # the server holds exactly the frames of each rank's file
        assert per_rank[r]["frames"] == len(index(path)[1])
        assert per_rank[r]["steps"] == STEPS
        steps = server.get(f"/api/sessions/{sid}/steps?rank={r}&limit=1000")
        assert isinstance(steps, list) and [s["step"] for s in steps] == list(range(STEPS))
        assert all(s.get("rank", r) == r for s in steps)

    workers = [json.loads(p.read_text()) for p in out.glob("worker-*.json")]
    assert len(workers) == 4, workers  # 2 workers per rank produced items and checked
    assert all(w["max_sockets"] == 0 for w in workers), workers


def test_an_elastic_restart_is_a_session_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun restarts a failed job's workers with the same TORCHELASTIC_RUN_ID: the ranks of
    one attempt share a session, the next attempt is another (its frames would follow the first
    attempt's end, which the server refuses)."""
    from torchscope.distributed import RankInfo, session_id

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    ids = {}
    for restart in ("0", "1", "2"):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", restart)
        ranks = {session_id("train", RankInfo(rank=r, world_size=2, distributed=True)) for r in (0, 1)}
        assert len(ranks) == 1  # every rank of the attempt, one session
        ids[restart] = ranks.pop()
    assert len(set(ids.values())) == 3
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    assert session_id("train", RankInfo(rank=0, world_size=2, distributed=True)) == ids["0"]  # as before


@pytest.mark.parametrize("init", ["env", "tcp"])
def test_ranks_started_by_mp_spawn_are_one_session(tmp_path: Path, init: str) -> None:
    """``torch.multiprocessing.spawn``'s ranks pass their rank to ``init_process_group`` and have
    no ``RANK`` in their environment: each file said rank 0 of 1, with a session of its own, and
    the second rank's went to ``run-2.tscope`` beside the first (QA 49c).  The process group
    tells: rank 1 writes ``run.rank1.tscope``, and both are ranks of one session -- also with a
    ``tcp://`` init_method and no ``MASTER_ADDR``/``MASTER_PORT`` in the environment."""
    import subprocess
    import sys

    from conftest import free_port

    record = tmp_path / "run.tscope"
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    res = subprocess.run([sys.executable, str(SCRIPT.with_name("train_spawn_gloo.py")), str(record), str(free_port()),
                          *(["tcp"] if init == "tcp" else [])], capture_output=True, text=True, timeout=240, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(ln.split()[1] for ln in res.stdout.splitlines() if ln.startswith("RESULT")) == ["0", "1"], (res.stdout, res.stderr)
    sessions = {r: load(p) for r, p in {0: record, 1: tmp_path / "run.rank1.tscope"}.items()}
    for r, s in sessions.items():
        assert (s.rank, s.world_size, s.status) == (r, 2, "finished")
        assert len(s.steps) == 6
    assert sessions[0].session_id == sessions[1].session_id
    assert not (tmp_path / "run-2.tscope").exists()
