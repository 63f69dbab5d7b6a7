"""Gradients into nn.Parameters the model does not hold and no optimizer steps: layers kept in a
plain Python list (not nn.ModuleList) are not registered, so the optimizer never trains them.
A GAN's other model, which its own optimizer steps, is not that."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class Stack(nn.Module):
    def __init__(self, registered: bool) -> None:
        super().__init__()
        layers = [nn.Linear(6, 6) for _ in range(2)]
        self.layers = nn.ModuleList(layers) if registered else layers
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def _train(tmp_path: Path, registered: bool, mode: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Stack]:
    torch.manual_seed(0)
    model = Stack(registered)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / f"{registered}-{mode}.tscope"
    g = torch.Generator().manual_seed(1)
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(4):
            x, y = torch.randn(8, 6, generator=g), torch.randint(0, 2, (8,), generator=g)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    events = list(iter_events(path))
    return [dict(f) for f in diagnose(events)], [ev for ev in events if ev["kind"] == "graph"], model


@pytest.mark.parametrize("mode", ["default", "full"])
def test_layers_in_a_plain_list_are_found(tmp_path: Path, mode: str) -> None:
    found, graphs, model = _train(tmp_path, registered=False, mode=mode)
    outside = [p for layer in model.layers for p in layer.parameters()]
    assert len(list(model.parameters())) == 2 and all(p.grad is not None for p in outside)  # plain PyTorch: 4 outside
    marked = [n for n in graphs[0]["nodes"] if n.get("unregistered")]
    assert len(marked) == 4 and all(n["name"] == "AccumulateGrad" and "param" not in n for n in marked)
    (f,) = [f for f in found if f["title"] == "Parameters outside the model"]
    assert f["code"] == "P1" and f["severity"] == "warning"
    assert f["message"].startswith("Gradients flow into 4 nn.Parameter tensors that are not Stack's")
    assert {t["node"] for t in f["targets"]} == {n["id"] for n in marked}


def test_layers_in_a_plain_list_are_found_in_light_mode(tmp_path: Path) -> None:
    """light writes no graph: the capture counts the outside parameters in its own walk of the
    backward's graph (the first step's, and a changed structure's), and the finding is the same."""
    found, graphs, model = _train(tmp_path, registered=False, mode="light")
    assert graphs == []
    (f,) = [f for f in found if f["title"] == "Parameters outside the model"]
    assert f["code"] == "P1" and f["severity"] == "warning"
    # on every step: the capture tells them when they change, not at each step using them ("at
    # step 0" read as the only one, QA 50c)
    assert f["message"].startswith("Gradients flow into 4 nn.Parameter tensors that are not Stack's and that no optimizer steps "
                                   "(since step 0, every step)"), f["message"]
    assert f["targets"] == [{"step": 0, "rank": 0}]


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("registered", [True, False])
def test_light_modes_count_of_outside_parameters(
        tmp_path: Path, registered: bool, native: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The count on the step event: 4 (the list's two layers), and none when they are registered.
    Told once also without the C++ extension (TORCHSCOPE_NATIVE=0), whose cheaper walk key
    walks the graph again at step 1: it said [[4], [4], []]."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", native)
    torch.manual_seed(0)
    model = Stack(registered)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "light.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(model(torch.randn(8, 6)), torch.randint(0, 2, (8,))).backward()
            opt.step()
    steps = [ev for ev in iter_events(path) if ev["kind"] == "step"]
    counts = [[e["count"] for e in ev.get("events", []) if e["what"] == "unregistered_params"] for ev in steps]
    assert counts == ([[], [], []] if registered else [[4], [], []])  # walked once: the structure stays


def test_layers_in_a_module_list_are_no_finding(tmp_path: Path) -> None:
    found, graphs, _ = _train(tmp_path, registered=True, mode="full")
    assert not any(n.get("unregistered") for g in graphs for n in g["nodes"])
    assert [f for f in found if f["severity"] != "info"] == []


def _gan(path: Path, mode: str) -> list[dict[str, Any]]:
    """watch(D): the generator's loss backpropagates through D into G, whose Adam steps it."""
    torch.manual_seed(0)
    G, D = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 6)), nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    opt_g, opt_d = torch.optim.Adam(G.parameters(), 1e-3), torch.optim.Adam(D.parameters(), 1e-3)
    g = torch.Generator().manual_seed(1)
    with torchscope.watch(D, opt_d, server=None, record=path, mode=mode):
        for _ in range(4):
            real, z = torch.randn(8, 6, generator=g), torch.randn(8, 4, generator=g)
            opt_d.zero_grad()
            fake = G(z)
            d_loss = F.softplus(-D(real)).mean() + F.softplus(D(fake.detach())).mean()
            d_loss.backward()
            opt_d.step()
            opt_g.zero_grad()
            F.softplus(-D(fake)).mean().backward()
            opt_g.step()
    return list(iter_events(path))


