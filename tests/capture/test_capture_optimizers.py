"""Which optimizer's steps are the steps: the one passed to ``watch``, else the one that steps
the model's parameters (``watch(model)`` alone), and a new one that replaces it mid-run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)) for _ in range(n)]


def _loop(model: nn.Module, opts: list[Any], batches: list[Any], switch_at: int | None = None) -> list[float]:
    """zero_grad, forward, backward, step of every optimizer in ``opts`` (from ``switch_at`` on:
    a new Adam instead of them)."""
    losses = []
    for i, (x, y) in enumerate(batches):
        if i == switch_at:
            opts = [torch.optim.Adam(model.parameters(), lr=1e-3)]
        for o in opts:
            o.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        for o in opts:
            o.step()
        losses.append(loss.item())
    return losses


def _steps(path: Path) -> list[dict[str, Any]]:
    return [e for e in iter_events(path) if e["kind"] == "step"]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_watch_without_optimizer_follows_the_one_that_steps(
    mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batches = _batches(6)
    plain = _model()
    expected = _loop(plain, [torch.optim.SGD(plain.parameters(), lr=0.1)], batches)
    model = _model()
    with torchscope.watch(model, server=None, record=tmp_path / "run.tscope", mode=mode):
        losses = _loop(model, [torch.optim.SGD(model.parameters(), lr=0.1)], batches)
    assert losses == expected
    assert capsys.readouterr().err.count("following SGD") == 1
    steps = _steps(tmp_path / "run.tscope")
    assert [s["micro_batches"] for s in steps] == [1] * 6  # one step per optimizer step, not one in all
    assert [s["loss"] for s in steps] == pytest.approx(expected)
    assert all(s["lr"] == [0.1] and s["grads"]["norm"][0] is not None for s in steps)


def test_an_optimizer_made_anew_every_epoch_is_said_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``watch(model)`` and an optimizer built anew each epoch: followed each time (the run's log
    says each), said once at the terminal (QA 48a: one line per epoch)."""
    model = _model()
    with torchscope.watch(model, server=None, record=tmp_path / "run.tscope"):
        for _ in range(4):
            _loop(model, [torch.optim.SGD(model.parameters(), lr=0.1)], _batches(2))
    assert capsys.readouterr().err.count("following SGD") == 1
    logs = [e for e in iter_events(tmp_path / "run.tscope") if e["kind"] == "log" and "following SGD" in e["message"]]
    assert len(logs) == 4
    assert len(_steps(tmp_path / "run.tscope")) == 8


def test_a_new_optimizer_mid_run_is_followed(tmp_path: Path) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchscope.watch(model, opt, server=None, record=tmp_path / "run.tscope"):
        _loop(model, [opt], _batches(10), switch_at=5)
    steps = _steps(tmp_path / "run.tscope")
    assert [s["micro_batches"] for s in steps] == [1] * 10
    assert [s["lr"] for s in steps] == [[0.1]] * 5 + [[0.001]] * 5


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_replacing_optimizers_first_step_has_the_gradients(mode: str, tmp_path: Path) -> None:
    """Two-stage fine-tuning: the backbone unfrozen at step 4 and a new optimizer built, the first
    one kept alive by its scheduler.  The new one's first step is told from a second optimizer
    only at the next forward, after the loop's zero_grad(): its statistics are still the
    gradients its step() found (they were all missing; found by QA)."""
    model = _model()
    model[0].requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    first_stage = (opt, sched)  # kept, as a loop's first-stage variables are
    seen = []
    with torchscope.watch(model, opt, server=None, record=tmp_path / "run.tscope", mode=mode):
        for i, (x, y) in enumerate(_batches(7)):
            if i == 4:
                model.requires_grad_(True)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
                sched = torch.optim.lr_scheduler.StepLR(opt, 2)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            seen.append([None if p.grad is None else p.grad.double().norm().item() for p in model.parameters()])
            opt.step()
            sched.step()
    steps = _steps(tmp_path / "run.tscope")
    assert [s["step"] for s in steps] == list(range(7))
    for s, norms in zip(steps, seen, strict=True):
        assert s["grads"]["none"] == []
        assert s["grads"]["norm"] == [None if n is None else pytest.approx(n, rel=1e-5) for n in norms], s["step"]
    assert seen[4][0] is not None  # the unfrozen backbone's first gradient is in step 4's statistics
    assert first_stage[0] is not opt


