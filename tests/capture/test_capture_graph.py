"""What the capture records equals what plain PyTorch says, computed independently here."""

from __future__ import annotations

import collections
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from capture_models import Looped, make
from torch import nn

import torchscope
from torchscope import _native
from torchscope._autograd import AutogradWalk
from torchscope.sessionfile import iter_events


def independent_walk(loss: torch.Tensor, names: dict[int, str]) -> tuple[collections.Counter, collections.Counter]:
    """Node classes and labelled edges below loss.grad_fn (breadth first, by our own hand)."""

    def label(n: Any) -> str:
        v = getattr(n, "variable", None)
        return f"{type(n).__name__}[{names[id(v)]}]" if v is not None else type(n).__name__

    assert loss.grad_fn is not None
    seen = {loss.grad_fn: 0}
    queue: list[Any] = [loss.grad_fn]
    nodes: collections.Counter = collections.Counter()
    edges: collections.Counter = collections.Counter()
    while queue:
        n = queue.pop(0)
        nodes[label(n)] += 1
        for child, nr in n.next_functions:
            if child is None:
                continue
            edges[(label(n), label(child), nr)] += 1
            if child not in seen:
                seen[child] = len(seen)
                queue.append(child)
    return nodes, edges


def recorded_walk(g: dict[str, Any]) -> tuple[collections.Counter, collections.Counter]:
    def label(rec: dict[str, Any]) -> str:
        return f"{rec['name']}[{rec['param']}]" if "param" in rec else rec["name"]

    by_id = {n["id"]: n for n in g["nodes"]}
    nodes = collections.Counter(label(n) for n in g["nodes"])
    edges = collections.Counter((label(by_id[a]), label(by_id[b]), nr) for a, b, nr in g["edges"])
    return nodes, edges


