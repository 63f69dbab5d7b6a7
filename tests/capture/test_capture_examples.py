"""The example scripts and the demo run for real, in subprocesses: one added line each."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, REPO, ServerProc, free_port, http_json, run_script

from torchscope.sessionfile import iter_events


@pytest.mark.parametrize("name", ["mlp", "transformer", "cnn"])
def test_example_records_a_session(name: str, tmp_path: Path) -> None:
    args = ["--steps", "3"]
    if name == "mlp":  # no --record: the default path under ./torchscope-runs
        args += ["--server", "none", "--mode", "full"]
    elif name == "transformer":
        args += ["--server", "none", "--record", str(tmp_path / "transformer.tscope")]
    else:  # a server that is not there: one warning, the file is still complete
        args += ["--server", f"http://127.0.0.1:{free_port()}", "--record", str(tmp_path / "cnn.tscope")]
    res = run_script(EXAMPLES / f"{name}.py", *args, cwd=tmp_path)
    assert "final loss" in res.stdout
    files = list(tmp_path.glob("*.tscope")) + list((tmp_path / "torchscope-runs").glob("mlp-*.tscope"))
    assert len(files) == 1
    path = files[0]
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("torchscope: watching")]
    assert len(lines) == 1 and str(path.relative_to(tmp_path) if name == "mlp" else path) in lines[0], res.stderr[-3000:]
    # the transport's warning (its wording and count are the transport's, tests/files/) names the file
    unreachable = [ln for ln in res.stderr.splitlines() if "not reachable" in ln]
    assert all(str(path) in ln for ln in unreachable)
    assert bool(unreachable) <= (name == "cnn")
    events = list(iter_events(path))
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "session" and kinds[-1] == "end" and kinds.count("step") == 3
    assert kinds.count("graph") == (3 if name == "mlp" else 1)  # full mode: every step; default: step 0
    assert events[-1]["status"] == "finished" and events[-1]["steps"] == 3
    # the script is exactly one watch() line away from plain PyTorch
    src = (EXAMPLES / f"{name}.py").read_text()
    assert src.count("torchscope.") == 1 and src.count("import torchscope") == 1


def test_torchrun_ranks_share_a_session(tmp_path: Path) -> None:
    path = tmp_path / "ddp.tscope"
    env = {"OMP_NUM_THREADS": "1"}
    res = run_script(
        "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(EXAMPLES / "mlp.py"), "--server", "none", "--record", str(path), "--steps", "2",
        env=env, timeout=240,
    )  # fmt: skip
    assert res.returncode == 0
    r0, r1 = list(iter_events(path)), list(iter_events(tmp_path / "ddp.rank1.tscope"))
    assert r0[0]["session_id"] == r1[0]["session_id"]
    assert (r0[0]["rank"], r1[0]["rank"]) == (0, 1) and r0[0]["world_size"] == r1[0]["world_size"] == 2
    assert {e["rank"] for e in r1 if e["kind"] == "step"} == {1}


def test_demo_streams_live_to_a_server(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "data").start()
    try:
        rec = tmp_path / "demo.tscope"
        res = run_script(
            "-m", "torchscope.demo_train", "--server", srv.url, "--steps", "4", "--sleep", "0",
            "--name", "demo", "--record", str(rec), cwd=REPO,
        )  # fmt: skip
        assert "step 3" in res.stdout
        deadline = time.monotonic() + 20
        sessions: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            sessions = http_json(srv.url + "/api/sessions")  # type: ignore[assignment]
            if len(sessions) == 2 and all(s.get("steps") == 4 for s in sessions):
                break
            time.sleep(0.3)
        assert sorted(str(s["name"]) for s in sessions) == ["demo-mlp", "demo-transformer"], json.dumps(sessions)
        assert all(s["steps"] == 4 for s in sessions)
        assert all(s["status"] == "finished" for s in sessions)
    finally:
        srv.stop()