def test_two_optimizers_of_one_model_in_one_loop(tmp_path: Path) -> None:
    """Two optimizers each stepping part of the model every iteration: the watched one ends the
    steps, the other is not taken for its replacement."""
    model = _model()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.SGD(model[2].parameters(), lr=0.2)
    with torchscope.watch(model, first, server=None, record=tmp_path / "run.tscope"):
        _loop(model, [second, first], _batches(6))  # the other one steps first
    steps = _steps(tmp_path / "run.tscope")
    assert [s["micro_batches"] for s in steps] == [1] * 6
    assert all(s["lr"] == [0.1] for s in steps)


def test_a_second_optimizer_with_its_own_backward_is_no_replacement(tmp_path: Path) -> None:
    """A GAN-like loop: the watched optimizer's backward and step, then another optimizer's
    backward and step of other parameters, every iteration. The other one's step is followed by
    the next forward and no step of the watched one -- as a replacement's would be -- but it
    steps none of the watched one's parameters: the steps stay the watched one's, each with
    both backwards."""
    model = _model()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.SGD(model[2].parameters(), lr=0.2)
    with torchscope.watch(model, first, server=None, record=tmp_path / "run.tscope"):
        for x, y in _batches(6):
            for opt in (first, second):
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
    steps = _steps(tmp_path / "run.tscope")
    # the first step has the watched one's backward alone; the second's last backward, after
    # the watched one's last step, is no step (a trailing backward left unapplied by it)
    assert [s["micro_batches"] for s in steps] == [1] + [2] * 5
    assert all(s["lr"] == [0.1] for s in steps)


def test_a_replacement_of_other_parameters_is_followed_from_its_second_step(tmp_path: Path) -> None:
    """A second phase whose optimizer steps other parameters than the first phase's (the head,
    then the body): taken for a second optimizer of the loop at its first step, it is followed
    once it stepped twice with no step of the watched one between."""
    model = _model()
    first = torch.optim.SGD(model[2].parameters(), lr=0.1)
    second = torch.optim.SGD(model[0].parameters(), lr=0.2)
    with torchscope.watch(model, first, server=None, record=tmp_path / "run.tscope"):
        for i, (x, y) in enumerate(_batches(8)):
            opt = first if i < 4 else second
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    steps = _steps(tmp_path / "run.tscope")
    assert [s["micro_batches"] for s in steps] == [1] * 4 + [2, 1, 1]
    assert [s["lr"] for s in steps] == [[0.1]] * 4 + [[0.2]] * 3


def test_manual_steps_are_not_doubled(tmp_path: Path) -> None:
    """``watch(model)`` with ``watch.step()`` in the loop (before or after ``optimizer.step()``):
    the loop's own boundaries are the steps, one per iteration."""
    for order in ("before", "after"):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        path = tmp_path / f"{order}.tscope"
        with torchscope.watch(model, server=None, record=path) as w:
            for x, y in _batches(5):
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                if order == "before":
                    w.step()
                opt.step()
                if order == "after":
                    w.step()
        assert [s["micro_batches"] for s in _steps(path)] == [1] * 5, order


class _Hookless:
    """An optimizer that is not a ``torch.optim.Optimizer``: no step hooks to end steps."""

    def __init__(self, params: Any, lr: float) -> None:
        self.params, self.lr = list(params), lr

    def step(self) -> None:
        with torch.no_grad():
            for p in self.params:
                p -= self.lr * p.grad

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def _update_by_hand(model: nn.Module, how: str) -> None:
    if how == "no_grad":  # torch.no_grad(): p -= lr * p.grad, then clear the gradient
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
                p.grad.zero_()
    else:  # the tutorials' p.data.sub_(...): .data has a version counter of its own
        for p in model.parameters():
            p.data.sub_(p.grad.data * 0.1)
            p.grad = None


