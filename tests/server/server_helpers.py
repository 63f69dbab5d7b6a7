"""Builders of real frames and sessions for the server tests (no mocks: the real codec)."""

from __future__ import annotations

import time
import zlib
from pathlib import Path
from typing import Any

from torchscope.sessionfile import _FRAME, FRAME_TAG, encode_frame, file_header


def session_event(session_id: str, rank: int = 0, name: str = "run", n_params: int = 2) -> dict[str, Any]:
    return {"kind": "session", "schema": [1, 0], "session_id": session_id, "name": name, "rank": rank,
            "world_size": 1, "model": "MLP", "started_at": time.time(),
            "params": [{"name": f"fc{i}.weight", "module": f"fc{i}"} for i in range(n_params)]}


def step_event(step: int, rank: int = 0, captured: bool = False) -> dict[str, Any]:
    return {"kind": "step", "step": step, "rank": rank, "t": 1000.0 + step, "duration_us": 1000 + step,
            "loss": 1.0 / (step + 1), "graph_signature": "sig-a", "graph_captured": captured,
            "grads": {"norm": [0.5 + step, None], "nan": [0, 0], "inf": [0, 0], "none": [1]},
            "memory": {"live": 1000 + step, "peak": 2000 + step, "params": 400, "grads": 400}}


def graph_event(step: int, rank: int = 0, n_ops: int = 4) -> dict[str, Any]:
    ops = [{"id": i, "name": "aten::addmm" if i % 2 == 0 else "aten::relu",
            "module": f"encoder.{i % 2}" if i < n_ops - 1 else "head", "phase": "forward",
            "inputs": [i], "outputs": [i + 1]} for i in range(n_ops)]
    nodes = [{"id": i, "name": "AddmmBackward0", "op": i, "module": ops[i]["module"]} for i in range(n_ops)]
    edges = [[i, i + 1, 0] for i in range(n_ops - 1)]
    tensors = [{"id": i, "shape": [2, 2]} for i in range(n_ops + 1)]
    return {"kind": "graph", "step": step, "rank": rank, "micro": 0, "complete": True, "ops": ops,
            "nodes": nodes, "edges": edges, "tensors": tensors, "root": 0}


def run_frames(session_id: str, steps: int, rank: int = 0, graph_steps: tuple[int, ...] = (0,),
               end: bool = True, per_frame: int = 3) -> list[bytes]:
    """A run as the transport frames it: session first, graphs in frames of their own."""
    batches: list[list[dict[str, Any]]] = [[session_event(session_id, rank)]]
    pending: list[dict[str, Any]] = []
    for s in range(steps):
        if s in graph_steps:
            if pending:
                batches.append(pending)
                pending = []
            batches.append([graph_event(s, rank)])
        pending.append(step_event(s, rank, captured=s in graph_steps))
        if len(pending) >= per_frame:
            batches.append(pending)
            pending = []
    if end:
        pending.append({"kind": "end", "t": time.time(), "status": "finished", "steps": steps})
    if pending:
        batches.append(pending)
    return [encode_frame(i, b) for i, b in enumerate(batches)]


def write_file(path: Path, frames: list[bytes]) -> Path:
    path.write_bytes(file_header() + b"".join(frames))
    return path


def frame_of_line(seq: int, line: bytes) -> bytes:
    """A frame of one payload line, whatever it holds, its checksum right: damage no flipped
    byte makes (a bad writer, a crafted file), which readers refuse rather than salvage."""
    payload = zlib.compress(line)
    return _FRAME.pack(FRAME_TAG, len(payload), zlib.crc32(payload), seq, 1, 0, -1, -1) + payload
