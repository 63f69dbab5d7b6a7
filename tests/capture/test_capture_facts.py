"""The in-process facts the doctor judges (docs/pitfalls.md, P1-P15), each on a small reproducer,
and their absence on a clean loop."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from capture_models import Square, grad_fn_nodes
from torch import nn

import torchscope
from torchscope import _native
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))


def _steps(path: Path) -> list[dict[str, Any]]:
    return [e for e in iter_events(path) if e["kind"] == "step"]


Trained = tuple[list[float], list[torch.Tensor]]


def _unchanged(train: Callable[[Path | None], Trained], path: Path) -> None:
    """``train(None)`` (plain) and ``train(path)`` (watched, recording to ``path``): the same
    losses and parameters, bit for bit."""
    plain, plain_params = train(None)
    watched, watched_params = train(path)
    assert watched == plain and all(torch.equal(a, b) for a, b in zip(plain_params, watched_params, strict=True))


def _train_step(model: nn.Module, opt: Any, x: torch.Tensor) -> float:
    """zero_grad, forward, a squared-output loss, backward, step: the loss."""
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    return float(loss.item())


def _run(tmp_path: Path, body: Any, steps: int = 3, **kw: Any) -> list[dict[str, Any]]:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path, **kw):
        state: dict[str, Any] = {}
        for i in range(steps):
            body(model, opt, i, state)
    return _steps(path)


def _clean_run(model: nn.Module, path: Path, steps: int) -> list[dict[str, Any]]:
    """``steps`` clean steps of ``model`` (SGD), watched and recorded to ``path``: its step events."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchscope.watch(model, opt, server=None, record=path):
        for i in range(steps):
            _clean(model, opt, i, {})
    return _steps(path)