@pytest.mark.parametrize("mode", ["light", "full"])
@pytest.mark.parametrize("how", ["no_grad", "data", "accumulate", "hookless"])
def test_updates_without_a_torch_optimizer_end_steps(mode: str, how: str, tmp_path: Path) -> None:
    """A hand-written update (no optimizer at all) or an optimizer without step hooks: a step
    ends at the next forward after the parameters changed, whether their version counters
    moved or the loop went through ``.data``; gradient statistics are those the update used
    (read after the backward, before the loop clears them), so clearing them is not a
    misplaced zero_grad (P5) and the backwards of separate updates are not accumulation (P15)."""
    from torchscope.doctor import diagnose

    per_step = 2 if how == "accumulate" else 1
    batches = _batches(4 * per_step)

    def train(model: nn.Module, opt: Any) -> tuple[list[float], list[list[float]]]:
        losses, norms = [], []
        for k, (x, y) in enumerate(batches):
            loss = nn.functional.mse_loss(model(x), y) / per_step
            loss.backward()
            losses.append(loss.item())
            if (k + 1) % per_step:
                continue
            norms.append([p.grad.norm().item() for p in model.parameters()])
            if opt is not None:
                opt.step()
                opt.zero_grad()
            else:
                _update_by_hand(model, "no_grad" if how == "accumulate" else how)
        return losses, norms

    plain = _model()
    expected, expected_norms = train(plain, _Hookless(plain.parameters(), 0.1) if how == "hookless" else None)
    model = _model()
    opt = _Hookless(model.parameters(), 0.1) if how == "hookless" else None
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        losses, norms = train(model, opt)
    assert losses == expected and norms == expected_norms
    steps = _steps(path)
    assert [s["micro_batches"] for s in steps] == [per_step] * 4
    for st, expected_step in zip(steps, norms, strict=True):
        assert st["grads"]["norm"] == pytest.approx(expected_step, rel=1e-5)
    codes = {f["code"] for f in diagnose(iter_events(path))}
    assert not codes & {"P5", "P15"}


