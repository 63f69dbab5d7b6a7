"""The official CycleGAN/pix2pix update order, watched as ``watch(model, optimizer_G)``:
``set_requires_grad(D, False); optimizer_G.zero_grad(); loss_G.backward(); optimizer_G.step();
set_requires_grad(D, True); optimizer_D.zero_grad(); loss_D.backward(); optimizer_D.step()``.
The discriminators' backward opens the next step with the generators' gradients of the last
update still there, and ``optimizer_G.zero_grad()`` clears them before the generators' backward.
With the discriminators frozen at that moment, their own ``.grad`` was counted among the
generators' optimizer's, so the reset went unseen: P5's error "zero_grad() is missing" on every
step (QA 44d).  The same loop with ``optimizer_G.zero_grad()`` dropped is still P5."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _frozen(nets: list[nn.Module], frozen: bool) -> None:
    for net in nets:
        for p in net.parameters():
            p.requires_grad = not frozen


class CycleGAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.g_a, self.g_b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.d_a, self.d_b = nn.Linear(4, 1), nn.Linear(4, 1)


def _train(path: Path, mode: str, zero_g: bool) -> None:
    torch.manual_seed(0)
    m = CycleGAN()
    opt_g = torch.optim.Adam([*m.g_a.parameters(), *m.g_b.parameters()], lr=2e-4)
    opt_d = torch.optim.Adam([*m.d_a.parameters(), *m.d_b.parameters()], lr=2e-4)
    mse = nn.MSELoss()
    with torchscope.watch(m, opt_g, server=None, record=path, mode=mode):
        for _ in range(8):
            real_a, real_b = torch.randn(2, 4), torch.randn(2, 4)
            fake_b, fake_a = m.g_a(real_a), m.g_b(real_b)
            _frozen([m.d_a, m.d_b], True)
            if zero_g:
                opt_g.zero_grad()
            loss_g = mse(m.d_a(fake_b), torch.ones(2, 1)) + mse(m.d_b(fake_a), torch.ones(2, 1)) + (m.g_b(fake_b) - real_a).abs().mean()
            loss_g.backward()
            opt_g.step()
            _frozen([m.d_a, m.d_b], False)
            opt_d.zero_grad()
            (mse(m.d_a(real_b), torch.ones(2, 1)) + mse(m.d_a(fake_b.detach()), torch.zeros(2, 1))).backward()
            (mse(m.d_b(real_a), torch.ones(2, 1)) + mse(m.d_b(fake_a.detach()), torch.zeros(2, 1))).backward()
            opt_d.step()


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_the_cyclegan_order_is_no_missing_zero_grad(tmp_path: Path, mode: str) -> None:
    path = tmp_path / f"{mode}.tscope"
    _train(path, mode, zero_g=True)
    found = [dict(f) for f in diagnose(list(iter_events(path)))]
    assert not [f for f in found if f["severity"] in ("warning", "error")], found


def test_without_the_generators_zero_grad_it_is_p5(tmp_path: Path) -> None:
    path = tmp_path / "missing.tscope"
    _train(path, "default", zero_g=False)
    p5 = [dict(f) for f in diagnose(list(iter_events(path))) if f["code"] == "P5" and f["severity"] == "error"]
    assert p5 and "zero_grad() is missing" in p5[0]["message"], p5