def _encdec(path: Path, mode: str) -> list[dict[str, Any]]:
    """watch(enc, opt_enc) with the decoder's optimizer stepping right after the encoder's: at
    the end of step 0 (the encoder's step()) the decoder's optimizer had not stepped yet, and
    its parameters were called outside the model -- default mode captures step 0 alone."""
    torch.manual_seed(0)
    enc, dec = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    opt_e, opt_d = torch.optim.Adam(enc.parameters(), 1e-2), torch.optim.SGD(dec.parameters(), 0.05)
    with torchscope.watch(enc, opt_e, server=None, record=path, mode=mode):
        for _ in range(4):
            x = torch.randn(32, 8)
            opt_e.zero_grad()
            opt_d.zero_grad()
            ((dec(enc(x)) - x) ** 2).mean().backward()
            opt_e.step()
            opt_d.step()
    return list(iter_events(path))


def _not_outside(events: list[dict[str, Any]], mode: str) -> None:
    """The other model's parameters were seen in the graph and are no finding: marked nowhere
    (the captured graphs), counted nowhere (light's walk)."""
    graphs = [ev for ev in events if ev["kind"] == "graph"]
    if mode == "light":
        assert graphs == []
        assert not any(e["what"] == "unregistered_params" for ev in events if ev["kind"] == "step"
                       for e in ev.get("events", []))
    else:
        assert graphs and graphs[0]["step"] == 0
        assert any(n["name"] == "AccumulateGrad" and "param" not in n for g in graphs for n in g["nodes"])  # seen
        assert not any(n.get("unregistered") for g in graphs for n in g["nodes"])
    assert [f for f in diagnose(events) if f.get("title") == "Parameters outside the model"] == []
    assert len([e for e in events if e["kind"] == "step"]) == 4


@pytest.mark.parametrize("mode", ["light", "full"])
def test_a_gan_generator_stepped_by_its_own_optimizer_is_not_outside(tmp_path: Path, mode: str) -> None:
    _not_outside(_gan(tmp_path / "gan.tscope", mode), mode)


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_decoder_stepped_after_the_watched_encoder_is_not_outside(tmp_path: Path, mode: str) -> None:
    _not_outside(_encdec(tmp_path / "encdec.tscope", mode), mode)


def test_a_target_network_run_with_autograd_on_is_told_as_a_copy_of_the_model(tmp_path: Path) -> None:
    """A DQN's target network, ``copy.deepcopy(policy)``, run without ``no_grad`` for the
    targets: as many outside parameters as the model has, so the finding leads with a copy of
    the model and its fix with ``no_grad``."""
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    target_net = copy.deepcopy(policy)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    path = tmp_path / "dqn.tscope"
    with torchscope.watch(policy, opt, server=None, record=path):
        for _ in range(6):
            s, a, r, s2 = torch.randn(16, 4), torch.randint(0, 2, (16, 1)), torch.randn(16), torch.randn(16, 4)
            q = policy(s).gather(1, a).squeeze(1)
            target = r + 0.99 * target_net(s2).max(1).values  # the tutorial's no_grad forgotten
            opt.zero_grad()
            F.smooth_l1_loss(q, target).backward()
            opt.step()
    assert all(p.grad is not None for p in target_net.parameters())  # plain PyTorch: the copy got gradients
    (f,) = [dict(f) for f in diagnose(iter_events(path)) if f["title"] == "Parameters outside the model"]
    assert "as many as Sequential has -- a copy of the model" in f["message"], f["message"]
    assert f["fix"].startswith("Run that model (a copy, a teacher) without autograd")


class _Tokens(nn.Module):
    """A learnable class token made a plain tensor that requires grad, not an nn.Parameter."""

    def __init__(self, as_parameter: bool) -> None:
        super().__init__()
        token = torch.zeros(1, 1, 6, requires_grad=True)
        self.cls = nn.Parameter(token) if as_parameter else token
        self.proj = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([self.cls.expand(len(x), 1, 6), x], 1).mean(1))


@pytest.mark.parametrize("mode", ["light", "default"])
@pytest.mark.parametrize("as_parameter", [False, True])
def test_a_module_tensor_that_requires_grad_but_is_no_parameter(tmp_path: Path, mode: str, as_parameter: bool) -> None:
    """`self.cls = torch.zeros(..., requires_grad=True)`: parameters() misses it, the optimizer
    never steps it and its .grad piles up -- told by its name (all modes missed it: QA).  A
    leaf the loop makes (an adversarial input) is no module's and stays unsaid."""
    torch.manual_seed(0)
    model = _Tokens(as_parameter)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    path = tmp_path / f"{mode}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(4):
            x = torch.randn(8, 5, 6, requires_grad=True)  # an input whose gradient the loop reads
            opt.zero_grad()
            F.cross_entropy(model(x), torch.randint(0, 2, (8,))).backward()
            opt.step()
    found = [f for f in diagnose(iter_events(path)) if f.get("title") == "Parameters outside the model"]
    if as_parameter:
        assert found == [] and len(list(model.parameters())) == 3
        return
    assert len(list(model.parameters())) == 2 and model.cls.grad is not None  # plain PyTorch: it got a gradient
    (f,) = found
    assert f["message"].startswith("'cls' of _Tokens is a tensor with requires_grad=True, not an nn.Parameter"), f
    assert f["fix"].startswith("Make it a parameter: self.cls = nn.Parameter(...)")


