"""A learning rate past the stability limit: the loss blows up by orders of magnitude within a
few steps (P3 "Training diverged", with the learning rate), and when it ends in NaN the P4
finding says the updates ran away -- not "check that batch".  Real captures of a linear
regression under SGD, and hand-written loss curves for the thresholds (a slowly growing value
loss, a spike off a converged loss: no finding)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from doctor_events import session, step
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _regression(tmp_path: Path, lr: float, steps: int) -> tuple[list[dict[str, Any]], list[float]]:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    w_true = torch.randn(8, 1, generator=g)
    path = tmp_path / f"lr{lr}.tscope"
    losses = []
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(steps):
            x = 3 * torch.randn(32, 8, generator=g)
            opt.zero_grad()
            loss = F.mse_loss(model(x), x @ w_true)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return [dict(f) for f in diagnose(list(iter_events(path)))], losses


def test_a_loss_that_blows_up_under_a_too_large_learning_rate_is_found(tmp_path: Path) -> None:
    found, losses = _regression(tmp_path, lr=0.2, steps=5)  # (8 steps of growth: "is diverging")
    assert all(math.isfinite(v) for v in losses) and losses[-1] > 1e4 * losses[0]  # diverged, no NaN yet
    (p3,) = [f for f in found if f["code"] == "P3" and f["title"] == "Training diverged"]
    assert p3["message"].startswith(f"Training diverged: the loss went from {losses[0]:.3g} at step 0 to ")
    assert "the learning rate 0.2 then" in p3["message"] and "Lower the learning rate" in p3["fix"]


def test_the_nan_it_ends_in_is_told_as_the_divergence(tmp_path: Path) -> None:
    found, losses = _regression(tmp_path, lr=0.2, steps=80)
    assert not math.isfinite(losses[-1])
    (p4,) = [f for f in found if f["code"] == "P4"]
    assert "training diverged" in p4["message"] and "(learning rate 0.2)" in p4["message"]
    assert "its batch or an op of its forward made it" not in p4["message"]


def test_a_learning_rate_within_the_limit_is_no_finding(tmp_path: Path) -> None:
    found, losses = _regression(tmp_path, lr=0.01, steps=30)
    assert losses[-1] < losses[0]
    assert [f for f in found if f["code"] in ("P3", "P4")] == []


def _curve(losses: list[float]) -> list[dict[str, Any]]:
    return [session(), *(step(i, loss=v, losses=[v], lr=[1e-3]) for i, v in enumerate(losses))]


@pytest.mark.parametrize("losses", [
    [0.1 * 1.05 ** i for i in range(200)],  # a value loss growing with the returns: 17,000x over 200 steps
    [2.0, 1.0, 0.5] + [1e-5] * 30 + [1e-3] + [1e-5] * 10,  # a spike off a converged loss, far below where it started
    [2.0, 1.5, 1.0, 0.7, 30.0, 0.6],  # one hard batch: 50x
    [2.0, 1.5, 1.0, 0.7, 3000.0, 0.6, 0.5],  # one outlier batch, 4000x, and back at once
    # a noisy loss with a rare low batch, then two outlier batches in a row (bad targets) and back
    # to its noise, above 10x that low batch: no divergence (found by QA on a long run)
    [0.05] * 5 + [0.007] + [0.03, 0.02, 0.04] * 4 + [26.0, 23.5, 0.17, 0.09, 0.06, 0.18, 0.08, 0.05],
])
def test_slow_growth_and_small_spikes_are_no_blowup(losses: list[float]) -> None:
    assert [f for f in diagnose(_curve(losses)) if f.get("title") == "Training diverged"] == []


def test_a_jump_of_orders_of_magnitude_within_a_few_steps_is_a_blowup() -> None:
    found = [f for f in diagnose(_curve([2.0, 1.8, 1.7, 40.0, 900.0, 5000.0, 3000.0])) if f.get("title") == "Training diverged"]
    assert len(found) == 1 and found[0]["steps"][0] == 4 and "from 1.7 at step 2 to 900 at step 4" in found[0]["message"]


class _RNN(nn.Module):
    """A ReLU RNN over 60 time steps whose recurrent weights are initialised with gain 1.6: its
    gradients explode on the first step."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.RNN(4, 32, batch_first=True, nonlinearity="relu")
        self.fc = nn.Linear(32, 1)
        nn.init.orthogonal_(self.rnn.weight_hh_l0, gain=1.6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x)[0][:, -1])


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_nan_after_a_first_step_of_huge_gradients_blames_that_update(tmp_path: Path, mode: str) -> None:
    """No loss history to show a blow-up (the first step's update alone overflows the next
    forward), and P3 has no baseline: P4 names the huge gradients of the step before and says to
    clip them or lower the learning rate (it said an op of the forward or the target made the
    NaN; found by QA)."""
    torch.manual_seed(0)
    model = _RNN()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    path = tmp_path / "rnn.tscope"
    losses = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(6):
            x = torch.randn(8, 60, 4)
            opt.zero_grad()
            loss = F.mse_loss(model(x), x[:, :5, 0].sum(1, keepdim=True))
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert math.isfinite(losses[0]) and not any(math.isfinite(v) for v in losses[1:])
    (p4,) = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P4"]
    assert "the gradients of step 0 were already huge (total norm" in p4["message"], p4["message"]
    assert "learning rate 0.001" in p4["message"] and "clip the gradients" in p4["message"]