class _LoRA(nn.Module):
    """A frozen linear layer plus a trainable low-rank update, as PEFT injects them."""

    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.base = base
        self.A = nn.Linear(base.in_features, rank, bias=False)
        self.B = nn.Linear(rank, base.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.B(self.A(x))


@pytest.mark.parametrize("when", ["watch_model_then_add", "watch_with_optimizer_then_add", "add_then_watch"])
def test_adapters_added_after_watch(when: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Adapters added to a frozen model after ``watch()``: the optimizer that trains them ends
    the steps (it holds none of the parameters known at watch time -- before, ``watch(model)``
    never followed it and the run was one step), and the user is told once that their
    gradients are not in the statistics.  Watched after adding them: no notice."""
    model = _model()
    path = tmp_path / "run.tscope"

    def add_adapters() -> torch.optim.Optimizer:
        model.requires_grad_(False)
        model[0] = _LoRA(model[0])  # type: ignore[arg-type]
        return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)

    if when == "add_then_watch":
        opt = add_adapters()
        watch = torchscope.watch(model, server=None, record=path)
    elif when == "watch_with_optimizer_then_add":
        # the watched optimizer gets the adapters as a new param group
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        watch = torchscope.watch(model, opt, server=None, record=path)
        model.requires_grad_(False)
        model[0] = _LoRA(model[0])  # type: ignore[arg-type]
        opt.add_param_group({"params": [p for p in model.parameters() if p.requires_grad]})
    else:
        watch = torchscope.watch(model, server=None, record=path)
        opt = add_adapters()
    with watch:
        for x, y in _batches(5):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    err = capsys.readouterr().err
    steps = _steps(path)
    assert [s["step"] for s in steps] == [0, 1, 2, 3, 4]
    told = [e for e in iter_events(path) if e["kind"] == "log" and "after watch()" in e["message"]]
    if when == "add_then_watch":
        assert not told and "after watch()" not in err
    else:
        assert len(told) == 1 and err.count("after watch()") == 1
        assert "0.A.weight" in told[0]["message"] and told[0]["level"] == "warning"


def _gan(path: Path, fix: str, mode: str = "light") -> list[float]:
    """A GAN, its generator watched: ``fix`` '' (the bug: D's loss reads G's output undetached,
    zero_grad of both at the loop's top), 'detach' or 'zero_grad' (G's, right before its backward)."""
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    disc = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g, opt_d = torch.optim.Adam(gen.parameters(), 2e-3), torch.optim.Adam(disc.parameters(), 2e-3)
    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(1)
    losses = []
    with torchscope.watch(gen, opt_g, server=None, record=path, mode=mode):
        for _ in range(6):
            opt_g.zero_grad()
            opt_d.zero_grad()
            real = torch.randn(32, 2, generator=g) + 2.0
            fake = gen(torch.randn(32, 8, generator=g))
            seen = fake.detach() if fix == "detach" else fake
            d_loss = bce(disc(real), torch.ones(32, 1)) + bce(disc(seen), torch.zeros(32, 1))
            d_loss.backward(retain_graph=True)
            opt_d.step()
            if fix == "zero_grad":
                opt_g.zero_grad()
            g_loss = bce(disc(fake), torch.ones(32, 1))
            g_loss.backward()
            opt_g.step()
            losses.append(g_loss.item())
    return losses


@pytest.mark.parametrize("fix", ["", "detach", "zero_grad"])
def test_a_generator_trained_on_the_discriminators_loss_is_p5(fix: str, tmp_path: Path) -> None:
    """The discriminator's optimizer stepping between two backward passes into the generator's
    .grad is recorded (``other_step``); with both passes kept (no detach, no zero_grad between),
    the generator's step used the discriminator loss's gradients: a P5 error at that loss's line."""
    from torchscope.doctor import diagnose

    _gan(tmp_path / "g.tscope", fix)
    events = list(iter_events(tmp_path / "g.tscope"))
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 6
    crossed = [f for f in diagnose(events) if f["code"] == "P5"]
    if fix:
        assert crossed == []
        assert all(s["accumulated"] == 1 for s in steps)
        return
    assert all(s["accumulated"] == 2 and {"what": "other_step", "micro": 1, "optimizer": "Adam"} in s["events"] for s in steps)
    (f,) = crossed
    line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if "d_loss.backward(retain_graph=True)" in t)
    assert f["title"] == "Gradients of another optimizer's loss" and f["steps"] == list(range(6))
    assert f["src"] == f"test_capture_optimizers.py:{line}" and "D(fake.detach())" in f["fix"]
    assert f["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]  # the generator's: the gradients view shows them


@pytest.mark.parametrize("mode", ["default", "full"])
def test_the_discriminators_backward_and_step_are_no_forward_ops_of_the_generator(mode: str, tmp_path: Path) -> None:
    """Between the generator's forward and its backward, the discriminator's backward (its loss
    on detached fakes reaches no generator parameter) and its optimizer's step run: their kernels
    were recorded as forward ops outside the model (QA: 127 of a step's 132 ops, Adam's
    ``lerp_``/``addcdiv_`` and ``leaky_relu_backward`` among them).  The discriminator's forward
    on the fakes, on the path to the generator's loss, stays."""
    _gan(tmp_path / "g.tscope", "detach", mode)
    graph = next(e for e in iter_events(tmp_path / "g.tscope") if e["kind"] == "graph")
    forward = [op for op in graph["ops"] if op["phase"] == "forward"]
    names = [op["name"] for op in forward]
    assert not [n for n in names if "backward" in n or n.split("::")[-1] in ("lerp_", "addcdiv_", "addcmul_", "sqrt")], names
    # what ran: the generator's two Linear layers, then the discriminator's three forwards
    # (real, detached fakes, fakes) of two Linear layers each, outside the model
    in_model = [op for op in forward if "outside_model" not in op.get("flags", [])]
    assert sorted({op["module"] for op in in_model if op["name"] == "aten::addmm"}) == ["0", "2"]
    outside = [op for op in forward if "outside_model" in op.get("flags", []) and op["name"] == "aten::addmm"]
    assert len(outside) == 6, [op["name"] for op in forward]


@pytest.mark.parametrize("given", [True, False])
def test_a_module_added_mid_run_with_add_param_group_is_told(given: bool, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A head added to the watched model after a few steps, its parameters given to the
    optimizer with ``add_param_group``: its gradients are not in the statistics (their columns
    follow the session's parameter list), and the user is told so once (was: nothing said)."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt if given else None, server=None, record=path):
        for i, (x, y) in enumerate(_batches(6)):
            if i == 3:
                model.append(nn.Linear(1, 1))
                opt.add_param_group({"params": list(model[3].parameters())})
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    told = [e["message"] for e in iter_events(path) if e["kind"] == "log" and "after watch()" in e["message"]]
    assert len(told) == 1 and "(3.weight, 3.bias)" in told[0], told
    assert capsys.readouterr().err.count("after watch()") == 1
    assert [s["step"] for s in _steps(path)] == list(range(6))


class _SparseModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5000, 32, sparse=True)
        self.fc = nn.Linear(32, 2)

    def forward(self, i: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(i).mean(1))


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(st.nbytes() for st in {t.untyped_storage().data_ptr(): t.untyped_storage() for t in tensors}.values())


@pytest.mark.parametrize("mode", ["light", "default"])
def test_sparse_gradients_and_a_second_optimizers_state_are_in_the_memory(mode: str, tmp_path: Path) -> None:
    """An ``Embedding(sparse=True)`` trained by a SparseAdam beside the watched Adam of the rest:
    its sparse gradient (indices and values) is in ``memory.grads`` and the SparseAdam's state in
    ``memory.optimizer`` (both were left out; found by QA)."""
    torch.manual_seed(0)
    model = _SparseModel()
    sparse = torch.optim.SparseAdam(list(model.emb.parameters()), lr=1e-2)
    dense = torch.optim.Adam(model.fc.parameters(), lr=1e-2)
    grads, state = [], []
    with torchscope.watch(model, dense, server=None, record=tmp_path / "run.tscope", mode=mode):
        for _ in range(4):
            sparse.zero_grad()
            dense.zero_grad()
            model(torch.randint(0, 5000, (8, 5))).pow(2).mean().backward()
            g = model.emb.weight.grad
            assert g is not None and g.layout == torch.sparse_coo
            grads.append(_storage_bytes([g._indices(), g._values(), *(p.grad for p in model.fc.parameters())]))
            sparse.step()
            dense.step()
            state.append(_storage_bytes([t for o in (sparse, dense) for v in o.state.values() for t in v.values()
                                         if isinstance(t, torch.Tensor)]))
    mem = [s["memory"] for s in _steps(tmp_path / "run.tscope")]
    assert [m["grads"] for m in mem] == grads
    assert [m["optimizer"] for m in mem] == state and state[0] > 5000 * 32 * 4 * 2  # both of SparseAdam's moments


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("forget", [False, True])
def test_a_frozen_backbones_old_gradients_are_no_missing_zero_grad(tmp_path: Path, native: bool, forget: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Fine-tuning in phases: the backbone frozen (``requires_grad_(False)``) and the optimizer
    rebuilt over the head alone keeps the backbone's last gradients -- no backward adds to
    them, nothing steps them: no P5.  The head's own zero_grad forgotten still is one."""
    from torchscope import _native

    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, _native._error
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / "phases.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for step in range(12):
            if step == 4:  # phase 2: the head alone
                model[0].requires_grad_(False)
                opt = torch.optim.Adam(model[2].parameters(), lr=1e-3)
            if not (forget and step >= 4):
                opt.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(16, 10)), torch.randint(0, 3, (16,))).backward()
            opt.step()
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert model[0].weight.grad is not None and model[0].weight.grad.abs().sum() > 0  # still there
    assert all(0 not in e["grads"]["pre_nonzero"] and 1 not in e["grads"]["pre_nonzero"] for e in steps)
    p5 = [f for f in diagnose(iter_events(path)) if f["code"] == "P5" and f["severity"] != "info"]
    if forget:
        assert p5 and set(p5[0]["params"]) >= {"2.weight", "2.bias"}, p5
    else:
        assert p5 == []


def test_a_sweep_of_runs_never_closed_keeps_each_run_to_its_own(tmp_path: Path) -> None:
    """Each run of a sweep a function that watches its own model and returns without close():
    the model dies with the function, and its watch used to stay active -- its hooks saw the
    next runs' steps (false warnings into its file: "steps none of Sequential's parameters")
    and its mode stayed on their stack (ops they never ran in their graphs)."""

    def run(k: int) -> None:
        torch.manual_seed(k)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        torchscope.watch(model, opt, server=None, record=tmp_path / f"run{k}.tscope", mode="full")
        for _ in range(6):
            opt.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(8, 8)), torch.randint(0, 2, (8,))).backward()
            opt.step()

    for k in range(3):
        run(k)
    torchscope.watch(nn.Linear(2, 2), server=None, record=tmp_path / "last.tscope").close()
    ops = []
    for k in range(3):
        events = list(iter_events(tmp_path / f"run{k}.tscope"))
        assert sum(e["kind"] == "step" for e in events) == 6
        assert [e["message"] for e in events if e["kind"] == "log"] == []
        assert [e["status"] for e in events if e["kind"] == "end"] == ["finished"]
        ops.append([o["name"] for g in events if g["kind"] == "graph" for o in g["ops"]])
    assert ops[1] == ops[0] and ops[2] == ops[0]  # no op of an earlier run's watch in a later run's graphs


