"""``torchscope.load()``: the read-only session object, and random access that reads only
what it needs (measured with the kernel's own count of bytes read, /proc/self/io)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from torchscope.session import Session, load
from torchscope.sessionfile import FLAG_GRAPH, FRAME_HEADER_SIZE, HEADER_SIZE, SessionFileWriter, index

N_STEPS = 12_000
PER_FRAME = 25  # about what a 0.25 s flush holds at 100 steps/s
GRAPH_EVERY = 500
OPS = 2_000
PARAMS = [{"name": f"layer{i}.weight", "module": f"layer{i}"} for i in range(4)]


def _step(s: int) -> dict[str, Any]:
    return {"kind": "step", "step": s, "t": 1000.0 + s, "loss": 1.0 / (s + 1), "graph_captured": s % GRAPH_EVERY == 0,
            "grads": {"norm": [float(s % 7), 1.0, None, 2.0], "nan": [0, 0, 0, s % 2], "none": [2]},
            "memory": {"live": 1000 + s, "peak": 2000 + s, "params": 400, "device": {"allocated": 5, "reserved": 8}}}


def _graph(s: int, micro: int = 0) -> dict[str, Any]:
    return {"kind": "graph", "step": s, "micro": micro,
            "ops": [{"id": i, "name": "aten::addmm", "module": f"layer{i % 4}", "inputs": [i], "outputs": [i + 1],
                     "dur_us": 1.5} for i in range(OPS)],
            "nodes": [{"id": i, "name": "AddmmBackward0"} for i in range(OPS // 2)]}


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.tscope"
    w = SessionFileWriter(path)
    w.append([{"kind": "session", "session_id": "big-sid", "name": "big", "rank": 0, "world_size": 1,
               "params": PARAMS}])
    for lo in range(0, N_STEPS, PER_FRAME):
        w.append([_step(s) for s in range(lo, lo + PER_FRAME)])
        for s in range(lo, lo + PER_FRAME):
            if s % GRAPH_EVERY == 0:
                w.append([_graph(s, 0)])
                w.append([_graph(s, 1)])
    w.append([{"kind": "log", "t": 1.0, "level": "info", "message": "bye"},
              {"kind": "end", "t": 2.0, "status": "finished", "steps": N_STEPS}])
    w.close(fsync=False)
    return path


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def _bytes_read(fn: Any) -> tuple[Any, int]:
    before = _rchar()
    out = fn()
    return out, _rchar() - before


def test_files_load_api(big: Path) -> None:
    s = load(big)
    assert isinstance(s, Session)
    assert (s.session_id, s.name, s.rank, s.world_size, s.status) == ("big-sid", "big", 0, 1, "finished")
    assert s.meta["kind"] == "session" and s.meta["params"] == PARAMS
    assert len(s.steps) == len(s) == N_STEPS
    assert [e["step"] for e in s.steps[:3]] == [0, 1, 2]
    assert s.step(7_345) == _step(7_345)
    assert s.graph_steps == list(range(0, N_STEPS, GRAPH_EVERY))
    assert s.graph(1500)["micro"] == 0 and s.graph(1500, micro=1)["micro"] == 1
    assert len(s.graph(1500)["ops"]) == OPS
    with pytest.raises(KeyError, match="captured steps: 0, 500, 1000"):
        s.graph(7)
    with pytest.raises(KeyError):
        s.graph(500, micro=3)
    with pytest.raises(KeyError):
        s.step(N_STEPS + 1)
    assert [e["message"] for e in s.logs] == ["bye"]
    assert s.end is not None and s.end["steps"] == N_STEPS
    kinds: dict[str, int] = {}
    for ev in s.events():
        kinds[ev["kind"]] = kinds.get(ev["kind"], 0) + 1
    assert kinds == {"session": 1, "step": N_STEPS, "graph": 2 * N_STEPS // GRAPH_EVERY, "log": 1, "end": 1}
    assert repr(s) == (f"<torchscope.Session 'big' id=big-sid: {N_STEPS} steps, "
                       f"{N_STEPS // GRAPH_EVERY} captured graphs, finished>")


def test_files_load_series(big: Path) -> None:
    s = load(big)
    mem = s.memory()
    assert mem["step"][:3] == [0, 1, 2] and len(mem["live"]) == N_STEPS
    assert mem["live"][100] == 1100 and mem["peak"][100] == 2100 and mem["params"][100] == 400
    assert mem["allocated"][5] == 5 and mem["reserved"][5] == 8 and mem["grads"][5] is None
    g = s.grads()
    assert g["params"] == [p["name"] for p in PARAMS] and g["modules"] == [p["module"] for p in PARAMS]
    assert g["norm"][3] == [3.0, 1.0, None, 2.0] and g["nan"][3] == [0, 0, 0, 1] and g["none"][3] == [2]
    assert g["total_norm"][3] == pytest.approx(math.sqrt(9 + 1 + 4))


def test_files_graph_random_access_reads_one_frame(big: Path) -> None:
    size = big.stat().st_size
    _, frames = index(big)
    target = next(f for f in frames if f.flags & FLAG_GRAPH and f.step_lo == 9_000)
    graph_frames = [f for f in frames if f.flags & FLAG_GRAPH and f.step_lo == 9_000]
    header_bytes = HEADER_SIZE + FRAME_HEADER_SIZE * (len(frames) + 1)
    first_frame = FRAME_HEADER_SIZE + frames[0].length

    def open_and_read() -> dict[str, Any]:
        return load(big).graph(9_000, micro=1)  # type: ignore[return-value]

    g, n = _bytes_read(open_and_read)
    assert g["step"] == 9_000 and g["micro"] == 1
    budget = header_bytes + first_frame + sum(FRAME_HEADER_SIZE + f.length for f in graph_frames)
    print(f"graph(9000): read {n:,} of {size:,} bytes ({len(frames):,} frames); budget {budget:,}")
    assert n <= budget + 4096, (n, budget)
    assert n < size / 20
    assert target.length > 0


def test_files_step_and_memory_skip_graph_frames(big: Path) -> None:
    size = big.stat().st_size
    s = load(big)
    step, n_step = _bytes_read(lambda: s.step(11_999))
    assert step["step"] == 11_999 and n_step < 64 * 1024
    mem, n_mem = _bytes_read(s.memory)
    _, frames = index(big)
    graph_bytes = sum(FRAME_HEADER_SIZE + f.length for f in frames if f.flags & FLAG_GRAPH)
    print(f"step(11999): {n_step:,} bytes; memory(): {n_mem:,} of {size:,} bytes")
    assert len(mem["step"]) == N_STEPS
    assert n_mem <= size - graph_bytes + 4096  # not one graph payload was read


def test_files_load_diagnostics_of_a_real_run(tmp_path: Path) -> None:
    """A real pitfall script recorded to a file: load().diagnostics() runs the doctor on it."""
    from conftest import EXAMPLES, run_script

    from torchscope.doctor import diagnose

    record = tmp_path / "p5.tscope"
    run_script(EXAMPLES / "pitfalls" / "p05_missing_zero_grad.py", "--record", str(record),
               cwd=EXAMPLES / "pitfalls")
    s = load(record)
    findings = s.diagnostics()
    assert findings == diagnose(list(s.events()))
    assert "P5" in {f["code"] for f in findings}
    assert s.status == "finished" and len(s.steps) == 8


def test_files_status_running_only_while_the_writer_lives(tmp_path: Path) -> None:
    import os
    import socket
    import time

    from torchscope.transport import Transport

    meta = {"kind": "session", "session_id": "live", "name": "live", "host": socket.gethostname(),
            "started_at": time.time()}
    alive = tmp_path / "alive.tscope"
    tr = Transport(str(alive), "live")
    tr.emit({**meta, "pid": os.getpid()})
    tr.emit({"kind": "step", "step": 0})
    assert tr.flush()
    assert load(alive).status == "running"  # this very process writes it
    tr.close({"kind": "end", "t": time.time(), "status": "finished", "steps": 1})
    assert load(alive).status == "finished"

    # a pid that exists but started long after the session did (pid reuse) is not the writer
    reused = tmp_path / "reused.tscope"
    w = SessionFileWriter(reused)
    w.append([{**meta, "pid": os.getpid(), "started_at": time.time() - 86_400 * 365}])
    w.close()
    assert load(reused).status == "ended unexpectedly"
