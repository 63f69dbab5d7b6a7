"""A watched run in a real Jupyter kernel (ipykernel, driven cell by cell with jupyter_client),
the way most people debug: the run is named after the notebook, call sites read as IPython's
own tracebacks do ("Cell In[3]", not the kernel's ``/tmp/ipykernel_<pid>/<hash>.py``), and a
cell stopped mid-forward (the Stop button: a KeyboardInterrupt) leaves the later cells'
steps recorded and judged.
"""

from __future__ import annotations

import os
import queue
import re
from pathlib import Path
from typing import Any

import jupyter_client
import pytest
from conftest import wait_for

from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

SETUP = """
import torch, torchscope
from torch import nn
torch.manual_seed(0)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 2)
        self.stop = False
    def forward(self, x):
        h = torch.relu(self.a(x))
        if self.stop:
            self.stop = False
            raise KeyboardInterrupt  # what the Stop button raises in a cell's forward
        return self.b(h)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
w = torchscope.watch(model, opt, server=None, record=RECORD)
"""
TRAIN = """def train(n):
    for _ in range(n):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()  # zero_grad() forgotten: P5 points here
        opt.step()
"""
STOPPED = "model.stop = True\ntrain(3)"


class Kernel:
    """One ipykernel, its cells run one by one; what each printed and raised."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        # a restart or shutdown waits this long for the kernel to close before it sends SIGTERM:
        # Jupyter's 5 s are too few on a loaded two-core machine (the run then read "stopped by
        # SIGTERM", which is right for a kill, not for the restart being tested)
        self.km = jupyter_client.KernelManager(kernel_name="python3", shutdown_wait_time=60.0)
        self.km.start_kernel(cwd=str(cwd), env={**os.environ, **env})
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code: str) -> list[tuple[str, str]]:
        msg_id = self.kc.execute(code)
        out: list[tuple[str, str]] = []
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=120)
            except queue.Empty as exc:
                raise TimeoutError(code) from exc
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append((content["name"], content["text"]))
            elif kind == "error":
                out.append(("error", content["ename"]))
            elif kind == "status" and content["execution_state"] == "idle":
                return out

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture
def kernel(tmp_path: Path) -> Any:
    k = Kernel(tmp_path, {"JPY_SESSION_NAME": str(tmp_path / "debug my model.ipynb"), "OMP_NUM_THREADS": "1"})
    yield k
    k.close()


def test_a_run_in_a_notebook(kernel: Kernel, tmp_path: Path) -> None:
    record = tmp_path / "nb.tscope"
    assert not [o for o in kernel.run(f"RECORD = {str(record)!r}\n" + SETUP) if o[0] == "error"]  # In[1]
    kernel.run(TRAIN)  # In[2]
    assert kernel.run("train(4)") == []  # In[3]
    assert ("error", "KeyboardInterrupt") in kernel.run(STOPPED)  # In[4]
    kernel.run("train(4)\nw.close()")  # In[5]
    # a watch per cell: IPython swaps sys.excepthook around each cell, threading's hook stays,
    # and is wrapped once, not once more per watch() (a chain a thread's error would recurse down)
    kernel.run("import threading\nfirst = threading.excepthook")
    for i in range(3):
        kernel.run(f"torchscope.watch(nn.Linear(2, 2), server=None, record={str(tmp_path / f'{i}.tscope')!r}).close()")
    assert kernel.run("print(threading.excepthook is first)") == [("stdout", "True\n")]
    events = list(iter_events(record))
    session = events[0]
    assert session["name"] == "debug my model"  # the notebook's, not "net"
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 4 + 4  # the stopped cell's step had no optimizer.step()
    # every step after the Stop has its forward, with the cell it came from
    assert all(st.get("forwards") for st in steps)
    srcs = {f["src"] for st in steps for f in st["forwards"]}
    assert srcs == {"Cell In[2]:3"}  # loss = ...(model(x), y) in train(), defined in cell 2
    p5 = [f for f in diagnose(events) if f["code"] == "P5"]
    assert p5 and p5[0].get("src") == "Cell In[2]:4"
    assert not any(re.search(r"ipykernel_\d+|\d{6,}\.py", str(f.get("src", "")) + f["message"]) for f in p5)


def _end(record: Path) -> dict[str, Any]:
    return next(e for e in iter_events(record) if e["kind"] == "end")


def test_a_kernel_restarted_while_a_cell_trains_ends_the_run_interrupted(tmp_path: Path) -> None:
    """Restart (or shut down) a kernel whose cell is training: ipykernel interrupts the cell,
    IPython shows the KeyboardInterrupt (no sys.excepthook: it keeps it in sys.last_value), and
    atexit closes the watch -- the run stopped, it did not finish."""
    k = Kernel(tmp_path, {"OMP_NUM_THREADS": "1"})
    record = tmp_path / "restarted.tscope"
    try:
        k.run(f"RECORD = {str(record)!r}\n" + SETUP)
        k.run(TRAIN)
        k.kc.execute("train(10**7)")
        assert wait_for(lambda: len([e for e in iter_events(record) if e["kind"] == "step"]) > 3, timeout=60)
        k.km.restart_kernel(now=False)
        assert wait_for(lambda: any(e["kind"] == "end" for e in iter_events(record)), timeout=60)
    finally:
        k.close()
    end = _end(record)
    assert end["status"] == "interrupted", end
    assert "restarted" in end["message"]


def test_a_kernel_shut_down_after_a_stopped_cell_and_more_training_finished(tmp_path: Path) -> None:
    """The Stop button in one cell, training on in the next, then the kernel shut down: the
    interrupt shown before the last steps is not how the run ended."""
    k = Kernel(tmp_path, {"OMP_NUM_THREADS": "1"})
    record = tmp_path / "shut.tscope"
    try:
        k.run(f"RECORD = {str(record)!r}\n" + SETUP)
        k.run(TRAIN)
        assert ("error", "KeyboardInterrupt") in k.run(STOPPED)
        k.run("train(4)")
        k.run("1 / 0")  # an error in a cell that trains nothing (a plot's typo) is not the run's
        k.km.shutdown_kernel(now=False)
        assert wait_for(lambda: any(e["kind"] == "end" for e in iter_events(record)), timeout=60)
    finally:
        k.kc.stop_channels()
    end = _end(record)
    assert end["status"] == "finished", end