class _SAM(torch.optim.Optimizer):
    """davda54/sam's wrapper, abridged: its ``step(closure)`` climbs to the sharpest nearby
    weights, runs the closure's forward and backward there, and steps the base optimizer."""

    def __init__(self, params: Any, rho: float = 0.05, **kw: Any) -> None:
        super().__init__(params, {"rho": rho, **kw})
        self.base_optimizer = torch.optim.SGD(self.param_groups, **kw)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        scale = self.param_groups[0]["rho"] / (torch.stack([g.norm() for g in grads]).norm() + 1e-12)
        old = {}
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    old[p] = p.detach().clone()
                    p.add_(p.grad * scale)
        self.zero_grad()
        with torch.enable_grad():
            closure()
        for p, w in old.items():
            p.copy_(w)
        self.base_optimizer.step()


@pytest.mark.parametrize("watched", ["sam", "base"])
def test_a_wrapper_whose_step_runs_a_closure_makes_one_step_a_batch(watched: str, tmp_path: Path) -> None:
    """Watching SAM's base optimizer: SAM's own step() of the same parameters ran the closure's
    forward before the base stepped, and was adopted there as the watched one's replacement,
    making the first batch two steps (QA 44e: 61 steps for 60)."""
    model = _model()
    sam = _SAM(model.parameters(), lr=0.05, momentum=0.9)
    path = tmp_path / f"{watched}.tscope"
    with torchscope.watch(model, sam if watched == "sam" else sam.base_optimizer, server=None, record=path):
        for x, y in _batches(5):

            def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss

            nn.functional.mse_loss(model(x), y).backward()
            sam.step(closure)
            sam.zero_grad()
    steps = _steps(path)
    assert [s["micro_batches"] for s in steps] == [2] * 5, [(s["step"], s["micro_batches"]) for s in steps]