@pytest.mark.parametrize("kind", ["zoo", "cnn", "transformer", "mlp"])
def test_graph_grads_and_memory_match_pytorch(kind: str, tmp_path: Path) -> None:
    model, batch = make(kind)
    names = {id(p): n for n, p in model.named_parameters()}
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    path = tmp_path / f"{kind}.tscope"
    expected: list[dict[str, Any]] = []
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for i in range(3):
            x, y = batch(i)
            out = model(x)
            loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y)
            nodes, edges = independent_walk(loss, names)
            opt.zero_grad()
            loss.backward()
            opt.step()
            grads = [p.grad for p in model.parameters()]
            storages: dict[int, int] = {}
            for t in [*model.parameters(), *(g for g in grads if g is not None)]:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            for st in opt.state.values():
                for v in st.values():
                    if torch.is_tensor(v):
                        storages[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
            expected.append(
                {
                    "nodes": nodes,
                    "edges": edges,
                    "loss": loss.item(),
                    "grads": [None if g is None else g.clone() for g in grads],
                    "live": sum(storages.values()),
                    "params": sum(p.numel() * p.element_size() for p in model.parameters()),
                }
            )
    events = list(iter_events(path))
    session = events[0]
    assert [p["name"] for p in session["params"]] == list(names.values())
    steps = [e for e in events if e["kind"] == "step"]
    graphs = {e["step"]: e for e in events if e["kind"] == "graph"}
    assert len(steps) == 3 and sorted(graphs) == [0, 1, 2]
    for st, exp in zip(steps, expected, strict=True):
        g = graphs[st["step"]]
        nodes, edges = recorded_walk(g)
        assert nodes == exp["nodes"]
        assert edges == exp["edges"]
        assert st["loss"] == pytest.approx(exp["loss"], rel=1e-6)
        gs = st["grads"]
        for i, grad in enumerate(exp["grads"]):
            if grad is None:
                assert gs["norm"][i] is None and i in gs["none"]
                continue
            assert gs["norm"][i] == pytest.approx(grad.norm().item(), rel=1e-5)
            assert gs["max_abs"][i] == pytest.approx(grad.abs().max().item(), rel=1e-6)
            scale = grad.abs().max().item()
            assert gs["mean"][i] == pytest.approx(grad.double().mean().item(), rel=1e-4, abs=1e-6 * scale)
            if grad.numel() > 1:
                assert gs["std"][i] == pytest.approx(grad.double().std().item(), rel=1e-3, abs=1e-6 * scale)
            assert gs["zero_frac"][i] == pytest.approx((grad == 0).double().mean().item(), abs=1e-6)
            assert gs["nan"][i] == 0 and gs["inf"][i] == 0
        assert st["memory"]["live"] == exp["live"]
        assert st["memory"]["params"] == exp["params"]
        # every recorded forward op names a module that exists (or the root, for the loss)
        paths = {m["path"] for m in session["modules"]}
        assert {o["module"] for o in g["ops"]} <= paths
        # each AccumulateGrad is linked to its parameter, each other node to a forward op
        linked = [n for n in g["nodes"] if n["name"] not in ("AccumulateGrad",) and "op" in n]
        assert len(linked) >= len([n for n in g["nodes"] if n["name"] != "AccumulateGrad"]) * 0.8
        assert sorted(n["order"] for n in g["nodes"] if "order" in n) == list(range(len([n for n in g["nodes"] if "order" in n])))
        # every node that ran has a duration; back to back, they add up to at most the backward
        ran = [n for n in g["nodes"] if "order" in n]
        assert ran and all(n["dur_us"] >= 0 for n in ran)
        assert sum(n["dur_us"] for n in ran) <= st["backward_us"] + 1


def test_zoo_graph_details(tmp_path: Path) -> None:
    """The custom Function, in-place op, detach and no_grad island show where expected."""
    model, batch = make("zoo")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "zoo.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        x, y = batch(0)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    events = list(iter_events(path))
    g = next(e for e in events if e["kind"] == "graph")
    st = next(e for e in events if e["kind"] == "step")
    names = {n["name"] for n in g["nodes"]}
    assert "SquareBackward" in names  # custom autograd.Function
    params = [p["name"] for p in events[0]["params"]]
    assert {params[i] for i in st["grads"]["none"]} == {"unused.weight", "unused.bias"}  # cut by detach()
    shared = [n for n in g["nodes"] if n.get("param") == "shared.weight"]
    assert len(shared) == 1  # one AccumulateGrad for a parameter used twice ...
    sid = shared[0]["id"]
    assert sum(1 for a, b, _ in g["edges"] if b == sid) == 2  # ... fed by both uses
    ops = g["ops"]
    assert any(o["inplace"] and o["name"] == "aten::relu_" and o["module"] == "" for o in ops)
    assert any(not o["grad_mode"] for o in ops)  # the no_grad island
    assert any("breaks_graph" in o.get("flags", ()) and o["name"] == "torch::Tensor.detach" for o in ops)
    calls = sorted(o["call"] for o in ops if o["module"] == "shared" and o["name"] == "aten::addmm")
    assert calls == [0, 1]  # the two calls of one module are told apart
    tensors = g["tensors"]
    views = [t for t in tensors if t["shape"] == [6, 4, 4]]
    assert views and all("storage" in t for t in views)


def _looped(tmp_path: Path, lengths: list[int], **watch_kw: Any) -> list[dict[str, Any]]:
    """The events of a watched Looped model trained with these loop lengths, one per step."""
    torch.manual_seed(0)
    model = Looped()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "loop.tscope"
    with torchscope.watch(model, opt, server=None, record=path, **watch_kw):
        for n in lengths:
            model.n = n
            loss = model(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return list(iter_events(path))


@pytest.mark.parametrize("mode", ["default", "full"])
def test_signature_changes_exactly_with_structure(tmp_path: Path, mode: str) -> None:
    lengths = [2, 2, 3, 3, 2, 5, 5, 5]
    events = _looped(tmp_path, lengths, mode=mode, sample_every=100)
    sigs = [e["graph_signature"] for e in events if e["kind"] == "step"]
    for i in range(len(lengths)):
        for j in range(len(lengths)):
            assert (sigs[i] == sigs[j]) == (lengths[i] == lengths[j]), (i, j)


class _Swappable(nn.Module):
    """A layer applied ``n`` times with a chosen activation: tanh and sigmoid make graphs of the
    same number of nodes, so only a walk tells them apart."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(8, 8)
        self.act: Any = torch.tanh
        self.n = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.n):
            x = self.act(self.cell(x))
        return x


def _swapped(tmp_path: Path, mode: str) -> list[str]:
    """Each step's signature for a plan of same-count swaps, a longer loop and a new batch size:
    step 3: sigmoid for tanh, same node count; step 13: a longer loop; step 16: tanh again; step
    21: a new batch size."""
    torch.manual_seed(0)
    model = _Swappable()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    plan = [(torch.tanh, 2, 4)] * 3 + [(torch.sigmoid, 2, 4)] * 10 + [(torch.sigmoid, 3, 4)] * 3
    plan += [(torch.tanh, 3, 4)] * 5 + [(torch.tanh, 3, 6)] * 2
    path = tmp_path / f"reuse-{mode}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode, sample_every=1000):
        for act, n, batch in plan:
            model.act, model.n = act, n
            loss = model(torch.randn(batch, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [e["graph_signature"] for e in iter_events(path) if e["kind"] == "step"]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_native_walk_key_sees_every_structure_change_at_once(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the extension, a backward's graph is known by its structure walked in C++: a swap
    that keeps the node count is seen at the step it happens, and each step's signature is the
    one a Python walk of its graph gives."""
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1")
    assert _native.get(block=True) is not None, _native._error
    sigs = _swapped(tmp_path, mode)
    changes = [i for i in range(1, len(sigs)) if sigs[i] != sigs[i - 1]]
    assert changes == [3, 13, 16]
    assert len({sigs[0], sigs[3], sigs[13], sigs[16]}) == 4
    assert sigs[22] == sigs[20]  # the signature is the structure, not shapes
    # the same structures walked by a fresh Python walk each: the same signatures
    model = _Swappable()
    for i, (act, n) in {0: (torch.tanh, 2), 3: (torch.sigmoid, 2), 13: (torch.sigmoid, 3), 16: (torch.tanh, 3)}.items():
        model.act, model.n = act, n
        loss = model(torch.randn(4, 8)).pow(2).mean()
        assert AutogradWalk([loss.grad_fn]).signature() == sigs[i], i


@pytest.mark.parametrize("mode", ["light", "default"])
def test_walks_are_reused_while_nothing_says_the_graph_changed(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the extension, a step repeats the last walk's signature while its roots, input
    shapes and number of autograd nodes made stay the same (deep graphs cost 1-1.5 us a node to
    walk in Python); the graph is walked anyway every GRAD_STATS_EVERY steps."""
    from torchscope._watch import GRAD_STATS_EVERY

    monkeypatch.setenv("TORCHSCOPE_NATIVE", "0")
    sigs = _swapped(tmp_path, mode)
    changes = [i for i in range(1, len(sigs)) if sigs[i] != sigs[i - 1]]
    # the swap at step 3 is seen at the next walk (step 10), tanh again at 16 at step 20
    assert GRAD_STATS_EVERY == 10 and changes == [10, 13, 20]
    assert sigs[3] == sigs[0]  # a same-count swap repeats the last walk's signature until the next walk
    assert sigs[22] == sigs[20]  # the signature is the structure, not shapes


def test_default_mode_captures_on_change_and_schedule(tmp_path: Path) -> None:
    events = _looped(tmp_path, [2, 2, 2, 3, 3, 3, 3, 3, 3, 3], sample_every=8)
    captured = [e["step"] for e in events if e["kind"] == "graph"]
    # step 0 (first), step 4 (the one after the change at step 3), step 8 (schedule)
    assert captured == [0, 4, 8]
    flags = [e["graph_captured"] for e in events if e["kind"] == "step"]
    assert [i for i, f in enumerate(flags) if f] == captured


def _captures(tmp_path: Path, lengths: list[int]) -> tuple[list[int], dict[int, str], dict[int, int]]:
    """Default mode (sample_every=1000) on Looped with these loop lengths: the captured steps,
    each step's signature, and the loop length of each captured graph (from its tanh nodes)."""
    events = _looped(tmp_path, lengths, sample_every=1000)
    sigs = {e["step"]: e["graph_signature"] for e in events if e["kind"] == "step"}
    graphs = [e for e in events if e["kind"] == "graph"]
    tanhs = {g["step"]: sum(1 for n in g["nodes"] if n["name"] == "TanhBackward0") for g in graphs}
    return [g["step"] for g in graphs], sigs, tanhs


def test_default_mode_catches_structures_taking_turns(tmp_path: Path) -> None:
    """Two structures taking turns (2, 3, 2, 3, ...): the step after the first 3 is a 2, so
    capturing "the next step" alone would capture 2 over and over and never 3.  Each new
    structure is captured once, then nothing more."""
    captured, _, tanhs = _captures(tmp_path, [2, 3] * 15)
    assert captured == [0, 2, 3] and sorted(set(tanhs.values())) == [2, 3]


def test_default_mode_bounds_captures_when_the_graph_changes_every_step(tmp_path: Path) -> None:
    """Variable-length loops: a structure is captured the first time it can be, a structure
    seen before is not captured again, so a graph that changes every step does not make
    every other step a capture."""
    rng = torch.Generator().manual_seed(0)
    lengths = [int(n) for n in torch.randint(1, 5, (60,), generator=rng)]
    captured, sigs, tanhs = _captures(tmp_path, lengths)
    assert len(set(sigs.values())) == 4
    assert set(tanhs.values()) == {1, 2, 3, 4}  # every structure shown ...
    assert len(captured) <= 4 + 2 * 3  # ... at a bounded cost (each new one tried at most 3 times)


def test_default_mode_holds_captures_for_new_structures_to_a_budget(tmp_path: Path) -> None:
    """Dozens of structures (a loop of 1 to 30 steps, a new length almost every step): the
    captures for new structures stay within 8 plus one every 10 steps -- not a capture every
    other step -- and the early structures are still caught."""
    rng = torch.Generator().manual_seed(0)
    lengths = [int(n) for n in torch.randint(1, 31, (100,), generator=rng)]
    captured, sigs, _ = _captures(tmp_path, lengths)
    assert len(set(sigs.values())) > 25
    assert 8 <= len(captured) <= 1 + 8 + 100 // 10
    assert all(sum(1 for c in captured if c <= k) <= 1 + 8 + k // 10 for k in range(100))


def test_nan_in_loss_arms_checked_capture(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "nan.tscope"
    with torchscope.watch(model, server=None, record=path, sample_every=100) as w:  # explicit steps
        for i in range(4):
            x = torch.randn(3, 4)
            if i >= 1:
                x[0, 0] = float("nan")
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            if torch.isfinite(loss):  # the user skips bad batches: parameters stay finite
                opt.step()
            w.step()
    events = list(iter_events(path))
    steps = [e for e in events if e["kind"] == "step"]
    assert math.isnan(steps[1]["loss"]) and steps[1]["grads"]["nan"][0] > 0
    assert [e["step"] for e in events if e["kind"] == "graph"] == [0, 2]
    g = next(e for e in events if e["kind"] == "graph" and e["step"] == 2)
    flagged = [o for o in g["ops"] if "nan" in o.get("flags", ())]
    assert flagged and flagged[0]["name"] == "aten::addmm"  # the first op that produced it


def test_a_nan_at_a_sampled_step_arms_the_very_next(tmp_path: Path) -> None:
    """A NaN made at a step the schedule captures (its ops unchecked: nothing was armed yet)
    gets the step right after captured with its ops checked: it was two steps later (QA 50b:
    NaN at 100, captured 102).  A NaN that lasts is checked every other step from there."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "nan.tscope"
    with torchscope.watch(model, opt, server=None, record=path, sample_every=5):
        for i in range(20):
            out = model(torch.randn(3, 4))
            if i == 10:
                out = out * float("nan")  # the parameters are NaN from step 10's update on
            opt.zero_grad()
            out.pow(2).mean().backward()
            opt.step()
    events = list(iter_events(path))
    assert [e["step"] for e in events if e["kind"] == "step" and not math.isfinite(e["loss"])] == list(range(10, 20))
    graphs = {e["step"]: e for e in events if e["kind"] == "graph"}
    assert sorted(graphs) == [0, 5, 10, 11, 13, 15, 17, 19]
    flagged = [o for o in graphs[11]["ops"] if "nan" in o.get("flags", ())]
    assert flagged  # checked: the first op reading the NaN weights


@pytest.mark.parametrize("native", [True, False])
def test_a_nan_born_on_a_later_full_step_is_traced_to_its_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              native: bool) -> None:
    """One bad batch at step 30 of a fast full-mode loop: every step's graph reaches the file
    (a writer asleep between flushes once shed all but 16 of them), the log that made -inf
    is flagged on that unarmed step by either op recorder, and the doctor names it -- before,
    it said the op was not known."""
    from torchscope.doctor import diagnose

    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, _native._error
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "log0.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for step in range(40):
            x = torch.randn(32, 4) * (1e4 if step == 30 else 1.0)
            y = (x[:, :1] > 0).float()
            p = torch.sigmoid(model(x))
            loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()  # log(0) on the bad batch
            opt.zero_grad()
            loss.backward()
            if torch.isfinite(loss):
                opt.step()
    events = list(iter_events(path))
    # the skipped step() makes iterations 30 and 31 one step of two micro-batches: 39 steps
    stepped = [e["step"] for e in events if e["kind"] == "step"]
    assert len(stepped) == 39 and [e["step"] for e in events if e["kind"] == "graph"] == stepped
    g30 = next(e for e in events if e["kind"] == "graph" and e["step"] == 30)
    flagged = [o["name"] for o in g30["ops"] if "nan" in o.get("flags", ()) and o.get("phase") == "forward"]
    assert flagged and set(flagged) == {"aten::log"}, flagged
    g29 = next(e for e in events if e["kind"] == "graph" and e["step"] == 29)
    assert not [o for o in g29["ops"] if "nan" in o.get("flags", ())]  # a healthy step's log is not flagged
    (p4,) = [f for f in diagnose(events) if f["code"] == "P4"]
    assert "first produced by aten::log at step 30" in p4["message"], p4["message"]


def test_the_native_recorder_checks_the_same_nan_sources() -> None:
    """recorder.cpp mirrors schema.NAN_SOURCE_OPS (read as text: a list changed on one side
    only would check different ops in full mode with and without the extension)."""
    import re

    from torchscope.schema import NAN_SOURCE_OPS

    cpp = (Path(_native.__file__).parent / "native" / "recorder.cpp").read_text()
    body = cpp[cpp.index("bool nan_source("):]
    listed = set(re.findall(r'"(aten::\w+)"', body[: body.index("}")]))
    assert listed and listed == {n for n in NAN_SOURCE_OPS if not n.endswith("_")}
    assert all(n + "_" in NAN_SOURCE_OPS for n in listed)  # the in-place forms, stripped in C++


def test_full_grad_statistics_schedule(tmp_path: Path) -> None:
    """Norms every step; max/mean/std/zero fraction on step 0, every GRAD_STATS_EVERY steps and captured steps."""
    from torchscope._watch import GRAD_STATS_EVERY

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "sched.tscope"
    norms: list[list[float]] = []
    with torchscope.watch(model, opt, server=None, record=path, mode="light"):
        for _ in range(GRAD_STATS_EVERY + 1):
            loss = model(torch.randn(5, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            norms.append([p.grad.norm().item() for p in model.parameters()])  # type: ignore[union-attr]
            opt.step()
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    full = [i for i, st in enumerate(steps) if "zero_frac" in st["grads"]]
    assert full == [0, GRAD_STATS_EVERY]
    for st, expected in zip(steps, norms, strict=True):
        assert st["grads"]["norm"] == pytest.approx(expected, rel=1e-5)
        assert st["grads"]["nan"] == [0] * 4 and st["grads"]["none"] == []


@pytest.mark.parametrize("mode", ["light", "full"])
def test_complex_parameters_get_statistics_of_their_magnitudes(mode: str, tmp_path: Path) -> None:
    """A complex parameter (spectral layers, signal models): its gradient has a norm but no
    order and no real mean, so the full columns are of |g|.  One complex parameter used to turn
    gradient capture off and lose every step (aminmax has no complex kernel)."""

    class Spectral(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 8, dtype=torch.cfloat))
            self.head = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head((x.to(torch.cfloat) @ self.w).abs())

    torch.manual_seed(0)
    model = Spectral()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    path = tmp_path / "complex.tscope"
    grads: list[torch.Tensor] = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            grads.append(model.w.grad.clone())
            opt.step()
    events = list(iter_events(path))
    assert not [e for e in events if e["kind"] == "log"]
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 3
    for st, g in zip(steps, grads, strict=True):
        gs = st["grads"]
        assert gs["norm"][0] == pytest.approx(g.norm().item(), rel=1e-5)
        if mode == "full":  # every step has the full columns
            mag = g.abs().double()
            assert gs["max_abs"][0] == pytest.approx(mag.max().item(), rel=1e-6)
            assert gs["mean"][0] == pytest.approx(mag.mean().item(), rel=1e-5)
            assert gs["std"][0] == pytest.approx(mag.std().item(), rel=1e-3)
            assert gs["zero_frac"][0] == pytest.approx((g == 0).double().mean().item(), abs=1e-6)


def test_default_mode_captures_a_graph_when_step_0_had_no_backward(tmp_path: Path) -> None:
    """Step 0 is default mode's first capture; a run whose step 0 has no backward (an
    ``optimizer.step()`` before the loop) gets its first graph two steps later, not after
    ``sample_every`` steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "late.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="default", sample_every=50):
        opt.step()  # nothing to apply yet: a step without forward or backward
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
    events = list(iter_events(path))
    assert [e["step"] for e in events if e["kind"] == "step"] == [0, 1, 2, 3, 4, 5]
    assert [e["step"] for e in events if e["kind"] == "graph"] == [2]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_loss_reduction_and_divisor_are_recorded(tmp_path: Path, mode: str) -> None:
    """P15 needs how each micro-batch's loss is scaled: the loss node's reduction (read from
    the node, as autograd saved it) and the number a scalar loss is divided or multiplied by."""
    model = nn.Linear(8, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "losses.tscope"
    x, y, cls = torch.randn(8, 8), torch.randn(8, 3), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    losses = [
        lambda: nn.functional.mse_loss(model(x), y, reduction="sum") / 4,
        lambda: nn.functional.cross_entropy(model(x), cls) * 0.25,
        lambda: nn.functional.mse_loss(model(x), y, reduction="none").mean(),
    ]
    with torchscope.watch(model, opt, server=None, record=path, mode=mode, sample_every=1):
        for make_loss in losses:
            opt.zero_grad()
            loss = make_loss()
            loss.backward()
            opt.step()
    graphs = {e["step"]: e for e in iter_events(path) if e["kind"] == "graph"}
    assert sorted(graphs) == [0, 1, 2]

    def facts(step: int) -> list[tuple[str, Any, Any]]:
        return [(n["name"], n.get("reduction"), n.get("scalar")) for n in graphs[step]["nodes"]
                if "reduction" in n or "scalar" in n]

    assert facts(0) == [("DivBackward0", None, 4.0), ("MseLossBackward0", "sum", None)]
    assert facts(1) == [("MulBackward0", None, 0.25), ("NllLossBackward0", "mean", None)]
    assert facts(2) == [("MseLossBackward0", "none", None)]


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_root_pre_hook_registered_before_watch_is_in_the_forward(tmp_path: Path, mode: str) -> None:
    """The user's forward pre-hook on the model itself (registered before ``watch()``) runs inside
    the step's forward: its ops are recorded, as the root's, and its grad_fn node has its op
    (was: neither; found by QA)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1))
    scale = nn.Parameter(torch.tensor(2.0))
    model.register_parameter("scale", scale)
    model.register_forward_pre_hook(lambda mod, args: (args[0] * mod.scale,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "hook.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(5, 4)).pow(2).mean().backward()
            opt.step()
    g = next(e for e in iter_events(path) if e["kind"] == "graph")
    fwd = [o for o in g["ops"] if o["phase"] == "forward"]
    assert (fwd[0]["name"], fwd[0]["module"]) == ("aten::mul", ""), fwd[:3]
    (mul,) = [n for n in g["nodes"] if n["name"] == "MulBackward0"]
    assert mul.get("op") == fwd[0]["id"], mul
