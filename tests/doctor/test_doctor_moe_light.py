"""A mixture-of-experts in ``mode='light'``: an expert no token was routed to on a step gets no
gradient there while another expert's same layer gets one.  With no graph to read, P1 warned
"a path that changes from step to step ... or a path to the loss cut on those steps only" on
every such run (QA 47b); the same layer of a sibling in the ``ModuleList`` taking its place on
each of those steps tells a path chosen per step, an info.  A cut in the loop takes every
expert's gradient with it and stays a warning.  And with ``zero_grad(set_to_none=False)`` an
expert idle for the run's last steps keeps exact zeros: unused, not a dead branch (P2), while a
dead ReLU inside an expert stays one.  The group's wording: "since step N, every step" only when
each of its parameters lost its gradient for good, not when their steps together cover the run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

EXPERTS = 6


class _MoE(nn.Module):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.gate = nn.Linear(d, EXPERTS)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, d))
                                     for _ in range(EXPERTS))
        self.out = nn.Linear(d, 2)
        self.banned: list[int] = []  # experts the router may not pick (the loop's switch)
        self.cut = False  # the loop detaches the experts' output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the same ops whether or not an expert is banned: the graph's structure does not tell
        banned = torch.zeros(EXPERTS, dtype=torch.bool)
        banned[self.banned] = True
        logits = self.gate(x).masked_fill(banned, -1e9)
        weight, idx = F.softmax(logits, -1).max(-1)
        y = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = (idx == e).nonzero(as_tuple=True)[0]
            if sel.numel():
                y = y.index_add(0, sel, expert(x[sel]) * weight[sel, None])
        return self.out(y.detach() if self.cut else y)


def _run(path: Path, mode: str, *, set_to_none: bool = True, idle_from: int | None = None,
         cut_every: int = 0, dead: int | None = None) -> tuple[list[dict], list[list[bool]]]:
    torch.manual_seed(0)
    model = _MoE()
    if dead is not None:  # a ReLU that never fires inside one expert
        nn.init.constant_(model.experts[dead][0].bias, -100.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    graded = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(16):
            model.banned = [1] if idle_from is not None and step >= idle_from else []
            model.cut = bool(cut_every) and step % cut_every == cut_every - 1
            x, y = torch.randn(8, 8), torch.randint(0, 2, (8,))
            opt.zero_grad(set_to_none=set_to_none)
            F.cross_entropy(model(x), y).backward()
            graded.append([bool(g is not None and g.abs().sum() > 0) for g in
                           (model.experts[e][2].bias.grad for e in range(EXPERTS))])
            opt.step()
    return diagnose(list(iter_events(path))), graded


@pytest.mark.parametrize("mode", ["light", "default"])
def test_an_unrouted_expert_is_an_info_in_every_mode(tmp_path: Path, mode: str) -> None:
    findings, graded = _run(tmp_path / "moe.tscope", mode)
    # the premise: on some step an expert got no gradient while another got one
    assert any(not row[e] and any(row) for row in graded for e in range(EXPERTS))
    assert all(any(row[e] for row in graded) for e in range(EXPERTS))  # ... and each is routed to on some
    p1 = [f for f in findings if f["code"] == "P1"]
    assert p1 and all(f["severity"] == "info" for f in p1), [(f["severity"], f["message"]) for f in p1]
    assert all(p.startswith("experts.") for f in p1 for p in f["params"])
    # each expert idle on some steps, not all of them for good: no "since step 0, every step"
    assert not [f for f in p1 if "every step, after getting one before" in f["message"]], [f["message"] for f in p1]


def test_a_cut_that_takes_every_expert_stays_a_warning_in_light_mode(tmp_path: Path) -> None:
    findings, graded = _run(tmp_path / "cut.tscope", "light", cut_every=3)
    assert not any(graded[2]) and any(graded[0])  # the premise: step 2 cut, every expert without a gradient
    p1 = [f for f in findings if f["code"] == "P1"]
    assert [f for f in p1 if f["severity"] == "warning" and 2 in f["steps"]], [(f["severity"], f["message"]) for f in p1]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_an_expert_idle_to_the_end_after_zero_grad_without_none_is_no_dead_branch(tmp_path: Path, mode: str) -> None:
    findings, graded = _run(tmp_path / "idle.tscope", mode, set_to_none=False, idle_from=9)
    assert any(row[1] for row in graded[:9]) and not any(row[1] for row in graded[9:])  # the premise
    p2 = [f for f in findings if f["code"] == "P2"]
    assert p2 == [], [f["message"] for f in p2]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_dead_relu_inside_an_expert_stays_a_dead_branch(tmp_path: Path, mode: str) -> None:
    findings, graded = _run(tmp_path / "dead.tscope", mode, set_to_none=False, dead=2)
    assert sum(row[2] for row in graded) >= 3  # the premise: expert 2 is routed to, its output layer learns
    p2 = [f for f in findings if f["code"] == "P2"]
    assert [f for f in p2 if "experts.2.0.weight" in f["params"]], [f["message"] for f in p2]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_an_expert_no_longer_routed_to_is_a_warning(tmp_path: Path, mode: str) -> None:
    """Expert 1 routed to on the first steps, never from step 9 on: the router collapsed onto the
    others -- no path chosen per step, and not "nothing to fix" (QA 48c: an info in every mode)."""
    findings, graded = _run(tmp_path / "gone.tscope", mode, idle_from=9)
    assert any(row[1] for row in graded[:9]) and not any(row[1] for row in graded[9:])  # the premise
    gone = [f for f in findings if f["code"] == "P1" and "experts.1.0.weight" in f["params"]]
    assert len(gone) == 1 and gone[0]["severity"] == "warning", [(f["severity"], f["message"]) for f in findings]
    assert "since step 9, every step" in gone[0]["message"] and "for good" in gone[0]["message"]


class _Stack(nn.Module):
    """A stack of layers in a ModuleList, every one run at every step; the loop detaches one's
    output from a step on (a bug: its parameters, and the ones before it, stop learning)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.cut_from: int | None = None
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = torch.tanh(layer(x))
            if i == 1 and self.cut_from is not None and self.step >= self.cut_from:
                x = x.detach()
        return x


def test_a_layer_cut_for_good_in_a_module_list_stays_a_warning_in_light_mode(tmp_path: Path) -> None:
    """The later layers' same parameters still get a gradient on every step: a sibling "in its
    place" -- but a stack runs every member each step, and a cut for good is no choice per step
    (QA 48c: an info saying nothing to fix)."""
    torch.manual_seed(0)
    model = _Stack()
    model.cut_from = 6
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "stack.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for step in range(14):
            model.step = step
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
    p1 = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P1"]
    cut = [f for f in p1 if "layers.0.weight" in f["params"]]
    assert len(cut) == 1 and cut[0]["severity"] == "warning", [(f["severity"], f["message"]) for f in p1]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_layer_frozen_by_clearing_its_grad_mid_run_is_a_cleared_gradient(tmp_path: Path, mode: str) -> None:
    """``p.grad = None`` on the last layer after backward from step 8 on (freezing it the loop's
    way): the capture saw it cleared (``grads_cleared``); it read as "the forward stopped using
    them for good" (QA 48e)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "freeze.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(16):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            if step >= 8:
                for p in model[2].parameters():
                    p.grad = None
            opt.step()
    p1 = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P1" and "2.weight" in f["params"]]
    assert len(p1) == 1 and "cleared between backward() and step()" in p1[0]["message"], [f["message"] for f in p1]
    assert "stopped using" not in p1[0]["message"]