def _clean(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_clean_loop_has_no_pitfall_facts(tmp_path: Path) -> None:
    for st in _steps_of(tmp_path, _clean):
        assert st["micro_batches"] == 1 and st["zero_grad"] == 1
        assert st["grads"]["pre_nonzero"] == [] and st["grads"]["none"] == []
        assert st["no_backward_forwards"] == 0 and st["graphs_alive"] == 0
        assert st["backward_errors"] == [] and st["hooks"] == {} and st["modes"] == {}
        assert st["forwards"][0]["built_graph"] and st["forwards"][0]["backward"]
        assert st["forwards"][0]["eval_modules"] == []
        assert "events" not in st
        assert st["backward_roots"] == ["MeanBackward0"]
        assert st["backward_src"][0].startswith("test_capture_facts.py:")
        assert st["step_src"].startswith("test_capture_facts.py:")
        assert st.get("copies", {"count": 0, "bytes": 0}) == {"count": 0, "bytes": 0}
        assert st["memory"]["saved"] > 0 and st["lr"] == [0.01]


def _steps_of(tmp_path: Path, body: Any, **kw: Any) -> list[dict[str, Any]]:
    return _run(tmp_path, body, **kw)


def test_p5_missing_zero_grad(tmp_path: Path) -> None:
    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()  # no zero_grad: gradients pile up
        opt.step()

    steps = _steps_of(tmp_path, body)
    assert steps[0]["grads"]["pre_nonzero"] == []
    for st in steps[1:]:
        assert st["zero_grad"] == 0
        assert st["grads"]["pre_nonzero"] == [0, 1, 2, 3]


def test_p15_accumulation_counts_micro_batches(tmp_path: Path) -> None:
    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        opt.zero_grad()
        for _ in range(4):
            loss = model(torch.randn(4, 8)).pow(2).sum()  # not divided by 4
            loss.backward()
        opt.step()

    for st in _steps_of(tmp_path, body):
        assert st["micro_batches"] == 4 and len(st["losses"]) == 4
        assert st["backward_roots"] == ["SumBackward0"] * 4
        assert st["zero_grad"] == 1 and st["grads"]["pre_nonzero"] == []
        assert len(st["forwards"]) == 4 and all(f["backward"] for f in st["forwards"])


def test_p6_eval_forward_builds_unused_graph(tmp_path: Path) -> None:
    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        _clean(model, opt, i, state)
        model.eval()
        model(torch.randn(64, 8))  # evaluation without no_grad
        model.train()

    steps = _steps_of(tmp_path, body)
    # the eval forward happens after the step boundary: it belongs to the next step
    for st in steps[1:]:
        ev = [f for f in st["forwards"] if not f["training"]]
        assert len(ev) == 1 and ev[0]["built_graph"] and not ev[0]["backward"]
        assert ev[0]["saved_bytes"] > 0
        assert st["no_backward_forwards"] == 1


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("mode", ["light", "default"])
def test_forwards_a_backward_reached(tmp_path: Path, mode: str, native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a backward reached a forward's output: a C++ hook on its node with the
    extension, a Python one without -- the same facts either way, for micro-batches (each
    reached by its own backward) and an evaluation forward no backward reaches."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, _native._error

    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        opt.zero_grad()
        for _ in range(2):
            model(torch.randn(4, 8)).pow(2).sum().backward()
        opt.step()
        model.eval()
        model(torch.randn(8, 8))  # no backward: the next step's, unreached
        model.train()

    steps = _steps_of(tmp_path, body, steps=4, mode=mode)
    assert [f["backward"] for f in steps[0]["forwards"]] == [True, True]
    for st in steps[1:]:
        assert [f["backward"] for f in st["forwards"]] == [False, True, True]
        assert st["no_backward_forwards"] == 1


class _EmbedAndClassify(nn.Module):
    """Returns (a normalised embedding, logits): the loss uses the logits, the embedding goes
    detached into a memory bank (contrastive learning's usual shape)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.emb, self.cls = nn.Linear(16, 4), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return nn.functional.normalize(self.emb(h), dim=1), self.cls(h)


@pytest.mark.parametrize("native", [True, False])
def test_a_backward_through_any_output_uses_the_forward(
        tmp_path: Path, native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward whose loss is built from its second output alone was used by backward: no
    "graph built but never used" (P6) for it."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, _native._error
    model = _EmbedAndClassify()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / "run.tscope"
    bank = []
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(4):
            emb, logits = model(torch.randn(8, 8))
            bank.append(emb.detach())
            loss = nn.functional.cross_entropy(logits, torch.randint(0, 3, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    steps = _steps(path)
    assert all(st["forwards"][0]["backward"] and st["no_backward_forwards"] == 0 for st in steps)
    assert "P6" not in {f["code"] for f in diagnose(list(iter_events(path)))}


def _line_of(code: str) -> int:
    """The line of this file whose code starts with ``code`` (there must be one)."""
    lines = [i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if line.strip().startswith(code)]
    assert len(lines) == 1, (code, lines)
    return lines[0]


@pytest.mark.parametrize("native", [True, False])
def test_a_forward_used_by_the_next_steps_backward_is_used(
        tmp_path: Path, native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GAN watched whole, its steps the critic's: the generator's output is made before the
    critic's optimizer.step() ends the step and used by the generator's backward after it. The
    next step's event says so (``late_backward``) and that forward is no P6; a metrics forward
    of the generator that nothing uses still is."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, _native._error
    torch.manual_seed(0)
    gen, disc = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    gan = nn.ModuleDict({"G": gen, "D": disc})
    opt_g, opt_d = torch.optim.SGD(gen.parameters(), 1e-2), torch.optim.SGD(disc.parameters(), 1e-2)
    path = tmp_path / "gan.tscope"
    with torchscope.watch(gan, opt_d, server=None, record=path, mode="light"):
        for i in range(6):
            fake = gen(torch.randn(8, 4))
            opt_d.zero_grad()
            (disc(fake.detach()) - disc(torch.randn(8, 2))).mean().backward()
            opt_d.step()
            opt_g.zero_grad()
            (-disc(fake)).mean().backward()
            opt_g.step()
            if i == 3:
                gen(torch.randn(8, 4)).std()  # a metric, without torch.no_grad()
    steps = _steps(path)
    src = {st["step"]: [f["src"] for f in st["forwards"]] for st in steps}
    gen_line = next(s for s in src[2] if s.endswith(f":{_line_of('fake = gen(torch.randn(8, 4))')}"))
    # from step 1 on (the direct calls seen at step 0), each step's generator forward is used
    # by the next step's backward; the metric forward (after step 3's last backward: step 4's
    # first forward) is used by none
    late = {st["step"]: st.get("late_backward", []) for st in steps}
    expected = {st["step"]: [[st["step"] - 1, src[st["step"] - 1].index(gen_line)]] for st in steps if st["step"] >= 2}
    assert {k: v for k, v in late.items() if k >= 2} == expected
    # the last step's, used by the generator's backward after it, in no step: the end event says it
    (end,) = [e for e in iter_events(path) if e["kind"] == "end"]
    assert end["late_backward"] == [[5, src[5].index(gen_line)]]
    findings = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P6"]
    assert len(findings) == 1 and findings[0]["data"]["forwards"] == 1, findings
    assert findings[0]["src"].endswith(f":{_line_of('gen(torch.randn(8, 4)).std()')}")


class _GAN(nn.Module):
    """A container with no forward of its own: the loop calls its two networks."""

    def __init__(self) -> None:
        super().__init__()
        self.G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
        self.D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))


def test_the_last_steps_generator_forward_is_no_skipped_batch(tmp_path: Path) -> None:
    """A GAN watched through its container, the discriminator called on real data first: the
    last step's generator forward, used by the generator's backward after the critic's last
    step, read as "Batches skipped before backward" at the last step; and its graph kept from one
    step to the next (used there), none at the first two boundaries, as a graph piling up over
    a short run (QA 48b: P7 "+6 per step" over 6 steps)."""
    torch.manual_seed(0)
    gan = _GAN()
    opt_g, opt_d = torch.optim.Adam(gan.G.parameters(), 2e-4), torch.optim.Adam(gan.D.parameters(), 2e-4)
    bce = nn.functional.binary_cross_entropy_with_logits
    path = tmp_path / "gan.tscope"
    with torchscope.watch(gan, opt_d, server=None, record=path, mode="default", sample_every=1):
        for _ in range(6):
            fake = gan.G(torch.randn(16, 8))
            d_loss = bce(gan.D(torch.randn(16, 2) + 2), torch.ones(16, 1)) + bce(gan.D(fake.detach()), torch.zeros(16, 1))
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            g_loss = bce(gan.D(fake), torch.ones(16, 1))  # held till the next iteration: its graph too
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
    events = list(iter_events(path))
    assert [e for e in events if e["kind"] == "end"][0].get("late_backward")
    alive = [e["graphs_alive"] for e in events if e["kind"] == "step"]
    assert alive[:2] == [0, 0] and len(set(alive[2:])) == 1 and alive[2] > 0, alive  # the premise: steady
    assert [f for f in diagnose(events) if f["code"] in ("P6", "P7")] == []


def test_compiled_autograd_backward_reaches_the_forward(tmp_path: Path) -> None:
    """Under compiled autograd the node hooks are not run but collected: a forward whose graph
    it runs counts as reached (no false P6)."""
    import torch._dynamo.compiled_autograd as compiled_autograd

    assert _native.get(block=True) is not None, _native._error

    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        with compiled_autograd._enable(lambda gm: torch.compile(gm, backend="eager")):
            loss.backward()
        opt.step()

    for st in _steps_of(tmp_path, body, mode="light"):
        assert st["forwards"][0]["backward"] and st["no_backward_forwards"] == 0


def test_p11_module_left_in_eval(tmp_path: Path) -> None:
    def body(model: nn.Sequential, opt: Any, i: int, state: dict[str, Any]) -> None:
        model[2].eval()  # dropout left in eval while training
        _clean(model, opt, i, state)

    for st in _steps_of(tmp_path, body):
        assert st["forwards"][0]["eval_modules"] == ["2"]
        assert st["modes"] == {"2": False} and st["training"] is True


def test_p11_module_put_in_eval_by_the_forward_itself(tmp_path: Path) -> None:
    """``self.encoder.eval()`` inside forward, undone by the loop's ``model.train()`` before the
    next one: seen at the forward's end on the steps the modes are read (every 10th)."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5))
            self.head = nn.Linear(16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.encoder.eval()
            return self.head(self.encoder(x))

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "late-eval.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(12):
            model.train()
            _train_step(model, opt, torch.randn(4, 8))
    seen = {st["step"]: st["forwards"][0]["eval_modules"] for st in _steps(path)}
    assert seen[0] == seen[10] == ["encoder", "encoder.0", "encoder.1"]
    assert all(seen[i] == [] for i in range(1, 10))  # read at the forward's start: all training


def test_p11_dropout_in_train_mode_under_no_grad(tmp_path: Path) -> None:
    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        _clean(model, opt, i, state)
        with torch.no_grad():
            model(torch.randn(4, 8))  # "evaluation" with dropout still in train mode

    st = _steps_of(tmp_path, body)[1]
    nog = [f for f in st["forwards"] if not f["grad_mode"]]
    assert nog and nog[0]["train_modules"] == ["2"] and not nog[0]["built_graph"]


def test_p11_an_evaluation_after_the_last_step_is_kept(tmp_path: Path) -> None:
    """Forwards after the last optimizer step belong to no step: the end event keeps them, and
    the doctor finds the evaluation run with dropout in train mode."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "eval_after.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for i in range(3):
            _clean(model, opt, i, {})
        with torch.no_grad():  # the final evaluation, dropout still in train mode
            model(torch.randn(4, 8))
    events = list(iter_events(path))
    assert [e["kind"] for e in events].count("step") == 3
    (trailing,) = events[-1]["forwards"]
    assert trailing["grad_mode"] is False and trailing["train_modules"] == ["2"]
    (p11,) = [f for f in diagnose(events) if f["code"] == "P11"]
    assert p11["modules"] == ["2"] and p11["steps"] == [2] and p11["data"]["mode"] == "train"


def test_p7_graph_kept_alive(tmp_path: Path) -> None:
    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        state["total"] = state.get("total", 0) + loss  # keeps every step's graph

    steps = _run(tmp_path, body, steps=4)
    alive = [st["graphs_alive"] for st in steps]
    assert alive[0] == 0 and alive[1] > 0 and alive[1] < alive[2] < alive[3]
    # what the latest kept graph hangs from: the loss of the previous step, at its backward
    assert "graphs_kept" not in steps[0]
    assert [(st["graphs_kept"]["of"], st["graphs_kept"]["step"]) for st in steps[1:]] == [("loss", 0), ("loss", 1), ("loss", 2)]
    assert _line(steps[3]["graphs_kept"]["src"]).strip() == "loss.backward()"


def _interior(roots: list[Any]) -> int:
    """Distinct autograd nodes below ``roots`` but their parameters' AccumulateGrad (an
    independent walk of grad_fn.next_functions)."""
    return sum(1 for n in grad_fn_nodes(roots) if type(n).__name__ != "AccumulateGrad")


def test_p7_counts_the_kept_graphs_nodes_once(tmp_path: Path) -> None:
    """``running_loss += loss`` over two micro-batches a step keeps every loss's graph: the nodes
    alive at a boundary are those of the earlier steps' losses, each counted once -- not each
    parameter's AccumulateGrad again for every micro-batch graph that reaches it."""
    kept: list[list[torch.Tensor]] = []

    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        opt.zero_grad()
        kept.append([])
        for _ in range(2):
            loss = model(torch.randn(4, 8)).pow(2).mean() / 2
            loss.backward()
            state["total"] = state.get("total", 0) + loss
            kept[-1].append(loss)
        opt.step()

    steps = _run(tmp_path, body, steps=4)
    alive = [st["graphs_alive"] for st in steps]
    want = [_interior([loss.grad_fn for earlier in kept[:i] for loss in earlier]) for i in range(4)]
    assert want[1] > 0 and alive == want


def _line(src: str) -> str:
    """The source line a ``file:line`` of this test file names."""
    name, _, line = src.rpartition(":")
    assert name == Path(__file__).name
    return Path(__file__).read_text().splitlines()[int(line) - 1]


class _Classifier(nn.Module):
    """Returns ``{"loss": ..., "logits": ...}``, as a transformers ``ModelOutput``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp()

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.body(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


@pytest.mark.parametrize("kept", ["detached", "output", "logits"])
def test_p7_outputs_kept_for_metrics(kept: str, tmp_path: Path) -> None:
    """Predictions appended to a list for metrics keep each step's graph alive unless
    detached: the loss made from them is gone, so only the output's node tells -- also for
    a model that returns its loss with its logits (the loss is the backward's root, the
    logits another output).  The loop's own variables, alive across one boundary until the
    next iteration rebinds them, are not."""
    model = _Classifier() if kept == "logits" else _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "preds.tscope"
    preds = []
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(4):
            if kept == "logits":
                out = model(torch.randn(4, 8), torch.randint(0, 2, (4,)))
                loss, held = out["loss"], out["logits"]
            else:
                out = model(torch.randn(4, 8))
                loss, held = out.pow(2).mean(), out.detach() if kept == "detached" else out
            opt.zero_grad()
            loss.backward()
            opt.step()
            preds.append(held)
    alive = [st["graphs_alive"] for st in _steps(path)]
    p7 = [f for f in diagnose(iter_events(path)) if f["code"] == "P7"]
    if kept == "detached":
        assert alive == [0, 0, 0, 0] and p7 == []
    else:
        assert alive[0] == 0 and 0 < alive[1] < alive[2] < alive[3] and len(p7) == 1
        kept_last = _steps(path)[-1]["graphs_kept"]
        assert kept_last["of"] == "output" and "out = model(" in _line(kept_last["src"])
        assert p7[0]["src"] == kept_last["src"], p7
        # the list keeping them is told (QA 44b: "kept in a list" said which list nowhere)
        assert kept_last["held_in"] == "'preds' (a list)", kept_last
        assert "the model's outputs, or tensors computed from them, stay referenced after their step, held by 'preds' (a list)" in p7[0]["message"], p7


def test_p10_and_p8_backward_errors(tmp_path: Path) -> None:
    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        h = model(torch.randn(4, 8))
        y = torch.sigmoid(h)
        y.add_(1.0)  # modifies a tensor sigmoid saved for backward
        opt.zero_grad()
        try:
            y.sum().backward()
        except RuntimeError as exc:
            state.setdefault("errors", []).append(str(exc))
        opt.step()

    steps = _steps_of(tmp_path, body)
    for st in steps:
        assert any("modified by an inplace operation" in m for m in st["backward_errors"])
        assert any(e["what"] == "saved_unreadable" and "SigmoidBackward0" in e["node"] for e in st["events"])


def _noops(st: dict[str, Any]) -> int:
    return sum(e["count"] for e in st.get("events", []) if e["what"] == "noop_to")


def test_p12_noop_to(tmp_path: Path) -> None:
    """A move naming a device that finds its tensor there is counted, at its line; a no-op dtype
    conversion is not (a logger's ``p.grad.float()`` per parameter made P12's info on correct
    runs: QA)."""
    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        x = torch.randn(4, 8).to("cpu")  # NOOP: already there
        loss = model(x.to(torch.float32).float()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        state["norm"] = torch.stack([p.grad.float().norm() for p in model.parameters()]).norm()
        x.cpu().to(x.device)
        opt.step()

    line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if "# NOOP: already there" in t)
    for st in _steps_of(tmp_path, body, mode="full"):  # full mode: every step counts copies
        (noop,) = [e for e in st["events"] if e["what"] == "noop_to"]
        assert noop == {"what": "noop_to", "count": 3, "src": f"{Path(__file__).name}:{line}"}


@pytest.mark.parametrize("where", ["site-packages", "my_project"])
def test_noop_to_inside_an_installed_package_is_not_the_users(tmp_path: Path, where: str) -> None:
    """A library that calls ``.to()`` on tensors already there (Opacus's clipping, 16 a step)
    is no finding of the user's: counted only when the calls come from code outside
    site-packages (the user's own, an editable install of their project included)."""
    import importlib.util

    lib = tmp_path / where / "tolib.py"
    lib.parent.mkdir()
    lib.write_text("def prepare(x):\n    for _ in range(5):\n        x = x.to(x.device)\n    return x\n")
    spec = importlib.util.spec_from_file_location(f"tolib_{where.replace('-', '_')}", lib)
    assert spec is not None and spec.loader is not None
    tolib = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tolib)

    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        loss = model(tolib.prepare(torch.randn(4, 8))).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    for st in _steps_of(tmp_path, body, mode="full"):  # full mode: every step counts copies
        assert _noops(st) == (0 if where == "site-packages" else 5)


def test_copies_counted_on_sampled_steps(tmp_path: Path) -> None:
    """Outside full mode, data movement before the forward is watched on the first COPY_STEPS
    steps, then every GRAD_STATS_EVERY steps and on captured steps (the function mode is off in between: zero_grad's per-parameter
    ``.grad`` accesses would each cost a Python call)."""
    from torchscope._watch import COPY_STEPS, GRAD_STATS_EVERY

    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        opt.zero_grad()
        x = torch.randn(4, 8).to("cpu")  # already there
        model(x).pow(2).mean().backward()
        opt.step()

    n = 2 * GRAD_STATS_EVERY + 1
    for mode in ("light", "default"):
        steps = _run(tmp_path / mode, body, steps=n, mode=mode, sample_every=7)
        counted = [st["step"] for st in steps if "copies" in st]
        expected = {*range(COPY_STEPS), GRAD_STATS_EVERY, 2 * GRAD_STATS_EVERY}
        if mode == "default":
            expected |= set(range(0, n, 7))
        assert counted == sorted(expected)
        noops = [st["step"] for st in steps if _noops(st) == 1]
        assert noops == counted
        assert all(st["loss"] is not None and st["micro_batches"] == 1 for st in steps)  # backward always seen


@pytest.mark.parametrize("kind", ["forward hook", "forward pre-hook"])
def test_p13_hook_keeps_activations(kind: str, tmp_path: Path) -> None:
    """A hook appending what its module sees holds it: a forward hook its outputs, a pre-hook
    its inputs (as surely)."""
    kept: list[torch.Tensor] = []
    model = _mlp()
    if kind == "forward hook":
        model[1].register_forward_hook(lambda m, i, o: kept.append(o))
    else:
        model[1].register_forward_pre_hook(lambda m, args: kept.append(args[0]))
    held = [st["hooks"]["1"] for st in _clean_run(model, tmp_path / "hooks.tscope", 3)]
    assert held == [sum(t.untyped_storage().nbytes() for t in kept[: i + 1]) for i in range(3)]
    assert held[0] == 4 * 16 * 4  # a [4, 16] float32 activation a step


class _Features:
    """A feature extractor's hook, as tutorials write it: a method, a branch that keeps a
    detached copy, and the one that keeps the output itself."""

    def __init__(self, module: nn.Module, detached: bool) -> None:
        self.features: list[torch.Tensor] = []
        self.detached = detached
        module.register_forward_hook(self.hook)

    def hook(self, module: nn.Module, args: Any, output: torch.Tensor) -> None:
        if self.detached:
            self.features = [output.detach()]
        else:
            self.features.append(output)  # keeps the graph


def test_p13_names_the_line_that_stores_the_output(tmp_path: Path) -> None:
    """P13's line is the hook's line that keeps the output -- the one to change -- not its
    ``def`` (QA 44b), nor a line that keeps only a detached copy."""
    model = _mlp()
    _Features(model[1], detached=False)
    steps = _clean_run(model, tmp_path / "features.tscope", 3)
    line = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.endswith("# keeps the graph"))
    assert steps[-1]["hooks_src"]["1"] == f"{Path(__file__).name}:{line}"


def test_p13_hooks_sharing_one_container_count_it_once(tmp_path: Path) -> None:
    """Hooks on three layers append to one dict: its bytes count once (each module alone
    reaches all of it), the three modules are one group, and the finding names them all and
    the hook's line.  A fourth hook keeping its own list stays a module of its own."""
    features: dict[str, list[torch.Tensor]] = {}
    own: list[torch.Tensor] = []

    def save(name: str) -> Any:
        def hook(m: nn.Module, i: Any, o: torch.Tensor) -> None:
            features.setdefault(name, []).append(o)
        return hook

    model = _mlp()
    for name in ("0", "1", "3"):
        model[int(name)].register_forward_hook(save(name))
    model[2].register_forward_hook(lambda m, i, o: own.append(o))
    path = tmp_path / "shared.tscope"
    steps = _clean_run(model, path, 6)  # growth_steps (4) rises
    nbytes = sum(t.untyped_storage().nbytes() for ts in features.values() for t in ts)
    assert steps[-1]["hooks"] == {"0": nbytes, "1": 0, "2": sum(t.untyped_storage().nbytes() for t in own), "3": 0}
    assert steps[-1]["hooks_shared"] == [["0", "1", "3"]]
    line = save.__code__.co_firstlineno + 2  # the line storing the output, not the hook's def (QA 44b)
    assert steps[-1]["hooks_src"]["0"] == f"{Path(__file__).name}:{line}"
    found = [f for f in diagnose(iter_events(path)) if f["code"] == "P13"]
    (shared,) = [f for f in found if f["modules"] == ["0", "1", "3"]]
    assert "'0', '1' and '3'" in shared["message"] and "one container" in shared["message"]
    assert shared["src"] == f"{Path(__file__).name}:{line}"


def test_p1_and_p9_graph_breaks_on_captured_steps(tmp_path: Path) -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "breaks.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        out = model(torch.randn(4, 8))
        scale = out.sum().item()  # a round trip through Python: cut from the graph
        idx = out.argmax(dim=1)  # not differentiable
        loss = (out * scale).mean() + idx.float().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    g = next(e for e in iter_events(path) if e["kind"] == "graph")
    names_flags = [(o["name"], o.get("flags", [])) for o in g["ops"]]
    assert ("torch::Tensor.item", ["breaks_graph", "outside_model"]) in names_flags
    assert any(n == "aten::argmax" and "non_differentiable" in f for n, f in names_flags)


class _BlockHead(nn.Module):
    """A Linear+ReLU block and a linear head; ``through(block, x)`` runs the block (under
    no_grad, checkpointed...)."""

    def __init__(self, through: Any) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 2)
        self.through = through

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.through(self.block, x))  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", ["light", "full"])
@pytest.mark.parametrize("probe", [True, False])
def test_p1_spares_a_backbone_the_optimizer_does_not_hold(mode: str, probe: bool, tmp_path: Path) -> None:
    """A linear probe: the backbone runs under no_grad and the optimizer holds only the head.
    The backbone's missing gradients are by design (``not_trained``), not P1.  The same
    forward with an optimizer over every parameter is P1 (one finding for the no_grad block):
    those parameters were meant to learn."""

    def frozen(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return block(x)  # type: ignore[no-any-return]

    model = _BlockHead(frozen)
    opt = torch.optim.SGD(model.head.parameters() if probe else model.parameters(), lr=0.01)
    path = tmp_path / "probe.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
    grads = [st["grads"] for st in _steps(path)]
    assert all(g["none"] == [0, 1] for g in grads)  # the block's weight and bias
    assert all(g.get("not_trained") == ([0, 1] if probe else None) for g in grads)
    p1 = [f for f in diagnose(iter_events(path)) if f["code"] == "P1"]
    if probe:
        assert p1 == []
    else:
        # one finding for the no_grad block, though weight and bias are cut at different ops
        assert len(p1) == 1 and set(p1[0]["params"]) == {"block.0.weight", "block.0.bias"}
        if mode == "full":  # a captured graph shows where the path breaks
            assert "torch.no_grad()" in p1[0]["message"] and p1[0]["targets"][0]["module"] == "block.0"


@pytest.mark.parametrize("mode", ["light", "full"])
@pytest.mark.parametrize("call", ["tensor", "autograd"])
def test_p1_spares_parameters_left_out_of_backward_inputs(mode: str, call: str, tmp_path: Path) -> None:
    """``backward(inputs=...)`` accumulates into the given tensors only (alternating updates
    of two parts): the others get no gradient by design (``not_trained``), not P1."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "inputs.tscope"
    parts = [list(model[0].parameters()), list(model[3].parameters())]
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for i in range(4):
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            if call == "tensor":
                loss.backward(inputs=parts[i % 2])
            else:
                torch.autograd.backward(loss, inputs=parts[i % 2])
            opt.step()
    grads = [st["grads"] for st in _steps(path)]
    assert [g["none"] for g in grads] == [[2, 3], [0, 1], [2, 3], [0, 1]]
    assert [g["not_trained"] for g in grads] == [[2, 3], [0, 1], [2, 3], [0, 1]]
    assert [f for f in diagnose(iter_events(path)) if f["code"] == "P1"] == []


@pytest.mark.parametrize("thresholded", [False, True])
def test_p9_spares_routing_and_masks_but_not_a_thresholded_loss(thresholded: bool, tmp_path: Path) -> None:
    """An argmax that routes tokens to experts and a comparison used as a mask feed the loss
    only as positions and masks: no P9.  A loss term computed from ``(logit > 0).float()``
    gets no gradient through the comparison: P9, at that comparison."""

    class Routed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(8, 2)
            self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
            self.head = nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scores = self.gate(x)
            route = scores.argmax(-1)
            weight = torch.softmax(scores, -1)
            y = torch.zeros_like(x)
            for k, expert in enumerate(self.experts):
                sel = route == k
                y[sel] = expert(x[sel]) * weight[sel, k : k + 1]
            return self.head(y * (y > 0))

    torch.manual_seed(0)
    model = Routed()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "routed.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(2):
            x, target = torch.randn(16, 8), torch.randn(16, 1)
            opt.zero_grad()
            out = model(x)
            loss = nn.functional.mse_loss(out, target)
            if thresholded:
                loss = loss + nn.functional.mse_loss((out > 0).float(), (target > 0).float())
            loss.backward()
            opt.step()
    p9 = [f for f in diagnose(iter_events(path)) if f["code"] == "P9"]
    if thresholded:
        assert len(p9) == 1 and p9[0]["data"]["op"] == "aten::gt" and p9[0]["steps"] == [0, 1]
    else:
        assert p9 == []


@pytest.mark.parametrize("passed", [True, False])
def test_p14_grad_scaler_skipped_step(passed: bool, tmp_path: Path) -> None:
    """The scaler passed to watch(), or found at its first ``scaler.scale(loss)``."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    path = tmp_path / "amp.tscope"
    with torchscope.watch(model, opt, server=None, record=path, scaler=scaler if passed else None):
        for i in range(4):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            if i == 1:
                loss = loss * float("inf")  # overflow: the scaler skips optimizer.step()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    steps = _steps(path)
    assert len(steps) == 4
    assert [st["scaler"]["skipped"] for st in steps] == [False, True, False, False]
    assert steps[0]["scaler"]["scale"] == 1024.0 and steps[2]["scaler"]["scale"] == 512.0


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("passed", [True, False])
def test_grad_scaler_step_loss_and_lr_are_the_loops(mode: str, passed: bool, tmp_path: Path) -> None:
    """Under a GradScaler the step's loss is the loss the loop logs, not ``scaler.scale(loss)``
    (the scale times it, moving with every change of the scale), and a step the scaler skips
    keeps the learning rate in force during it: it ends at the next forward, after the loop's
    ``scheduler.step()``."""
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.8)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    path = tmp_path / "amp.tscope"
    logged: list[float] = []
    lrs: list[float] = []
    grad_bytes: list[int] = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode, scaler=scaler if passed else None):
        for i in range(5):
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            if i == 2:
                loss = loss * float("inf")  # the scaler skips this step and halves its scale
            scaler.scale(loss).backward()
            lrs.append(opt.param_groups[0]["lr"])
            scaler.step(opt)
            grad_bytes.append(sum(p.grad.untyped_storage().nbytes() for p in model.parameters() if p.grad is not None))
            scaler.update()
            sched.step()
            logged.append(loss.item())
    steps = _steps(path)
    assert [st["scaler"]["skipped"] for st in steps] == [False, False, True, False, False]
    # the skipped step's gradients too, though the loop's zero_grad() freed them before it ended
    assert [st["memory"]["grads"] for st in steps] == grad_bytes and min(grad_bytes) > 0
    assert [st["loss"] for st in steps] == pytest.approx(logged, rel=1e-6)
    assert [st["losses"] for st in steps] == [pytest.approx([v], rel=1e-6) for v in logged]
    assert [st["lr"] for st in steps] == [[v] for v in lrs]


