"""P1 when no backward reaches the watched model at all (QA 44b): a GAN's generator loss made
from ``D(fake.detach())`` -- the textbook slip -- leaves every generator parameter without a
gradient at ``optG.step()``, and no backward of the step touches the generator
(``micro_batches`` 0).  The doctor said only P6's "graph built but never used ... torch.no_grad()
around them saves building it", whose fix keeps the generator from ever learning.  The same loop
with ``D(fake)`` is no finding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

FORWARD_LINE = "fake = G(z)  # the generator's forward"


def _gan(path: Path, mode: str, how: str) -> None:
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt_g, opt_d = torch.optim.Adam(G.parameters(), lr=1e-3), torch.optim.Adam(D.parameters(), lr=1e-3)
    crit = nn.BCEWithLogitsLoss()
    with torchscope.watch(G, opt_g, server=None, record=path, mode=mode):
        for _ in range(8):
            real, z = torch.randn(16, 2) + 2.0, torch.randn(16, 8)
            fake = G(z)  # the generator's forward
            opt_d.zero_grad()
            (crit(D(real), torch.ones(16, 1)) + crit(D(fake.detach()), torch.zeros(16, 1))).backward()
            opt_d.step()
            opt_g.zero_grad()
            seen = fake.detach() if how == "detached" else fake.data if how == "data" else fake
            crit(D(seen), torch.ones(16, 1)).backward()
            opt_g.step()


def _line(text: str) -> str:
    lines = Path(__file__).read_text().splitlines()
    return f"{Path(__file__).name}:{next(i for i, t in enumerate(lines, 1) if text in t and not t.startswith('FORWARD'))}"


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("how", ["detached", "data"])
def test_a_generator_loss_from_a_detached_fake_is_p1(tmp_path: Path, mode: str, how: str) -> None:
    path = tmp_path / f"{how}-{mode}.tscope"
    _gan(path, mode, how)
    found = [dict(f) for f in diagnose(list(iter_events(path)))]
    (p1,) = [f for f in found if f["code"] == "P1"]
    assert p1["severity"] == "error" and p1["steps"] == list(range(8)), p1
    assert p1["message"].startswith("No backward() reached Sequential: none of its 4 trainable parameters"), p1
    assert p1["src"] == _line(FORWARD_LINE), p1
    assert "D(fake)" in p1["fix"] and sorted(p1["params"]) == ["0.bias", "0.weight", "2.bias", "2.weight"], p1
    # P6's advice to put the forward under no_grad would make the slip permanent
    assert not [f for f in found if f["code"] == "P6"], found


@pytest.mark.parametrize("mode", ["light", "default"])
def test_the_generator_trained_through_its_fake_is_no_finding(tmp_path: Path, mode: str) -> None:
    path = tmp_path / f"right-{mode}.tscope"
    _gan(path, mode, "kept")
    found = [dict(f) for f in diagnose(list(iter_events(path)))]
    assert not [f for f in found if f["severity"] in ("warning", "error")], found
