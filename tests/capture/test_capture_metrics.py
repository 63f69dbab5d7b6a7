"""torchscope.log(): numbers of the user's own, each with its step, in the session file --
without changing the training, without an op in the captured graph, never raising."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchscope
from torchscope.session import load


def _train(path: Path | None, mode: str = "default", log: bool = True, steps: int = 4) -> list[float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses: list[float] = []
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode) if path is not None else None
    try:
        for step in range(steps):
            x = torch.randn(8, 6)
            loss = model(x).pow(2).mean()
            if log:
                torchscope.log(inside=loss)  # a tensor that requires grad, read in the step
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if log:
                torchscope.log(acc=step / 4, np32=np.float32(0.25), flag=step % 2 == 0)  # the step that ended
            model.eval()
            with torch.no_grad():  # an evaluation between: no step of its own
                val = model(torch.randn(8, 6)).pow(2).mean()
            model.train()
            if log:
                torchscope.log(val=val)
        if log:
            torchscope.log(step=0, late=7)  # a step given: that one
    finally:
        if watch is not None:
            watch.close()
    return losses


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_logged_numbers_have_their_steps_and_change_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, native: bool) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    plain = _train(None, log=False)
    path = tmp_path / "run.tscope"
    watched = _train(path, mode)
    assert [x.hex() for x in watched] == [x.hex() for x in plain]  # bit-identical
    run = load(path)
    metrics = run.metrics()
    assert metrics["acc"] == {"step": [0, 1, 2, 3], "value": [0.0, 0.25, 0.5, 0.75]}
    assert metrics["inside"]["step"] == [0, 1, 2, 3]
    assert [v for v in metrics["inside"]["value"]] == pytest.approx(watched, rel=1e-6)
    assert metrics["np32"]["value"] == [0.25] * 4 and metrics["flag"]["value"] == [1.0, 0.0, 1.0, 0.0]
    assert metrics["late"] == {"step": [0], "value": [7.0]}
    assert metrics["val"]["step"] == [0, 1, 2, 3]  # after the evaluation: still the step that ended
    # each call is one info line of the log, readable without the field
    lines = [e for e in run.logs if "metrics" in e]
    assert lines[0]["message"].startswith("step 0: inside=") and lines[1]["message"] == "step 0: acc=0, np32=0.25, flag=1"
    # the read of `inside` is the capture's, not an op of the step's graph (the optimizer's own
    # reads of its step counts are: full mode records optimizer.step())
    for s in run.graph_steps:
        ops = run.graph(s)["ops"]
        assert not [op["name"] for op in ops if op["name"] == "aten::_local_scalar_dense" and op["phase"] != "optimizer"]


def test_what_is_no_number_is_left_out_with_one_line_and_nothing_raises(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "bad.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(3):
            model(torch.randn(2, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
            torchscope.log(name="resnet", vec=torch.ones(3), ok=float("inf"), cplx=torch.tensor(1j), **{"x" * 200: 1.0})
            torchscope.log(step="three", also=1)  # a step that is no int: the step as if none were given
    err = capsys.readouterr().err
    for name in ("name", "vec", "cplx", "x" * 200):
        assert err.count(f"log({name}=...) left out") == 1, err
    metrics = load(path).metrics()
    assert sorted(metrics) == ["also", "ok"] and metrics["ok"]["value"] == [math.inf] * 3
    assert metrics["also"]["step"] == [0, 1, 2]
    torchscope.log(after=1.0)  # the watch closed: nothing, no error
    assert "after" not in load(path).metrics()


def test_log_without_a_watch_does_nothing_and_imports_no_torch() -> None:
    code = ("import sys, torchscope; torchscope.log(acc=1.0); torchscope.log(step=3, x=2);"
            "print('torch' in sys.modules, 'torchscope._watch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"] and out.stderr == ""


def _tail_run(path: Path, mode: str, kind: str) -> dict[str, list[tuple[int, float]]]:
    """Loops whose iteration goes on after the watched optimizer's step before they log: a GAN's
    generator update through the watched discriminator, an accuracy computed with a training-mode
    forward after the step; and gradient accumulation, whose micro-batches between steps belong to
    the open step."""
    torch.manual_seed(0)
    D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    opt_d, opt_g = torch.optim.Adam(D.parameters(), 1e-3), torch.optim.Adam(G.parameters(), 1e-3)
    bce = nn.functional.binary_cross_entropy_with_logits
    with torchscope.watch(D, opt_d, server=None, record=path, mode=mode):
        for i in range(6):
            real, fake = torch.randn(8, 2) + 2, G(torch.randn(8, 4))
            d_loss = bce(D(real), torch.ones(8, 1)) + bce(D(fake.detach()), torch.zeros(8, 1))
            if kind != "accumulate" or i % 2 == 0:
                opt_d.zero_grad()
            d_loss.backward()
            if kind != "accumulate" or i % 2 == 1:
                opt_d.step()
            if kind == "gan":
                g_loss = bce(D(fake), torch.ones(8, 1))
                opt_g.zero_grad()
                g_loss.backward()
                opt_g.step()
            torchscope.log(d_loss=d_loss.item(), score=float(D(real).mean()) if kind == "forward" else float(i))
    logged: dict[str, list[tuple[int, float]]] = {}
    for ev in load(str(path)).logs:
        for k, v in (ev.get("metrics") or {}).items():
            logged.setdefault(k, []).append((ev["step"], v))
    return logged


@pytest.mark.parametrize("mode", ["light", "default"])
@pytest.mark.parametrize("kind", ["gan", "forward"])
def test_a_log_after_the_iterations_tail_has_the_step_that_ended(tmp_path: Path, mode: str, kind: str) -> None:
    logged = _tail_run(tmp_path / "run.tscope", mode, kind)
    steps = load(str(tmp_path / "run.tscope")).steps
    # each iteration's d_loss with the step its discriminator update made: the step's own loss
    assert [s for s, _ in logged["d_loss"]] == list(range(6)), logged
    assert [v for _, v in logged["d_loss"]] == pytest.approx([st["loss"] for st in steps])


def test_a_log_after_a_micro_batch_has_the_open_step(tmp_path: Path) -> None:
    logged = _tail_run(tmp_path / "run.tscope", "default", "accumulate")
    # micro-batches 0, 2, 4 are the first of steps 0, 1, 2; 1, 3, 5 their last, logged once it ended
    assert [s for s, _ in logged["score"]] == [0, 0, 1, 1, 2, 2], logged