def test_dataloader_worker_captures_nothing(tmp_path: Path) -> None:
    """Inside a worker process ``watch`` is inert (the main process is the one recording)."""

    class DS(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> int:
            w = torchscope.watch(nn.Linear(2, 2), server=None, record=str(tmp_path / f"worker{i}.tscope"))
            return int(w.session_id is None)

    loader = torch.utils.data.DataLoader(DS(), num_workers=1)
    assert [int(b) for b in loader] == [1, 1]
    assert not list(tmp_path.glob("worker*.tscope"))


def test_p12_repeated_conversion_and_round_trip(tmp_path: Path) -> None:
    data = torch.randn(64, 8, dtype=torch.float64)  # e.g. what numpy hands over

    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        x = data.to(torch.float32)[4 * i : 4 * (i + 1)]  # the whole dataset converted every step
        x = x.double().float()  # there and back
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    steps = _steps_of(tmp_path, body, mode="full")
    for i, st in enumerate(steps):
        whats = {e["what"]: e for e in st.get("events", [])}
        assert ("repeat_copy" in whats) == (i > 0)
        if i > 0:
            assert whats["repeat_copy"]["bytes"] == 64 * 8 * 4
            assert whats["repeat_copy"]["src"].startswith("test_capture_facts.py:")
        # float64 data -> float32 -> .double() (back: 4*8*8 bytes) -> .float() (back: 4*8*4 bytes)
        assert (whats["round_trip"]["count"], whats["round_trip"]["bytes"]) == (2, 4 * 8 * 8 + 4 * 8 * 4)


class _QLoRALinear(nn.Module):
    """Weight-only quantization with a LoRA adapter (QLoRA's shape): a frozen int8 weight,
    dequantized in every forward on purpose -- kept int8 it takes a quarter of the memory."""

    def __init__(self, n_in: int, n_out: int, as_param: bool) -> None:
        super().__init__()
        w = torch.randn(n_out, n_in) * 0.1
        scale = w.abs().amax(1, keepdim=True) / 127
        q = torch.round(w / scale).to(torch.int8)
        if as_param:
            self.qweight = nn.Parameter(q, requires_grad=False)
        else:
            self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)
        self.a, self.b = nn.Parameter(torch.randn(4, n_in) * 0.01), nn.Parameter(torch.zeros(n_out, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.qweight.to(torch.float32) * self.scale  # dequantized
        return x @ w.t() + (x @ self.a.t()) @ self.b.t()  # type: ignore[no-any-return]


@pytest.mark.parametrize("as_param", [True, False])
def test_weights_dequantized_in_the_forward_are_no_repeated_copy(tmp_path: Path, as_param: bool) -> None:
    """The same int8 weight converted every step -- inside the forward, as dequantizing does --
    is the model's design, not a dataset moved again (that one, in the loop, still is: the
    test above)."""
    torch.manual_seed(0)
    model = nn.Sequential(_QLoRALinear(16, 16, as_param), nn.ReLU(), _QLoRALinear(16, 4, as_param))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    path = tmp_path / "qlora.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(6):
            opt.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward()
            opt.step()
    assert [e for st in _steps(path) for e in st.get("events", []) if e["what"] == "repeat_copy"] == []
    assert [f for f in diagnose(list(iter_events(path))) if f["code"] == "P12"] == []


@pytest.mark.parametrize(("clip", "passed"), [("norm", True), ("value", True), ("value-each", True), ("norm", False)])
def test_p14_clip_before_unscale(clip: str, passed: bool, tmp_path: Path) -> None:
    for unscale_first in (False, True):
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu")
        path = tmp_path / f"clip{unscale_first}.tscope"
        with torchscope.watch(model, opt, server=None, record=path, scaler=scaler if passed else None):
            for _ in range(3):
                loss = model(torch.randn(4, 8)).pow(2).mean()
                opt.zero_grad()
                scaler.scale(loss).backward()
                if unscale_first:
                    scaler.unscale_(opt)
                if clip == "norm":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                else:  # clamps the gradients: foreach, or one by one
                    torch.nn.utils.clip_grad_value_(model.parameters(), 0.5, foreach=clip == "value")
                scaler.step(opt)
                scaler.update()
        flagged = [any(e["what"] == "clip_before_unscale" for e in st.get("events", [])) for st in _steps(path)]
        assert flagged == [not unscale_first] * 3
        clipped = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P14" and "clipped" in f["message"]]
        assert len(clipped) == (0 if unscale_first else 1)
        assert all(f["src"].startswith("test_capture_facts.py:") for f in clipped)  # the clip call's line
        # its fix is the unscale_() call, not the overflow advice of P14's other findings (QA 34e)
        assert all(f["fix"].startswith("Call scaler.unscale_(optimizer) after scaler.scale(loss).backward()")
                   for f in clipped)


def test_loop_in_another_thread(tmp_path: Path) -> None:
    """watch() in one thread, the training loop in another: backward, losses and copies are
    still seen (the function mode is pushed on the thread that runs the loop)."""
    import threading

    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "thread.tscope"
    losses: list[float] = []

    def loop() -> None:
        for _ in range(4):
            opt.zero_grad()
            loss = model(torch.randn(4, 8).to("cpu")).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())

    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        worker = threading.Thread(target=loop)
        worker.start()
        worker.join()
    steps = _steps(path)
    assert [s["loss"] for s in steps] == pytest.approx(losses, rel=1e-6)
    assert [s["micro_batches"] for s in steps] == [1, 1, 1, 1]
    assert steps[1]["backward_src"][0].startswith("test_capture_facts.py:")
    # the worker's first step is watched from its forward on: its .to() comes from step 1 on
    assert all(_noops(s) == 1 for s in steps[1:])


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_evaluation_thread_beside_training(mode: str, tmp_path: Path) -> None:
    """A thread running no_grad forwards of the watched model while the loop trains is not part
    of the steps: every step keeps its one forward, backward and loss, and captured steps record
    exactly the ops (and modules) of a run without that thread."""
    import threading

    def run(evaluate: bool) -> tuple[list[float], list[dict[str, Any]], list[dict[str, Any]]]:
        torch.manual_seed(0)
        # no dropout: the evaluator's forwards then draw no random numbers from the loop's generator
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = [torch.randn(4, 8) for _ in range(30)]
        probe = torch.randn(16, 8)
        stop = threading.Event()
        evals = [0]

        def evaluator() -> None:
            while not stop.is_set():
                with torch.no_grad():
                    model(probe)
                evals[0] += 1

        path = tmp_path / f"{mode}-{evaluate}.tscope"
        losses: list[float] = []
        worker = threading.Thread(target=evaluator)
        with torchscope.watch(model, opt, server=None, record=path, mode=mode, sample_every=10):
            if evaluate:
                worker.start()
                while not evals[0]:  # the evaluator is running before the loop starts
                    time.sleep(0.001)
            losses += [_train_step(model, opt, x) for x in data]
            stop.set()
            if evaluate:
                worker.join()
        if evaluate:
            assert evals[0] > 1
        events = list(iter_events(path))
        return losses, [e for e in events if e["kind"] == "step"], [e for e in events if e["kind"] == "graph"]

    base_losses, base_steps, base_graphs = run(False)
    losses, steps, graphs = run(True)
    assert losses == base_losses
    assert [s["loss"] for s in steps] == pytest.approx(losses, rel=1e-6)
    assert [s["micro_batches"] for s in steps] == [1] * len(losses)
    assert [len(s["forwards"]) for s in steps] == [1] * len(losses)
    assert all(f["grad_mode"] for s in steps for f in s["forwards"])
    # full mode: a writer that falls behind sheds graph events, so which steps have one can
    # differ between the two runs; the steps both have must agree op for op
    base_by_step = {b["step"]: b for b in base_graphs}
    common = [g for g in graphs if g["step"] in base_by_step]
    assert (mode == "light") == (not common)
    assert mode == "light" or common[0]["step"] == 0
    for g in common:
        b = base_by_step[g["step"]]
        assert [(o["name"], o["module"], o["phase"]) for o in g["ops"]] == [
            (o["name"], o["module"], o["phase"]) for o in b["ops"]
        ]


def test_two_backwards_through_one_forward_keep_the_mode_off_between_steps(tmp_path: Path) -> None:
    """retain_graph=True with two losses is not mistaken for a backward with no forward: the
    function mode still leaves zero_grad alone on the steps that do not count copies."""
    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        opt.zero_grad()
        out = model(torch.randn(4, 8))
        out.pow(2).mean().backward(retain_graph=True)
        out.abs().mean().backward()
        opt.step()

    steps = _steps_of(tmp_path, body, steps=8, mode="light")
    assert [s["micro_batches"] for s in steps] == [2] * 8
    assert [s["step"] for s in steps if "copies" in s] == [0, 1, 2, 3]


@pytest.mark.parametrize("mode", ["light", "default"])
@pytest.mark.parametrize("call", ["positional", "keyword", "dict"])
def test_saved_bytes_follow_the_batch_however_inputs_are_passed(mode: str, call: str, tmp_path: Path) -> None:
    """Saved-for-backward bytes are reused between steps whose graph and inputs have the same
    shapes; inputs passed by keyword (``model(**batch)``) or inside a dict count as inputs too,
    or a batch of another size would report the first size's bytes."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(16, 64)
            self.b = nn.Linear(64, 4)

        def forward(self, x: Any = None) -> torch.Tensor:
            x = x["x"] if isinstance(x, dict) else x
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sizes = [8, 64, 8, 256, 32, 64]
    path = tmp_path / "saved.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for n in sizes:
            x = torch.randn(n, 16)
            opt.zero_grad()
            out = model(x) if call == "positional" else model(x=x) if call == "keyword" else model({"x": x})
            out.pow(2).mean().backward()
            opt.step()
    # per sample, float32: the input (16) saved by a's addmm, relu's output (64, saved by relu
    # and by b's addmm: one storage) and b's output (4, saved by pow)
    assert [s["memory"]["saved"] for s in _steps(path)] == [n * (16 + 64 + 4) * 4 for n in sizes]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_batch_sliced_out_of_a_dataset_in_memory_is_saved_at_its_own_size(mode: str, tmp_path: Path) -> None:
    """A batch sliced out of a dataset kept in one tensor (``X[i:i + 32]``) and its labels are
    views of the dataset's storage: the graph holds the slice, not the dataset, which the
    loop holds anyway.  An activation's view still counts its whole storage."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    X, Y = torch.randn(4096, 16), torch.randint(0, 4, (4096,))  # 256 KiB and 32 KiB
    path = tmp_path / "sliced.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for i in range(4):
            x, y = X[i * 32:(i + 1) * 32], Y[i * 32:(i + 1) * 32]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    # per sample: the input (16 float32) saved by the first addmm, relu's output (32, saved by
    # relu and the second addmm: one storage), log_softmax's output (4) and the label (one
    # int64); and nll_loss's total weight (one float32)
    steps = _steps(path)
    assert [s["memory"]["saved"] for s in steps] == [32 * ((16 + 32 + 4) * 4 + 8) + 4] * 4
    if mode != "light":  # and so does each saved tensor of the captured graph
        graph = next(e for e in iter_events(path) if e["kind"] == "graph")
        saved = [(n["name"], t["name"], t["nbytes"]) for n in graph["nodes"] for t in n.get("saved", [])]
        assert sorted(b for n, t, b in saved if t == "_saved_mat1") == [32 * 16 * 4, 32 * 32 * 4]
        assert [b for n, t, b in saved if t == "_saved_target"] == [32 * 8]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_slices_of_one_batch_saved_by_several_nodes_each_count(mode: str, tmp_path: Path) -> None:
    """A cell unrolled over the time steps of one time-major batch (``x[t]``, an RNN written by
    hand) saves a slice of the batch per time step: the graph holds all of them -- it counted
    the last slice read (QA 36b: 784 bytes of a 904-byte truth), one storage being one key.
    The truth: the same steps with each slice copied to a storage of its own."""

    class Unrolled(nn.Module):
        def __init__(self, copies: bool) -> None:
            super().__init__()
            self.cell, self.copies = nn.Linear(16, 16), copies

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.zeros(x.shape[1], 16)
            for t in range(x.shape[0]):
                xt = x[t].clone() if self.copies else x[t]
                h = torch.tanh(self.cell(h)) * xt  # mul saves xt, a slice of x that needs no gradient
                h = h * xt[:, :1]  # and a part of that slice again: no more bytes
            return h

    def saved(copies: bool) -> list[int]:
        torch.manual_seed(0)
        model = Unrolled(copies)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        path = tmp_path / f"unrolled-{copies}.tscope"
        with torchscope.watch(model, opt, server=None, record=path, mode=mode):
            for _ in range(2):
                x = torch.randn(6, 8, 16)  # (time, batch, features)
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                opt.step()
        return [s["memory"]["saved"] for s in _steps(path)]

    sliced, copied = saved(False), saved(True)
    assert sliced == copied, (sliced, copied)
    # per time step: the cell's input h (8x16 float32: zeros at t=0, then the second mul's
    # product), tanh's output and the slice (a mul by what needs no gradient saves only that);
    # then pow's input -- 512 bytes each
    assert copied == [(6 * 3 + 1) * 8 * 16 * 4] * 2


@pytest.mark.parametrize("mode", ["light", "full"])
def test_saved_bytes_of_a_custom_autograd_function(mode: str, tmp_path: Path) -> None:
    """What ``ctx.save_for_backward`` keeps counts as saved like a built-in op's saved tensors
    (it was left out: a custom Function's node has ``saved_tensors``, not ``_saved_*``)."""

    class Net(nn.Module):
        def __init__(self, custom: bool) -> None:
            super().__init__()
            self.a = nn.Linear(16, 64)
            self.b = nn.Linear(64, 4)
            self.custom = custom

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.a(x)
            return self.b(Square.apply(h) if self.custom else h * h)

    def saved(custom: bool) -> list[int]:
        torch.manual_seed(0)
        model = Net(custom)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        path = tmp_path / f"custom-{custom}.tscope"
        with torchscope.watch(model, opt, server=None, record=path, mode=mode):
            for n in (8, 32):
                opt.zero_grad()
                model(torch.randn(n, 16)).pow(2).mean().backward()
                opt.step()
        return [st["memory"]["saved"] for st in _steps(path)]

    # per sample, float32: the input (16, by a's addmm), h (64, by the square), h*h (64, by
    # b's addmm) and b's output (4, by pow)
    assert saved(True) == saved(False) == [n * (16 + 64 + 64 + 4) * 4 for n in (8, 32)]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_activation_checkpointing_is_not_recomputed_by_the_capture(mode: str, tmp_path: Path) -> None:
    """A segment under ``torch.utils.checkpoint`` (non-reentrant) saves nothing: its saved
    tensors are packed by checkpoint's hooks, and reading one recomputes the segment.  The
    capture runs the segment exactly as often as plain training (once forward, once in
    backward) and counts as saved only what is held: what the layers outside it save."""
    from torch.utils.checkpoint import checkpoint

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(16, 64)
            self.b = nn.Linear(64, 4)
            self.runs = 0

        def segment(self, x: torch.Tensor) -> torch.Tensor:
            self.runs += 1
            return torch.relu(self.a(x))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(checkpoint(self.segment, x, use_reentrant=False))

    def train(watched: bool) -> tuple[Net, list[int]]:
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        path = tmp_path / f"ckpt-{watched}.tscope"
        sizes = [8, 32, 8]
        with contextlib.ExitStack() as stack:
            if watched:
                stack.enter_context(torchscope.watch(model, opt, server=None, record=path, mode=mode))
            for n in sizes:
                x = torch.randn(n, 16)
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                opt.step()
        return model, [s["memory"]["saved"] for s in _steps(path)] if watched else sizes

    plain, sizes = train(False)
    model, saved = train(True)
    assert model.runs == plain.runs == 2 * len(sizes)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), plain.parameters(), strict=True))
    # per sample, float32: relu's output (64) saved by b's addmm, b's output (4) saved by pow;
    # the segment's input and relu's output inside it are not held by the graph
    assert saved == [n * (64 + 4) * 4 for n in sizes]


