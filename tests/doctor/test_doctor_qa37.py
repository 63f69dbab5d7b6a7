"""QA 37a's tutorial recipes, where the doctor pointed at the wrong line or erred on correct code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _line(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}"))


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_dcgan_without_detach_watched_on_its_critic_names_the_backward_that_freed_g(tmp_path: Path, mode: str) -> None:
    """PyTorch's DCGAN tutorial with `netD(fake)` for the critic's fake loss (no `.detach()`):
    `errG.backward()` goes through G's graph, freed by `errD_fake.backward()`.  Watched on the
    critic, P10 named `errD_real.backward()` (its step's first backward, which never touches G),
    and P5 said zero_grad() was missing because the failing step began on the critic's gradients
    -- its only backward raised, so nothing was added onto them."""
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 8))
    netD = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1), nn.Sigmoid())
    crit = nn.BCELoss()
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4)
    path = tmp_path / "gan.tscope"
    g = torch.Generator().manual_seed(1)
    with (pytest.raises(RuntimeError, match="backward through the graph a second time"),
          torchscope.watch(netD, optD, server=None, record=path, mode=mode)):
        for _ in range(3):
            real = torch.randn(16, 8, generator=g)
            netD.zero_grad()
            errD_real = crit(netD(real).view(-1), torch.ones(16))
            errD_real.backward()
            fake = netG(torch.randn(16, 4, generator=g))
            errD_fake = crit(netD(fake).view(-1), torch.zeros(16))  # the bug: no fake.detach()
            errD_fake.backward()  # marker: frees G
            optD.step()
            netG.zero_grad()
            errG = crit(netD(fake).view(-1), torch.ones(16))
            errG.backward()  # marker: raises
            optG.step()
    found = [dict(f) for f in diagnose(iter_events(path))]
    (p10,) = [f for f in found if f["code"] == "P10"]
    assert f"first freed by the backward at {Path(__file__).name}:{_line('marker: frees G')}" in p10["message"], p10
    assert p10["src"] == f"{Path(__file__).name}:{_line('marker: raises')}"
    assert "netD(fake.detach())" in p10["fix"]
    assert [f for f in found if f["code"] == "P5"] == [], found


@pytest.mark.parametrize("backbone", ["train", "eval", "trained"])
def test_a_frozen_backbone_whose_batch_norm_still_updates_is_told(tmp_path: Path, backbone: str) -> None:
    """Feature extraction with `requires_grad_(False)` on a backbone left in train mode: its
    batch-norm running statistics move with every batch (plain PyTorch shows them change), so
    the "frozen" features do too.  No finding before; an info now, naming the modules with their
    type.  The backbone in eval(), or trained, is no finding."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    if backbone != "trained":
        model[:2].requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    before = model[1].running_mean.clone()
    g = torch.Generator().manual_seed(1)
    path = tmp_path / "frozen.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(6):
            model.train()
            if backbone == "eval":
                model[:2].eval()
            x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    moved = not torch.equal(before, model[1].running_mean)
    assert moved == (backbone != "eval")
    p11 = [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P11"]
    if backbone != "train":
        assert p11 == []
        return
    (f,) = p11
    assert (f["severity"], f["title"], f["modules"]) == ("info", "Batch-norm statistics updating in frozen layers", ["1"])
    assert f["message"].startswith("'1' (BatchNorm1d) trains none of its parameters") and "every training step" in f["message"]


def test_a_carried_state_error_with_two_parameters_of_its_shape_says_one_of_them(tmp_path: Path) -> None:
    """An encoder's state carried across batches without detach, kept with retain_graph=True:
    torch's error names the updated tensor by shape only ([32, 96]), which the encoder's and the
    decoder's weight_hh_l0 share.  P8 said both had been updated; it is one of them."""
    torch.manual_seed(0)

    class Seq2Seq(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.enc, self.dec = nn.Embedding(20, 16), nn.GRU(16, 32, batch_first=True), nn.GRU(16, 32, batch_first=True)
            self.out = nn.Linear(32, 20)

        def forward(self, src: torch.Tensor, h0: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            _, h = self.enc(self.emb(src), h0)
            o, _ = self.dec(self.emb(src), h)
            return self.out(o), h

    model = Seq2Seq()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    path = tmp_path / "carry.tscope"
    g = torch.Generator().manual_seed(1)
    state = None
    with (pytest.raises(RuntimeError, match="modified by an inplace operation"),
          torchscope.watch(model, opt, server=None, record=path)):
        for _ in range(4):
            src = torch.randint(1, 20, (8, 5), generator=g)
            opt.zero_grad()
            logits, state = model(src, state)
            nn.functional.cross_entropy(logits.reshape(-1, 20), src.flip(1).reshape(-1)).backward(retain_graph=True)
            opt.step()
    (p8,) = [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P8"]
    assert "had updated one of enc.weight_hh_l0 or dec.weight_hh_l0 (torch's error names only their shape)" in p8["message"], p8


def test_a_target_network_run_with_autograd_is_told_on_every_step_with_its_line(tmp_path: Path) -> None:
    """A DQN's target network (a deepcopy) run without no_grad: in default mode, which captures
    the first step of a structure, the finding said "at step 0" although every step does it (full
    said "every step"), gave no line, and said "used by ops of (root)" of a network not watched."""
    import copy

    torch.manual_seed(0)
    q = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    q_target = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    path = tmp_path / "dqn.tscope"
    with torchscope.watch(q, opt, server=None, record=path):
        for _ in range(12):
            s, a, r, s2 = (torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g),
                           torch.randn(16, generator=g), torch.randn(16, 4, generator=g))
            q_sa = q(s).gather(1, a[:, None]).squeeze(1)  # (PyTorch's DQN tutorial's order)
            target = r + 0.99 * q_target(s2).max(1).values  # marker: target with autograd
            loss = nn.functional.smooth_l1_loss(q_sa, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
    (f,) = [dict(f) for f in diagnose(iter_events(path)) if f["title"] == "Parameters outside the model"]
    assert f["steps"] == list(range(12)) and "since step 0, every step" in f["message"], f
    assert f["src"] == f"{Path(__file__).name}:{_line('marker: target with autograd')}"
    assert "(root)" not in f["message"]


def test_an_undivided_accumulation_clipped_by_sgd_says_the_size_clipping_leaves(tmp_path: Path) -> None:
    """SGD, 4 micro-batches summed without `/ 4`, `clip_grad_norm_(..., 1.0)`: the summed norm is
    clipped to 1, so the step is max_norm / (norm / 4) times the intended one, not 4 times."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    wt = torch.randn(20, 3, generator=g)
    norms = []
    with torchscope.watch(model, opt, server=None, record=tmp_path / "acc.tscope"):
        for _ in range(6):
            opt.zero_grad()
            for _ in range(4):
                x = torch.randn(16, 20, generator=g)
                nn.functional.cross_entropy(model(x), (x @ wt).argmax(1)).backward()
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
            opt.step()
    assert 1.0 < norms[0] < 4.0  # clipped, and the mean loss's gradients would not have been
    (p15,) = [dict(f) for f in diagnose(iter_events(tmp_path / "acc.tscope")) if f["code"] == "P15"]
    assert (f"caps the summed gradients (norm {norms[0]:.3g}), so each optimizer step is "
            f"{1.0 / (norms[0] / 4):.1f}x larger than intended, not 4x") in p15["message"], p15["message"]


def test_a_layer_detached_mid_run_is_said_to_get_no_gradient_since_then(tmp_path: Path) -> None:
    """A layer cut off by a .detach() from step 6 on, to the run's end: "since step 6, every
    step", not "on 6 of 12 steps each (steps 6, 7, 8, ...) and one on the others" (QA 37d)."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head, self.cut = nn.Linear(6, 8), nn.Linear(8, 1), False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.body(x))
            return self.head(h.detach() if self.cut else h)

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    path = tmp_path / "cut.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for i in range(12):
            model.cut = i >= 6
            opt.zero_grad()
            model(torch.randn(8, 6, generator=g)).pow(2).mean().backward()
            opt.step()
    (p1,) = [dict(f) for f in diagnose(iter_events(path)) if f["code"] == "P1"]
    assert p1["message"].startswith("body.weight, body.bias got no gradient since step 6, every step, after getting one "
                                    "before"), p1["message"]
