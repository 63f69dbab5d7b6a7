"""QA 53a, on real scripts run in a subprocess: a GAN's or DDPG's second network whose optimizer
was a local of ``train()`` (collected before the watch closed at exit) read as "Parameters
outside the model ... a target network or a teacher" (P1), every step in full mode; and
``Normal(mu, sigma).sample()`` in a VAE named its argument validation (``aten::eq``) as the cut,
with a straight-through fix, not the no_grad sample and ``rsample()``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from doctor_runs import script_findings

from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

SCRIPT = '''
import copy
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Normal

import torchscope

variant, mode, record = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)


def ddpg():
    # the actor watched; the critic's optimizer a local, gone when train() returns (the watch
    # closes at exit): the actor's loss -critic(s, actor(s)) fills the critic's .grad
    actor = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 1), nn.Tanh())
    critic = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    oa = torch.optim.Adam(actor.parameters(), lr=1e-3)
    oc = torch.optim.Adam(critic.parameters(), lr=1e-3)
    torchscope.watch(actor, oa, mode=mode, server=None, record=record)
    for _ in range(5):
        s, a, r = torch.randn(16, 3), torch.rand(16, 1) * 2 - 1, torch.randn(16, 1)
        oc.zero_grad()
        F.mse_loss(critic(torch.cat([s, a], 1)), r).backward()
        oc.step()
        oa.zero_grad()
        (-critic(torch.cat([s, actor(s)], 1)).mean()).backward()
        oa.step()
    return (actor, critic, oc) if variant == "ddpg_keep" else (actor, critic)


def gan():
    # both watched (the critic first), each with its own optimizer (locals), the critic's
    # stepped twice a step
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    og = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.9))
    od = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.9))
    torchscope.watch(D, od, mode=mode, server=None, record=record + ".D")
    torchscope.watch(G, og, mode=mode, server=None, record=record)
    for _ in range(4):
        for _ in range(2):
            real, fake = torch.randn(8, 2) + 2, G(torch.randn(8, 4)).detach()
            od.zero_grad()
            (D(fake).mean() - D(real).mean()).backward()
            od.step()
        og.zero_grad()
        (-D(G(torch.randn(8, 4))).mean()).backward()
        og.step()
    return G, D


def target():
    # the real P1: a DQN's target network, a copy run with autograd on that no optimizer steps
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    tgt = copy.deepcopy(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    torchscope.watch(net, opt, mode=mode, server=None, record=record)
    for _ in range(5):
        s, s2, r = torch.randn(16, 4), torch.randn(16, 4), torch.randn(16)
        y = r + 0.9 * tgt(s2).max(1).values  # BUG: not under torch.no_grad()
        opt.zero_grad()
        F.mse_loss(net(s).max(1).values, y).backward()
        opt.step()
    return net, tgt


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(10, 8)
        self.dec = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 10))

    def forward(self, x):
        mu, log_std = self.enc(x).chunk(2, -1)
        dist = Normal(mu, log_std.exp(), validate_args=variant != "vae_novalidate")
        return self.dec(dist.sample())  # BUG: rsample()


def vae():
    model = VAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with torchscope.watch(model, opt, mode=mode, server=None, record=record):
        for _ in range(4):
            x = torch.randn(6, 10)
            opt.zero_grad()
            F.mse_loss(model(x), x).backward()
            opt.step()


kept = {"ddpg": ddpg, "ddpg_keep": ddpg, "gan": gan, "target": target}.get(variant, vae)()
'''


def _findings(tmp_path: Path, variant: str, mode: str) -> list[dict[str, Any]]:
    return script_findings(tmp_path, SCRIPT, variant, mode)[1]


def _line(text: str) -> int:
    return next(n for n, line in enumerate(SCRIPT.split("\n"), 1) if text in line)


def _outside(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in found if f["code"] == "P1" and f.get("title") == "Parameters outside the model"]


@pytest.mark.parametrize("variant", ["ddpg", "gan"])
@pytest.mark.parametrize("mode", ["light", "full"])
def test_a_second_network_whose_optimizer_is_gone_is_trained(tmp_path: Path, variant: str, mode: str) -> None:
    """The critic's optimizer stepped it every step, then went with train()'s locals before the
    watch closed at exit: no "Parameters outside the model" (QA 53a: WARN P1 "a copy of the model
    (a target network or a teacher)", "since step 0, every step" in full mode, whose fix -- run it
    under no_grad -- would stop the actor's or generator's gradient)."""
    found = _findings(tmp_path, variant, mode)
    if variant == "gan":  # the critic's own watch: the generator's optimizer went too
        found += [dict(f) for f in diagnose(iter_events(tmp_path / f"gan_{mode}.tscope.D"))]
    assert not _outside(found), [(f["code"], f["message"]) for f in found]
    assert not [f for f in found if f["code"] == "P1"], [(f["code"], f["message"]) for f in found]


def test_the_same_with_its_optimizer_alive_stays_clean(tmp_path: Path) -> None:
    found = _findings(tmp_path, "ddpg_keep", "full")
    assert not [f for f in found if f["code"] == "P1"], [(f["code"], f["message"]) for f in found]


@pytest.mark.parametrize("mode", ["light", "full"])
def test_a_target_network_run_with_autograd_is_still_found(tmp_path: Path, mode: str) -> None:
    """The real case: a copy of the model that no optimizer steps, run with autograd on."""
    (p1,) = _outside(_findings(tmp_path, "target", mode))
    assert "a copy of the model (a target network or a teacher" in p1["message"], p1["message"]
    assert "every step" in p1["message"], p1["message"]


@pytest.mark.parametrize("variant", ["vae", "vae_novalidate"])
def test_distribution_sample_is_named_with_rsample(tmp_path: Path, variant: str) -> None:
    """``Normal(mu, sigma).sample()`` runs under no_grad: the cut is its aten::normal, the fix
    rsample() -- not the argument validation's ``mu == mu`` (aten::eq, read through .item(),
    feeding nothing) with a straight-through / Gumbel fix (QA 53a)."""
    (p1,) = [f for f in _findings(tmp_path, variant, "default") if f["code"] == "P1"]
    assert "enc.weight" in p1["message"] and "aten::normal" in p1["message"], p1["message"]
    assert "aten::eq" not in p1["message"] and "straight through" not in p1["fix"], p1
    assert "rsample()" in p1["fix"], p1["fix"]
    assert p1["src"] == f"train.py:{_line('return self.dec(dist.sample())')}", p1["src"]