def test_p1_reentrant_checkpoint_without_an_input_requiring_grad(tmp_path: Path) -> None:
    """``checkpoint(..., use_reentrant=True)`` runs its function under no_grad and gives it
    gradients only through inputs that require grad: fed the batch directly, the checkpointed
    layers never learn.  P1 points at the first op run without grad and says how to fix it."""
    from torch.utils.checkpoint import checkpoint

    model = _BlockHead(lambda block, x: checkpoint(block, x, use_reentrant=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "reentrant.tscope"
    with pytest.warns(UserWarning, match="requires_grad"), torchscope.watch(
        model, opt, server=None, record=path, mode="full"
    ):
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
    (p1,) = [f for f in diagnose(iter_events(path)) if f["code"] == "P1"]
    assert set(p1["params"]) == {"block.0.weight", "block.0.bias"} and p1["targets"][0]["module"] == "block.0"
    assert "use_reentrant=False" in p1["fix"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_lazy_modules_watched_before_their_first_forward(mode: str, tmp_path: Path) -> None:
    """``nn.LazyLinear`` has no parameter shapes until its first forward: watch() before it
    neither raises nor turns any part of the capture off, the session event lists the shapes the
    forward made, and training is unchanged."""

    def run(watch: bool) -> tuple[list[float], Path]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(2))
        data = [torch.randn(4, 8) for _ in range(6)]
        path = tmp_path / f"lazy-{watch}.tscope"
        w = torchscope.watch(model, server=None, record=path, mode=mode, sample_every=2) if watch else None
        with torch.no_grad():
            model(data[0])  # the dry run that makes the parameters
        if w is not None:
            w.step()  # the dry run is a step of its own, without backward
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for x in data:
            losses.append(_train_step(model, opt, x))
            if w is not None:
                w.step()
        if w is not None:
            w.close()
        return losses, path

    base, _ = run(False)
    losses, path = run(True)
    assert losses == base
    events = list(iter_events(path))
    assert events[0]["kind"] == "session"
    assert [(p["name"], p["shape"]) for p in events[0]["params"]] == [
        ("0.weight", [16, 8]), ("0.bias", [16]), ("2.weight", [2, 16]), ("2.bias", [2])
    ]
    assert not [e for e in events if e["kind"] == "log"]  # no part of the capture turned off
    steps = [e for e in events if e["kind"] == "step"]
    assert [s["loss"] for s in steps[1:]] == pytest.approx(losses, rel=1e-6)
    if mode != "light":
        assert any(e["kind"] == "graph" and e["ops"] for e in events)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.script is deprecated, still in use
@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_torchscript_model(mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``torch.jit.script(model)`` runs no Python module hooks (registering one raises): watch()
    says what it cannot see instead of raising, and records backward, losses and gradients."""

    def run(watch: bool) -> tuple[list[float], list[torch.Tensor], Path]:
        torch.manual_seed(0)
        model = torch.jit.script(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        path = tmp_path / f"script-{watch}.tscope"
        w = torchscope.watch(model, opt, server=None, record=path, mode=mode) if watch else None
        losses = [_train_step(model, opt, torch.randn(4, 8)) for _ in range(4)]
        if w is not None:
            w.close()
        return losses, [p.grad.clone() for p in model.parameters()], path

    base, base_grads, _ = run(False)
    losses, grads, path = run(True)
    assert "Sequential is a TorchScript module" in capsys.readouterr().err
    assert losses == base and all(torch.equal(a, b) for a, b in zip(grads, base_grads, strict=True))
    events = list(iter_events(path))
    assert events[0]["model"] == "Sequential"
    steps = [e for e in events if e["kind"] == "step"]
    assert [s["loss"] for s in steps] == pytest.approx(losses, rel=1e-6)
    assert steps[-1]["grads"]["norm"] == pytest.approx([g.norm().item() for g in grads], rel=1e-5)
    assert not [e for e in events if e["kind"] == "log"]


class _HandRolled:
    """An optimizer that is not a torch.optim.Optimizer: no step hooks."""

    def __init__(self, params: Any, lr: float) -> None:
        self.params = list(params)
        self.param_groups = [{"lr": lr, "params": self.params}]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            p -= self.param_groups[0]["lr"] * p.grad


class _Wrapper(torch.optim.Optimizer):
    """Like accelerate's AcceleratedOptimizer: a subclass that never ran Optimizer.__init__ and
    forwards to the optimizer it holds."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:  # noqa: D107 -- no super().__init__, on purpose
        self.optimizer = optimizer

    @property
    def param_groups(self) -> Any:  # type: ignore[override]
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return self.optimizer.step(closure)


@pytest.mark.parametrize("kind", ["hand-rolled", "wrapper"])
def test_optimizers_without_hooks_of_their_own(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """watch() used to raise AttributeError for both.  A wrapper's inner optimizer is hooked; a
    hand-rolled one gets steps from the parameters changing between a backward and the next
    forward, so accumulated micro-batches still make one step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt: Any = _HandRolled(model.parameters(), 0.1) if kind == "hand-rolled" else _Wrapper(
        torch.optim.SGD(model.parameters(), lr=0.1)
    )
    path = tmp_path / "opt.tscope"
    losses: list[float] = []
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(4):
            opt.zero_grad()
            for _ in range(2):  # two accumulated micro-batches per step
                loss = model(torch.randn(4, 8)).pow(2).mean() / 2
                loss.backward()
                losses.append(loss.item())
            opt.step()
    assert ("has no step hooks" in capsys.readouterr().err) == (kind == "hand-rolled")
    steps = _steps(path)
    assert [s["micro_batches"] for s in steps] == [2, 2, 2, 2]
    assert [x for s in steps for x in s["losses"]] == pytest.approx(losses, rel=1e-6)
    assert all(s["lr"] == [0.1] for s in steps)


@pytest.mark.parametrize("mode", ["light", "default"])
def test_inference_loop_without_steps_stays_bounded(mode: str, tmp_path: Path) -> None:
    """A watch with no optimizer and no step() calls (an inference script): the open step used
    to hold every forward (and, captured, every op) forever; a step now closes every 1024
    forwards, so the capture's memory is bounded and the run shows up step by step."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).eval()
    x = torch.randn(4, 8)
    path = tmp_path / "infer.tscope"
    with torchscope.watch(model, server=None, record=path, mode=mode) as w, torch.no_grad():
        for _ in range(2500):
            model(x)
            assert len(w._s.forwards) <= 1024
    steps = _steps(path)
    assert [len(s["forwards"]) for s in steps] == [1024, 1024, 452]
    assert not any(f["grad_mode"] for s in steps for f in s["forwards"])


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_lbfgs_closure_is_not_accumulation(mode: str, tmp_path: Path) -> None:
    """``optimizer.step(closure)`` with LBFGS runs the closure (zero_grad, forward, backward)
    several times per step: the training is unchanged, every closure pass is a micro-batch of
    the step, and only the last pass's gradients reach the step -- not a P15 accumulation."""

    def train(path: Path | None) -> Trained:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
        x, y = torch.randn(32, 4), torch.randn(32, 1)
        w = torchscope.watch(model, opt, server=None, record=path, mode=mode) if path else None

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        losses = [float(opt.step(closure).detach()) for _ in range(4)]  # type: ignore[union-attr]
        if w is not None:
            w.close()
        return losses, [p.detach().clone() for p in model.parameters()]

    path = tmp_path / "lbfgs.tscope"
    _unchanged(train, path)
    steps = _steps(path)
    assert len(steps) == 4
    for st in steps:
        assert st["micro_batches"] == len(st["forwards"]) > 1 and st["accumulated"] == 1
        assert st["zero_grad"] == st["micro_batches"]  # every closure pass started from cleared grads
    findings = diagnose(iter_events(path))
    assert "P15" not in {f["code"] for f in findings}


class _EncHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.enc = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(x))


def _train_enc_head(path: Path | None, mode: str, call: str) -> Trained:
    """Six SGD steps of _EncHead, its forward run as ``call`` says, watched when ``path`` is set."""
    model = _EncHead()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = torchscope.watch(model, opt, server=None, record=path, mode=mode, sample_every=2) if path is not None else None
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(6):
        x = torch.randn(4, 8, generator=g)
        opt.zero_grad()
        if call == "parts":
            z = model.enc(x)  # the loop calls the parts itself (Lightning's self.model(x) alike)
            out = model.head(z)
        elif call == "layers":
            for layer in model.enc:  # the parts of a part: model.enc itself is never called
                x = layer(x)
            out = model.head(x)
        else:
            out = model.forward(x)
        loss = out.pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    if w is not None:
        w.close()
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(("mode", "call"), [("default", "forward"), ("default", "parts"), ("light", "parts"),
                                            ("full", "parts")])
def test_model_forward_called_directly(tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str,
                                       call: str) -> None:
    """``model.forward(x)`` or the model's parts called one by one skip the model's hooks: the
    first step is recorded without forward ops and the user told why, once; from the next step
    on the direct submodules' calls are the model's forward, their ops in their modules -- the
    ops plain PyTorch runs for them -- and training does not change."""
    path = tmp_path / "run.tscope"
    _unchanged(lambda p: _train_enc_head(p, mode, call), path)
    err = capsys.readouterr().err
    assert err.count("without a call of the model itself") == 1 and "model.forward(x)" in err
    assert "calls of its submodules enc, head are recorded as its forward" in err
    events = list(iter_events(path))
    steps = [e for e in events if e["kind"] == "step"]
    assert [s["micro_batches"] for s in steps] == [1] * 6 and all(s["loss"] is not None for s in steps)
    assert steps[0].get("forwards", []) == []
    # one forward per submodule called at depth 0: enc and head by hand, or forward()'s two calls
    assert all(len(s["forwards"]) == 2 and all(f["backward"] for f in s["forwards"]) for s in steps[1:]), steps[1:]
    graphs = {e["step"]: e for e in events if e["kind"] == "graph"}
    if mode == "light":  # records no graphs
        assert not graphs
    else:
        assert not graphs[0]["ops"] and graphs[0]["nodes"]
        # the step after the one without forward ops is captured, not only the periodic ones
        assert set(graphs) >= {0, 1, 2, 4}, sorted(graphs)
    later = [g for st, g in graphs.items() if st > 0]
    for g in later:
        fwd = [o for o in g["ops"] if o.get("phase") == "forward"]
        by_module = {(o["module"], o["name"]) for o in fwd}
        # the parts' ops, each in its module: Linear's addmm (or linear), ReLU's relu
        assert {m for m, _ in by_module} >= {"enc.0", "enc.1", "head"}, by_module
        assert any(m == "enc.1" and "relu" in n for m, n in by_module), by_module
        assert any(m == "head" and ("addmm" in n or "linear" in n) for m, n in by_module), by_module
        # the first user frame of an op of head is the loop's own line (not torch's)
        head_src = {o.get("src", "") for o in fwd if o["module"] == "head"}
        assert all("test_capture_facts.py" in src for src in head_src if src), head_src
    logs = [e for e in events if e["kind"] == "log" and "model.forward(x)" in e["message"]]
    assert len(logs) == 1 and logs[0]["level"] == "warning"


def test_grandchildren_called_directly_are_the_models_forward(tmp_path: Path) -> None:
    """A loop that runs the layers of a submodule one by one (``for layer in model.enc: h =
    layer(h)``) never calls the model nor ``model.enc``: from the second step on, each layer's
    call is a forward of the model, its ops in its module, and training does not change."""
    path = tmp_path / "layers.tscope"
    _unchanged(lambda p: _train_enc_head(p, "default", "layers"), path)
    events = list(iter_events(path))
    steps = [e for e in events if e["kind"] == "step"]
    # enc.0, enc.1 (its ReLU) and head, each called at depth 0: three forwards a step
    assert all(len(s["forwards"]) == len(list(_EncHead().enc)) + 1 for s in steps[1:]), [s["forwards"] for s in steps]
    graphs = {e["step"]: e for e in events if e["kind"] == "graph"}
    fwd = [o for o in graphs[1]["ops"] if o.get("phase") == "forward"]
    assert {o["module"] for o in fwd} >= {"enc.0", "enc.1", "head"}, {(o["module"], o["name"]) for o in fwd}
    assert any(o["module"] == "enc.1" and "relu" in o["name"] for o in fwd)


def test_a_container_of_models_is_told_to_watch_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An ``nn.ModuleDict`` of a GAN's models has no forward to call: the note says to watch each
    model, not to "call model(x)"; its models' calls are recorded as its forwards from the
    second step on."""
    models = nn.ModuleDict({"G": nn.Linear(4, 4), "D": nn.Linear(4, 1)})
    opt = torch.optim.SGD(models.parameters(), lr=0.1)
    path = tmp_path / "gan.tscope"
    with torchscope.watch(models, opt, server=None, record=path):  # sample_every=50: step 1 is captured for the ops
        for _ in range(3):
            opt.zero_grad()
            models["D"](models["G"](torch.randn(2, 4))).mean().backward()
            opt.step()
    err = capsys.readouterr().err
    assert err.count("ModuleDict has no forward of its own") == 1 and "watch each model the loop calls" in err
    assert "model(x)" not in err
    graphs = [e for e in iter_events(path) if e["kind"] == "graph"]
    assert [g["step"] for g in graphs] == [0, 1] and not graphs[0]["ops"]
    assert {o["module"] for o in graphs[1]["ops"] if o.get("phase") == "forward"} >= {"G", "D"}


class _Agent(nn.Module):
    """CleanRL's PPO agent: no forward, two methods that call its parts."""

    def __init__(self) -> None:
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.actor = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)  # type: ignore[no-any-return]

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dist = torch.distributions.Categorical(logits=self.actor(x))
        return dist.log_prob(action), dist.entropy(), self.critic(x)


def test_one_model_without_a_forward_is_not_told_to_watch_each_model(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """An agent class whose methods call its parts (CleanRL's PPO) is one model trained by one
    optimizer: the note says its parts' calls are its forwards, as an info, not the GAN's
    "watch(models['G'], opt_g)" (QA 49a), and its parts' ops are recorded from the next step."""
    torch.manual_seed(0)
    agent = _Agent()
    opt = torch.optim.Adam(agent.parameters(), lr=1e-3)
    path = tmp_path / "agent.tscope"
    with torchscope.watch(agent, opt, server=None, record=path):
        for _ in range(3):
            x, action = torch.randn(8, 4), torch.randint(0, 2, (8,))
            logp, ent, value = agent.get_action_and_value(x, action)
            loss = -(logp * torch.randn(8)).mean() - 0.01 * ent.mean() + value.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    err = capsys.readouterr().err
    assert err.count("_Agent has no forward of its own: its methods call its submodules directly") == 1, err
    assert "models['G']" not in err and "watch each model" not in err
    logs = [e for e in iter_events(path) if e["kind"] == "log" and "no forward of its own" in e["message"]]
    assert len(logs) == 1 and logs[0]["level"] == "info"
    graphs = [e for e in iter_events(path) if e["kind"] == "graph"]
    assert {o["module"] for o in graphs[-1]["ops"] if o.get("phase") == "forward"} >= {"actor.0", "critic.0"}


def test_gan_loop_is_not_missing_zero_grad(tmp_path: Path) -> None:
    """The generator's loss flows through the discriminator: its gradients land on top of the
    discriminator's last ones, which its zero_grad() clears before its own backward.  The
    discriminator's steps start with stale gradients, but its optimizer never steps on them:
    not P5."""
    torch.manual_seed(0)
    gen, disc = nn.Sequential(nn.Linear(4, 8)), nn.Sequential(nn.Linear(8, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
    opt_g, opt_d = torch.optim.Adam(gen.parameters(), 1e-3), torch.optim.Adam(disc.parameters(), 1e-3)
    bce = nn.BCEWithLogitsLoss()
    path = tmp_path / "disc.tscope"
    with torchscope.watch(disc, opt_d, server=None, record=path):
        for _ in range(5):
            fake = gen(torch.randn(16, 4))
            opt_d.zero_grad()
            loss_d = bce(disc(torch.randn(16, 8)), torch.ones(16, 1)) + bce(disc(fake.detach()), torch.zeros(16, 1))
            loss_d.backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(disc(fake), torch.ones(16, 1)).backward()
            opt_g.step()
    steps = _steps(path)
    assert any(s["grads"]["pre_nonzero"] for s in steps)  # the stale gradients were seen ...
    assert all(s["accumulated"] == 1 for s in steps[1:])  # ... and cleared before the step
    assert "P5" not in {f["code"] for f in diagnose(iter_events(path))}


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_model_moved_after_watch(mode: str, tmp_path: Path) -> None:
    """``watch(model)`` then ``model.to(device)`` (here ``.double()``: new storages for the same
    parameters): what the backward saves is still told from the parameters -- the saved bytes
    equal those of the model moved before ``watch()``."""

    def saved(move_after: bool) -> list[int]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
        if not move_after:
            model.double()
        path = tmp_path / f"{move_after}.tscope"
        with torchscope.watch(model, server=None, record=path, mode=mode):
            if move_after:
                model.double()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(32, 64, dtype=torch.float64)).pow(2).mean().backward()
                opt.step()
        return [s["memory"]["saved"] for s in _steps(path)]

    before = saved(False)
    assert len(before) == 3 and before[0] > 0
    assert saved(True) == before


def test_two_losses_through_one_forward_are_not_accumulation(tmp_path: Path) -> None:
    """Multi-task training backpropagates each loss through one forward
    (``loss1.backward(retain_graph=True); loss2.backward()``): the losses are summed, as
    ``(loss1 + loss2).backward()`` would -- two backward passes, one micro-batch, not P15."""

    def body(model: nn.Module, opt: Any, i: int, state: dict[str, Any]) -> None:
        opt.zero_grad()
        out = model(torch.randn(4, 8))
        out[:, 0].pow(2).mean().backward(retain_graph=True)
        out[:, 1].abs().mean().backward()
        opt.step()

    path = tmp_path / "run.tscope"
    steps = _run(tmp_path, body)
    assert all(s["micro_batches"] == 2 and len(s["forwards"]) == 1 for s in steps)
    assert "P15" not in {f["code"] for f in diagnose(iter_events(path))}


def test_frozen_batch_norm_in_eval_is_a_deliberate_freeze(tmp_path: Path) -> None:
    """Fine-tuning freezes batch-norm: its parameters stop training and ``bn.eval()`` keeps its
    statistics.  That is not P11; the same eval() on a batch-norm whose weight and bias still
    train is the deliberate ``norm_eval`` freeze of detection fine-tuning: told, as an info."""

    def run(freeze_params: bool) -> dict[str, str]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
        if freeze_params:
            model[1].requires_grad_(False)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
        path = tmp_path / f"bn-{freeze_params}.tscope"
        with torchscope.watch(model, opt, server=None, record=path):
            for _ in range(4):
                model.train()
                model[1].eval()
                _train_step(model, opt, torch.randn(8, 8))
        return {f["code"]: f["severity"] for f in diagnose(iter_events(path))}

    assert "P11" not in run(freeze_params=True)
    assert run(freeze_params=False).get("P11") == "info"


class _CriticLoss(nn.Module):
    def __init__(self, critic: nn.Module, dead: nn.Module) -> None:
        super().__init__()
        self.critic, self.dead = critic, dead

    def forward(self, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        return self.critic(fake).mean() - self.critic(real).mean() + self.dead(real).mean()


def test_a_bias_that_cancels_out_of_the_loss_is_told_not_warned(tmp_path: Path) -> None:
    """A WGAN critic's loss, fake minus real: its last layer's bias gets exactly zero gradient
    at every step while that layer's weight learns -- by design, not a dead branch (P2 info,
    no warning).  A layer whose ReLU never fires is still warned."""
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    dead = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    with torch.no_grad():
        dead[0].bias.fill_(-100.0)  # its ReLU never fires: dead[0] gets no gradient at all
    model = _CriticLoss(critic, dead)
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(6):
            loss = model(torch.randn(16, 4), torch.randn(16, 4) + 1)
            opt.zero_grad()
            loss.backward()
            assert critic[2].bias.grad.abs().max() == 0 and critic[2].weight.grad.abs().max() > 0
            opt.step()
    p2 = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P2"]
    told = [f for f in p2 if f["severity"] == "info"]
    warned = [f for f in p2 if f["severity"] == "warning"]
    assert [f["params"] for f in told] == [["critic.2.bias"]] and "cancels out" in told[0]["message"]
    # the layer after the dead one gets no weight gradient either (its input is all zeros)
    assert len(warned) == 1 and set(warned[0]["params"]) == {"dead.0.weight", "dead.0.bias", "dead.2.weight"}


class _MainAndAux(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(8, 16)
        self.main, self.aux = nn.Linear(16, 3), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.body(x))
        return self.main(h), self.aux(h)


def test_an_output_left_out_of_the_loss_is_named_so(tmp_path: Path) -> None:
    """An auxiliary head whose loss term was forgotten: its parameters never get a gradient
    (P1), and the finding says its output is unused -- not that gradient cannot flow through
    the head's own (differentiable) matmul."""
    model = _MainAndAux()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(3):
            main, _aux = model(torch.randn(8, 8))
            loss = nn.functional.cross_entropy(main, torch.randint(0, 3, (8,)))  # + aux term forgotten
            opt.zero_grad()
            loss.backward()
            opt.step()
    findings = diagnose(list(iter_events(path)))
    p1 = [f for f in findings if f["code"] == "P1"]
    assert len(p1) == 1 and set(p1[0]["params"]) == {"aux.weight", "aux.bias"}
    assert "never uses" in p1[0]["message"] and "cannot flow" not in p1[0]["message"]
    assert "P6" not in {f["code"] for f in findings}


class _CausalLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(16, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])  # -inf above the diagonal
        return self.head(self.enc(self.emb(x), mask=mask))


@pytest.mark.parametrize(("native", "mode"), [(True, "default"), (False, "default"), (True, "full")])
def test_a_loss_nan_from_the_first_step_is_traced_to_its_op(
        tmp_path: Path, native: bool, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first captured step's ops are checked for NaN/Inf: the log of a probability that
    underflowed to 0 makes the loss inf from step 0, and P4 names that log -- while a causal
    mask's -inf, which its softmax absorbs, is no finding on a healthy run."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, _native._error
    for bad in (False, True):
        model = _CausalLM()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        path = tmp_path / f"lm-{bad}.tscope"
        # full mode records the backward too: its ops (log's backward divides by 0) come after the
        # forward's log and are no cause
        with torchscope.watch(model, opt, server=None, record=path, mode=mode):
            for _ in range(3):
                x = torch.randint(0, 16, (2, 6))
                logits = model(x) * (1e4 if bad else 1.0)  # saturated: some probabilities are exactly 0
                probs = torch.softmax(logits, -1)
                loss = -torch.log(probs).mean()  # instead of log_softmax
                opt.zero_grad()
                loss.backward()
                opt.step()
        events = list(iter_events(path))
        graph0 = next(e for e in events if e["kind"] == "graph" and e["step"] == 0)
        assert any("nan" in op.get("flags", ()) for op in graph0["ops"])  # checked: the mask's -inf at least
        p4 = [f for f in diagnose(events) if f["code"] == "P4"]
        if not bad:
            assert p4 == []
            continue
        assert len(p4) == 1 and p4[0]["since"] == 0 and "aten::log" in p4[0]["message"]
        assert p4[0]["targets"][0]["step"] == 0 and p4[0]["src"].startswith("test_capture_facts.py:")


def test_p13_a_backward_hook_keeping_gradients(tmp_path: Path) -> None:
    """A full backward hook appending grad_output every step (gradient "inspection") keeps them
    as surely as a forward hook keeps activations."""
    seen: list[torch.Tensor] = []
    model = _mlp()
    model[3].register_full_backward_hook(lambda m, gin, gout: seen.append(gout[0]))
    path = tmp_path / "backward-hook.tscope"
    held = [st["hooks"]["3"] for st in _clean_run(model, path, 6)]
    assert held[-1] == sum(t.untyped_storage().nbytes() for t in seen) > 0 and held == sorted(held)
    (p13,) = [f for f in diagnose(iter_events(path)) if f["code"] == "P13"]
    assert p13["modules"] == ["3"] and "gradients" in p13["message"]


def test_an_lbfgs_closures_forward_and_backward_are_not_counted_twice(tmp_path: Path) -> None:
    """``optimizer_us`` (format 1.12) is the optimizer's own time: the forwards and backwards its
    closure runs inside step() are in ``forward_us`` and ``backward_us`` already (QA 48e: the parts
    added up to 1.1-1.4x the step)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    path = tmp_path / "lbfgs.tscope"

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(6):
            opt.step(closure)
    steps = _steps(path)
    assert all(st["micro_batches"] > 1 for st in steps)  # the premise: several passes inside step()
    for st in steps:
        parts = st["forward_us"] + st["backward_us"] + st["before_forward_us"] + st["optimizer_us"]
        assert parts <= st["duration_us"] * 1.02 + 200, st
