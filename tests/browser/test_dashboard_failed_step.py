"""A run that died on its first NaN loss (``if not torch.isfinite(loss): raise``) before that
step's backward, recorded in full mode and opened by a colleague: the Doctor's P4 finding leads
to that step's graph -- its forward's ops, which the capture now keeps (``GraphEvent.failed``)
-- with the op that made the NaN selected, and the graph says why it has no grad_fn column."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import forkrun
import httpx
import pytest
from browser_page import checked_page, shot
from conftest import NAN_CRASH, ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")



@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("failed-step-server")) as s:
        yield s


@pytest.fixture(scope="module")
def crashed(srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("failed-step-run")
    script, path = out / "crash.py", out / "crash.tscope"
    script.write_text(NAN_CRASH)
    res = forkrun.run([str(script), str(path)], timeout=120)
    assert res.returncode != 0 and "FloatingPointError" in res.stderr, res.stderr[-2000:]
    with open(path, "rb") as f:
        imported = httpx.post(srv.url + "/api/sessions/import", files={"file": (path.name, f)}, timeout=120)
    imported.raise_for_status()
    return str(imported.json()["id"])


def test_the_nan_finding_opens_the_failed_steps_ops(srv: ServerProc, crashed: str) -> None:
    row: Any = srv.get(f"/api/sessions/{crashed}")
    assert row["status"] == "error" and row["steps"] == 3, row
    with checked_page() as page:
        page.goto(f"{srv.url}/sessions/{crashed}?view=diagnostics")
        page.locator("button.finding", has_text="P4").first.click()
        page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.selected && g.step === 3; })()")
        shot(page, "failed-step-graph")
        g = page.evaluate("window.__torchscope.state().graph")
        labels = {n["key"]: n["label"] for n in g["nodes"]}
        assert labels.get(g["selected"]) == "div", (g["selected"], labels)
        assert "The run stopped with an error in step 3, before its backward" in g["status"], g["status"]
        assert not any(k.startswith("n") for k in labels), labels  # ops only: no grad_fn node drawn


# an in-place write into sigmoid's saved output at step 2, its backward not caught: the run dies
BACKWARD_CRASH = """import sys, torch
from torch import nn
import torchscope
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.crash = nn.Linear(8, 16), nn.Linear(16, 1), False
    def forward(self, x):
        h = torch.sigmoid(self.fc1(x))
        if self.crash:
            h[:, :2] = 0  # in place, into what sigmoid saved
        return self.fc2(h)
torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
torchscope.watch(model, opt, server=None, record=sys.argv[1], mode="full")
for i in range(5):
    opt.zero_grad()
    model.crash = i == 2
    nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
    opt.step()
"""


def test_a_backward_that_ended_the_run_is_not_said_to_have_let_the_loop_go_on(
        srv: ServerProc, tmp_path_factory: pytest.TempPathFactory) -> None:
    """QA 38a: the graph of the step whose backward raised, uncaught, said "and the loop went
    on" -- of a run that died there."""
    out = tmp_path_factory.mktemp("backward-crash")
    script, path = out / "crash.py", out / "crash.tscope"
    script.write_text(BACKWARD_CRASH)
    res = forkrun.run([str(script), str(path)], timeout=120)
    assert res.returncode != 0 and "modified by an inplace operation" in res.stderr, res.stderr[-2000:]
    with open(path, "rb") as f:
        imported = httpx.post(srv.url + "/api/sessions/import", files={"file": (path.name, f)}, timeout=120)
    imported.raise_for_status()
    sid = str(imported.json()["id"])
    row: Any = srv.get(f"/api/sessions/{sid}")
    assert row["status"] == "error" and row["steps"] == 3, row
    with checked_page() as page:
        page.goto(f"{srv.url}/sessions/{sid}?view=graph&step=2")
        page.wait_for_function("(() => { const g = window.__torchscope.state().graph; return g && g.step === 2 && g.status; })()")
        status = page.evaluate("window.__torchscope.state().graph.status")
        assert "backward() raised in this step" in status and "the run stopped with that error" in status, status
        assert "the loop went on" not in status and "micro-batches" not in status
