"""`torchscope info` reads what it prints without decoding graph frames, which are nearly all
of a big file; its output and its errors stay those of the full read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from server_helpers import graph_event, session_event, step_event, write_file

from torchscope.server.fileinfo import summarize
from torchscope.sessionfile import FRAME_HEADER_SIZE, encode_frame, iter_events


def big_graph_file(path: Path, graphs: int = 30, n_ops: int = 3000) -> tuple[Path, list[bytes]]:
    session = session_event("info-big")
    frames = [encode_frame(0, [session])]
    for s in range(graphs):
        frames.append(encode_frame(len(frames), [graph_event(s, n_ops=n_ops)]))
        frames.append(encode_frame(len(frames), [step_event(s, captured=True)]))
    frames.append(encode_frame(len(frames), [{"kind": "end", "t": session["started_at"] + 12.5, "status": "finished", "steps": graphs}]))
    return write_file(path, frames), frames


def test_info_counts_graph_frames_as_the_full_read_does(tmp_path: Path) -> None:
    """What the summary reads without decoding graph frames equals what the full read
    (every graph's JSON decoded) says; the time it saves is in the note of the change, not
    asserted here (a timed test on a shared machine is noise)."""
    path, _ = big_graph_file(tmp_path / "big.tscope")
    events = list(iter_events(path))
    info = summarize(path)
    assert info["graphs captured"] == sum(e["kind"] == "graph" for e in events) == 30
    assert info["steps"] == 30 and info["status"] == "finished" and info["name"] == "run"
    assert info["duration"] == "12.5 s"


def test_info_notices_a_damaged_graph_frame_it_does_not_decode(tmp_path: Path) -> None:
    """A graph frame is only checksummed, not decoded: its damage still ends what info reads
    there, and info says so (it used to refuse the whole file)."""
    path, frames = big_graph_file(tmp_path / "bad.tscope", graphs=3, n_ops=50)
    data = bytearray(path.read_bytes())
    offset = 16 + len(frames[0]) + len(frames[1]) + len(frames[2])  # the second graph's frame
    data[offset + FRAME_HEADER_SIZE + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    res = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "info", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    fields = {k: v.strip() for k, v in (line.split(":", 1) for line in res.stdout.splitlines())}
    assert fields["graphs captured"] == "1" and fields["steps"] == "1" and fields["status"] == "ended unexpectedly"
    assert fields["note"] == (f"{path} is damaged at byte {offset:,} (frame checksum mismatch): the "
                              f"{len(data) - offset:,} bytes from there to its end were dropped; the 3 frames "
                              "before it are read")


def test_info_says_a_short_runs_duration_in_ms_and_why_it_has_none(tmp_path: Path) -> None:
    """QA 42b: an 8-step run read "duration: 0.0 s", and a file cut before its first step "?"."""
    session = session_event("short")
    frames = [encode_frame(0, [session]), encode_frame(1, [step_event(0)]),
              encode_frame(2, [{"kind": "end", "t": session["started_at"] + 0.042, "status": "finished", "steps": 1}])]
    assert summarize(write_file(tmp_path / "short.tscope", frames))["duration"] == "42 ms"
    cut = write_file(tmp_path / "cut.tscope", frames[:1])
    assert summarize(cut)["duration"] == "unknown (no step and no end in the file)"



def test_info_says_the_capture_mode(tmp_path: Path) -> None:
    """`torchscope info` did not say how the run was watched (QA 45c): a light run's file has
    no graph, and that is why."""
    import torch

    import torchscope

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "light.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
    info = summarize(path)
    assert info["mode"] == "light" and info["graphs captured"] == 0 and list(info).index("mode") == 2, info


def test_info_says_a_graph_was_cut_at_max_ops(tmp_path: Path) -> None:
    """A step that ran more ops than ``max_ops`` keeps a graph of its first ``max_ops``: the
    summary says so beside the graph count, with the ops the step ran (QA 46c: "graphs
    captured: 3", read as three whole graphs), and says nothing of the kind when none was cut."""
    import torch
    from torch import nn

    import torchscope

    def run(path: Path, max_ops: int) -> int:
        model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(10)])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torchscope.watch(model, opt, server=None, record=path, mode="full", max_ops=max_ops):
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(2, 8)).sum().backward()
                opt.step()
        graphs = [e for e in iter_events(path) if e["kind"] == "graph"]
        assert len(graphs) == 3
        return max(len(g["ops"]) + g["shed_ops"] for g in graphs)

    ran = run(tmp_path / "cut.tscope", 20)
    assert ran > 20
    assert summarize(tmp_path / "cut.tscope")["graphs captured"] == (
        f"3 (cut at max_ops: step 0 ran {ran} ops, its graph holds its first 20, as does every step that ran more)")
    assert run(tmp_path / "whole.tscope", 50_000) < 50_000
    assert summarize(tmp_path / "whole.tscope")["graphs captured"] == 3