def test_a_diverged_tanh_nets_saturated_layer_is_no_dead_branch_and_its_nan_is_the_divergence(tmp_path: Path) -> None:
    """A learning rate 100x too high after warm-up: the weights grow until every tanh saturates,
    so the first layer's gradients are exact zeros on the diverged steps, and then the loss
    overflows to NaN.  That is the divergence (P3), not a dead branch (P2); and P4's op, caught
    on the step after the first NaN, overflowed on what the updates grew (found by QA: P2 "Dead
    branch" on three diverged steps, P4 naming aten::mse_loss without the divergence)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=5.0, momentum=0.9, nesterov=True, weight_decay=1e-4)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=5)
    x = torch.randn(30, 64, 10)
    y = x[..., :3].sum(-1, keepdim=True)
    path = tmp_path / "tanh.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="default"):
        for i in range(30):
            opt.zero_grad()
            F.mse_loss(model(x[i]), y[i]).backward()
            opt.step()
            warm.step()
    events = list(iter_events(path))
    steps = [e for e in events if e["kind"] == "step"]
    first_nan = next(e["step"] for e in steps if not math.isfinite(e["loss"]))
    # the precondition: the saturated first layer got exact-zero gradients before the NaN
    assert any(e["grads"]["norm"][0] == 0.0 for e in steps if e["step"] < first_nan)
    found = [dict(f) for f in diagnose(events)]
    assert "Training diverged" in [f.get("title") for f in found if f["code"] == "P3"]
    assert [f for f in found if f["code"] == "P2"] == [], found
    (p4,) = [f for f in found if f["code"] == "P4"]
    assert "training diverged, and the values the updates grew made that op overflow" in p4["message"], p4["message"]
    assert "Lower the learning rate" in p4["fix"]
    # the op is the loop's mse_loss, outside the model: in no module, not the root module ("(root)")
    (at_op,) = [t for t in p4["targets"] if "op" in t]
    assert "module" not in at_op and "" not in p4["modules"], p4


def test_relus_killed_by_a_loss_surge_say_so(tmp_path: Path) -> None:
    """A BatchNorm CNN under SGD at lr 0.05 with momentum on random labels: the loss rises about
    12x in two steps -- short of P3's blow-up -- and its updates switch every ReLU off for a
    few steps.  P2's dead branch says the surge came first and to lower the learning rate (QA:
    the fix spoke only of initialisation and negative biases)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    halve = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    path = tmp_path / "cnn.tscope"
    losses = []
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(16):
            x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            halve.step()
            losses.append(loss.item())
    events = list(iter_events(path))
    dead = [e["step"] for e in events if e["kind"] == "step" and not any(e["grads"]["norm"][:-1])]
    assert dead and max(losses[:dead[0]]) > 5 * losses[0], (losses, dead)  # the precondition
    found = [dict(f) for f in diagnose(events)]
    assert not [f for f in found if f.get("title") == "Training diverged"]
    (p2,) = [f for f in found if f["code"] == "P2"]
    assert f"It died after the loss surged {max(losses[:dead[0]]) / losses[0]:.3g}x (from {losses[0]:.3g} at step 0" \
        in p2["message"], p2["message"]
    assert "learning rate 0.05" in p2["message"] and "lower the learning rate" in p2["message"]
    # and the fix line agrees (QA 51b: it spoke of initialisation and LeakyReLU below that message)
    assert p2["fix"].startswith("Lower the learning rate") and "LeakyReLU" not in p2["fix"], p2["fix"]


