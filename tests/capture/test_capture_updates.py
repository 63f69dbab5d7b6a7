"""What optimizer.step() did to each parameter (``GradStats.update_ratio``, ``.weight_norm``): the size of its update
over the size of its values (the update-to-weight ratio W&B and Karpathy read a learning rate
from: ~1e-3 is healthy, 1e-1 too fast, 1e-6 barely learning) and its norm after the step, on
the steps with full gradient statistics.  Checked against the parameters copied before and
after each ``opt.step()`` by the test itself: exact where a parameter has at most
UPDATE_SAMPLE elements, within a few percent on a strided sample of a larger one; a
parameter without a gradient has none; the training's numbers do not change."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope._watch import GRAD_STATS_EVERY, UPDATE_SAMPLE
from torchscope.session import load
from torchscope.sessionfile import iter_events

STEPS = 2 * GRAD_STATS_EVERY + 1


def _train(path: Path | None, mode: str, optimizer: str) -> tuple[list[str], dict[int, tuple[list[float | None], list[float]]]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 1),
                          nn.Linear(3, 3))  # the last: never used, no gradient
    model[2].bias.data.zero_()  # a parameter of zeros: a ratio has no meaning on its first step
    used = list(model[:5].parameters())
    model[5].requires_grad_(True)
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-3) if optimizer == "adamw"
           else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode) if path else None
    losses, truth = [], {}
    for step in range(STEPS):
        opt.zero_grad()
        loss = model[:5](torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        ratio: list[float | None] = []
        for p, b in zip(model.parameters(), before, strict=True):
            change, size = (p.detach() - b).double().norm().item(), b.double().norm().item()
            ratio.append(change / size if any(p is q for q in used) and size > 0 else None)
        truth[step] = ratio, [p.detach().double().norm().item() for p in model.parameters()]
        losses.append(loss.item().hex())
    if watch:
        watch.close()
    return losses, truth


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("mode", ["default", "full"])
def test_update_to_weight_ratio_and_norm_equal_what_the_step_did(tmp_path: Path, mode: str, optimizer: str) -> None:
    path = tmp_path / "run.tscope"
    losses, truth = _train(path, mode, optimizer)
    assert losses == _train(None, mode, optimizer)[0]  # bit for bit the unwatched training
    events = list(iter_events(path))
    params = next(e for e in events if e["kind"] == "session")["params"]
    steps = [e for e in events if e["kind"] == "step"]
    with_updates = [e["step"] for e in steps if "update_ratio" in e["grads"]]
    assert set(range(0, STEPS, GRAD_STATS_EVERY)) <= set(with_updates)
    if mode == "full":
        assert with_updates == list(range(STEPS))
    for e in steps:
        if "update_ratio" not in e["grads"]:
            continue
        u = {"ratio": e["grads"]["update_ratio"], "weight": e["grads"]["weight_norm"]}
        ratio, weight = truth[e["step"]]
        assert len(u["ratio"]) == len(u["weight"]) == len(params)
        for k, p in enumerate(params):
            if ratio[k] is None:  # the unused layer (no gradient), or the bias of zeros on its first step
                assert u["ratio"][k] is None, (p["name"], e["step"])
                continue
            sampled = p["numel"] > UPDATE_SAMPLE
            assert u["ratio"][k] == pytest.approx(ratio[k], rel=0.05 if sampled else 1e-5), (p["name"], e["step"])
            assert u["weight"][k] == pytest.approx(weight[k], rel=1e-5)
        unused = [k for k, p in enumerate(params) if p["name"].startswith("5.")]
        assert len(unused) == 2 and all(u["weight"][k] is None and u["ratio"][k] is None for k in unused)
        big = next(k for k, p in enumerate(params) if p["name"] == "2.weight")
        assert params[big]["numel"] > UPDATE_SAMPLE and math.isfinite(u["ratio"][big])  # sampled
    # the whole-run series (the file's series frames, what the server's /grads serves) carry them
    series = load(path).grads()
    assert series["update_ratio"] == [e["grads"].get("update_ratio") for e in steps]
    assert series["weight_norm"] == [e["grads"].get("weight_norm") for e in steps]


def test_light_mode_reads_no_update(tmp_path: Path) -> None:
    path = tmp_path / "light.tscope"
    _train(path, "light", "adamw")
    assert not [e for e in iter_events(path) if e["kind"] == "step" and "update_ratio" in e["grads"]]