def test_a_teacher_run_with_autograd_is_told_as_a_second_model(tmp_path: Path) -> None:
    """Distillation with the teacher's forward outside no_grad: its parameters get gradients,
    none of its ops in the student's forward -- a second model, not a submodule kept in a
    plain list (the lead cause the doctor gave: QA)."""
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3)).eval()
    student = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    path = tmp_path / "kd.tscope"
    with torchscope.watch(student, opt, server=None, record=path, mode="default"):
        for _ in range(4):
            x = torch.randn(8, 6)
            soft = F.softmax(teacher(x) / 2, 1)  # the bug: no torch.no_grad()
            opt.zero_grad()
            F.kl_div(F.log_softmax(student(x) / 2, 1), soft, reduction="batchmean").backward()
            opt.step()
    assert all(p.grad is not None for p in teacher.parameters())  # plain PyTorch: the teacher got gradients
    (f,) = [f for f in diagnose(iter_events(path)) if f.get("title") == "Parameters outside the model"]
    assert "used outside Sequential's forward -- a second model (a teacher, a target network) run with autograd on" \
        in f["message"], f["message"]
    assert "used by ops of" not in f["message"] and f["fix"].startswith("Run that model (a copy, a teacher) without autograd")


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_parameter_added_to_the_optimizer_later_is_told_until_then(tmp_path: Path, mode: str) -> None:
    """A temperature outside the model that ``opt.add_param_group`` takes in at step 4 trains
    from then on: the finding keeps to the steps before (QA 46b: every step, "it never trains",
    a structure captured at step 0 told for all the steps of that structure)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    temp = nn.Parameter(torch.ones(()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "added.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for step in range(10):
            if step == 4:
                opt.add_param_group({"params": [temp], "lr": 0.1})
            x, y = torch.randn(16, 10), torch.randint(0, 3, (16,))
            opt.zero_grad()
            F.cross_entropy(model(x) / temp, y).backward()
            opt.step()
    (f,) = [f for f in diagnose(list(iter_events(path))) if f["title"] == "Parameters outside the model"]
    assert f["steps"] == [0, 1, 2, 3], f["steps"]


class _Byol(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.online = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 8))
        self.pred = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pred(self.online(x))


@pytest.mark.parametrize(("mode", "target_first"), [("default", False), ("full", False), ("default", True)])
def test_a_target_encoder_copied_from_a_submodule_is_told_as_such(tmp_path: Path, mode: str, target_first: bool) -> None:
    """BYOL's target network, a deepcopy of the model's encoder called beside the model with
    autograd on: it read "a submodule kept in a plain Python list or dict" first (QA 50a), its ops
    taken for the model's root -- and, called before the model (QA 50c), not recorded at all (a
    step's recording begins at the model's forward)."""
    torch.manual_seed(0)
    model = _Byol()
    target = copy.deepcopy(model.online)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    path = tmp_path / "byol.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(4):
            x = torch.randn(32, 20)
            v1, v2 = x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)
            if target_first:
                z = target(v2)
                loss = 2 - 2 * F.cosine_similarity(model(v1), z, dim=-1).mean()
            else:
                loss = 2 - 2 * F.cosine_similarity(model(v1), target(v2), dim=-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert all(p.grad is not None for p in target.parameters())  # plain PyTorch: the copy got gradients
    (f,) = [f for f in diagnose(list(iter_events(path))) if f["title"] == "Parameters outside the model"]
    assert ("used outside _Byol's forward, as many as its submodule 'online' has -- a copy of it" in f["message"]), f["message"]
    assert f["fix"].startswith("Run that model (a copy, a teacher) without autograd")


class _Twice(nn.Module):
    """Two registered layers and two more in a plain list: as many outside the model as in it."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(6, 6), nn.Linear(6, 2)
        self.layers = [nn.Linear(6, 6), nn.Linear(6, 6)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.out(x)


def test_a_plain_list_as_large_as_the_model_is_not_called_a_copy(tmp_path: Path) -> None:
    """Four parameters outside a model of four: "a copy of the model (a target network ...)" was
    told by the count alone (QA 50c); the captured graph shows them used inside its forward."""
    torch.manual_seed(0)
    model = _Twice()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "twice.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(model(torch.randn(8, 6)), torch.randint(0, 2, (8,))).backward()
            opt.step()
    (f,) = [f for f in diagnose(list(iter_events(path))) if f["title"] == "Parameters outside the model"]
    assert f["message"].startswith("Gradients flow into 4 nn.Parameter tensors that are not _Twice's"), f["message"]
    assert "a submodule kept in a plain Python list or dict is not registered" in f["message"], f["message"]