def test_a_loss_that_falls_without_bound_is_told() -> None:
    """A VAE whose KL is subtracted: the loss falls through zero to thousands below it (found
    by QA: told 14 steps late as "exploding" gradients, with a clipping fix)."""
    losses = [44.7, 44.0, 43.1, 40.0, 30.0, 20.0, 10.0, 0.9, -13.0, -136.0, -1676.0, -16903.0]
    found = [f for f in diagnose(_curve(losses)) if f.get("title") == "Loss unbounded below"]
    assert len(found) == 1 and found[0]["steps"] == [8, 9, 10, 11], found
    assert "below zero from step 8, down to -1.69e+04 at step 11" in found[0]["message"]
    assert "sign error" in found[0]["message"] and "recon + kl" in found[0]["fix"]


@pytest.mark.parametrize("losses", [
    [-2.0, -3.0, -5.0, -9.0, -15.0, -30.0, -31.0],  # a density's log-likelihood, negative by design
    [5.0, 4.0, 2.0, 0.5, -0.4, -0.6, -0.5],  # a little below zero: a floor
    [5.0, 3.0, 1.0, -80.0, -2.0, 0.5, 0.4],  # one batch far below, and back
    # meant to go negative from noise around zero (QA 40a): REINFORCE's surrogate with
    # normalised returns, SimSiam's negative cosine (bounded by -1)
    [0.025, -0.056, 0.059, -0.044, 0.039, -0.134, -0.098, -0.206, -0.3, -0.414, -0.41],
    [0.02, 0.028, -0.061, -0.109, -0.136, -0.236, -0.31, -0.394, -0.6, -0.709, -0.7],
    [0.02, 0.05, 0.01, -0.1, -0.2, -0.4, -0.6, -0.7, -0.7],
])
def test_a_loss_with_a_floor_is_not_unbounded(losses: list[float]) -> None:
    assert [f for f in diagnose(_curve(losses)) if f.get("title") == "Loss unbounded below"] == []


def test_a_divergence_the_run_never_recovers_from_is_an_error_naming_its_dead_layers(tmp_path: Path) -> None:
    """A CNN whose learning rate jumps to 50 at step 40: the loss and the gradients blow up
    together, the loss stays far up to the end, and both convolutions get exactly zero gradients
    (their ReLUs off).  The explosion's warning on a few steps was all that was said (QA 37d)."""
    torch.manual_seed(0)

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1)
            self.pool, self.head = nn.MaxPool2d(2), nn.Linear(16 * 3 * 3, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.pool(torch.relu(self.conv1(x)))
            return self.head(self.pool(torch.relu(self.conv2(x))).flatten(1))

    model = CNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x_all, y_all = torch.randn(256, 1, 12, 12, generator=g), torch.randint(0, 10, (256,), generator=g)
    path = tmp_path / "diverged.tscope"
    losses, zero = [], []
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for i in range(100):
            if i == 40:
                for group in opt.param_groups:
                    group["lr"] = 50.0
            idx = torch.randint(0, 256, (32,), generator=g)
            opt.zero_grad()
            loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
            zero.append(model.conv1.weight.grad.abs().sum().item() == 0 and model.conv2.weight.grad.abs().sum().item() == 0)
    # the precondition, from plain PyTorch: up for good, both convolutions dead
    assert min(losses[50:]) > 10 * max(losses[30:40]) and sum(zero[50:]) > 25, (losses, zero)
    found = [dict(f) for f in diagnose(iter_events(path))]
    (div,) = [f for f in found if f.get("title") == "Training diverged"]
    assert div["severity"] == "error" and div["steps"][-1] == 99, div
    msg = div["message"]
    assert "It never recovered" in msg and "got exactly zero gradients on most of those steps" in msg, msg
    assert "where it was. conv1, conv2" in msg, msg  # (then head: its weight reads the dead features, all zeros)


def test_a_blow_up_at_the_second_step_is_found(tmp_path: Path) -> None:
    """Adam at lr=1 on a ReLU MLP: 1.33 at step 0, then 1.4e5 (QA 51b).  The starting level was the
    median of the first three losses -- the blown-up ones themselves -- so no step was ever ten
    times it.  The start is now what came before the jump."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1.0)
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(512, 10, generator=g)
    y_all = torch.sin(x_all[:, :1]) + x_all[:, 1:2]
    path = tmp_path / "adam_lr1.tscope"
    losses = []
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(30):
            idx = torch.randint(0, 512, (64,), generator=g)
            opt.zero_grad()
            loss = F.mse_loss(model(x_all[idx]), y_all[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses[1] > 1e3 * losses[0]  # the jump is at step 1
    found = [dict(f) for f in diagnose(iter_events(path))]
    (p3,) = [f for f in found if f["code"] == "P3" and f["title"] == "Training diverged"]
    assert p3["message"].startswith(f"Training diverged: the loss went from {losses[0]:.3g} at step 0 to "), p3["message"]
    assert "the learning rate 1 then" in p3["message"]
