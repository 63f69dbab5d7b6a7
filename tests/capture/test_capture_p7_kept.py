"""P7: what keeps earlier steps' graphs alive, and how much of them.

A recurrent state carried from batch to batch without ``.detach()``, each backward run with
``retain_graph=True`` and the weights updated through ``.data`` (as the classic
word-language-model loop does; an optimizer's in-place update would make the second backward
fail instead, which P8 reports), nests each step's graph in the next: the capture counts each
step's graph once -- the nodes its backward added to the earlier ones' -- and the bytes those
graphs still hold saved for backward (``memory.kept``); both grow by one step's worth a step,
not by all the earlier steps' again.

A loss kept by the user's own arithmetic (``running += loss``) is pointed at that line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope import _native
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

STEPS = 6


class _Cell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(8, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.cell(x, h)
        return self.head(h), h


def _interior_new(root: Any, seen: dict[int, Any]) -> int:
    """Interior nodes (all but AccumulateGrad) below ``root`` not in ``seen``, added to it: the
    test's own walk of ``next_functions``, over nodes it holds (ids are not reused meanwhile)."""
    stack, added = [root], 0
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen[id(n)] = n
        added += type(n).__name__ != "AccumulateGrad"
        stack.extend(c for c, _ in n.next_functions)
    return added


def _train(path: Path | None, detach: bool, mode: str = "default") -> tuple[list[int], list[int]]:
    """The loop, watched when ``path`` is given.  Unwatched, the figures: per step, the nodes
    its backward walked for the first time, and those of the state's graph made this step."""
    torch.manual_seed(0)
    model = _Cell()
    walked: dict[int, Any] = {}
    states: dict[int, Any] = {}
    by_loss: list[int] = []
    by_state: list[int] = []
    watch = torchscope.watch(model, server=None, record=path, mode=mode) if path is not None else None
    h = torch.zeros(4, 16)
    for _ in range(STEPS):
        y, h = model(torch.randn(4, 8), h.detach() if detach else h)
        loss = y.pow(2).mean()
        model.zero_grad()
        loss.backward(retain_graph=True)
        with torch.no_grad():
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.01)
        if watch is None:
            by_loss.append(_interior_new(loss.grad_fn, walked))
            by_state.append(_interior_new(h.grad_fn, states))
    if watch is not None:
        watch.close()
    return by_loss, by_state


def _steps(path: Path) -> list[dict[str, Any]]:
    return [e for e in iter_events(path) if e["kind"] == "step"]


@pytest.mark.parametrize(("native", "mode"), [(True, "default"), (False, "default"), (True, "full")])
def test_p7_a_state_never_detached_counts_each_steps_graph_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 native: bool, mode: str) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, _native._error
    by_loss, by_state = _train(None, detach=False)
    path = tmp_path / "state.tscope"
    _train(path, detach=False, mode=mode)
    steps = _steps(path)
    alive = [st["graphs_alive"] for st in steps]
    # at boundary k, the graphs of steps 0..k-1 each once: step 0's at its backward's size (its
    # output is not known to be a state until step 1's graph takes it in), each later one at
    # what its state added -- before, each step's count held all the earlier ones again
    # (0, 20, 56, 108, ...: quadratic)
    assert by_state[1] > 0 and by_state[1] < by_loss[1]
    assert alive == [0, *(by_loss[0] + sum(by_state[1:k]) for k in range(1, STEPS))]
    kept = [st["memory"].get("kept", 0) for st in steps]
    growth = [b - a for a, b in zip(kept, kept[1:], strict=False)]
    assert kept[0] == 0 and growth[0] > 0 and len(set(growth[1:])) == 1 and growth[1] > 0
    # this step's own saved activations: the same every step, the earlier ones being in `kept`
    assert len({st["memory"]["saved"] for st in steps}) == 1
    assert [st["graphs_kept"]["of"] for st in steps[1:]] == ["state"] * (STEPS - 1)
    (p7,) = [f for f in diagnose(iter_events(path)) if f["code"] == "P7"]
    assert "without `.detach()`" in p7["message"] and "memory (live + kept) +" in p7["message"]
    assert p7["src"] is not None and p7["src"].endswith(f":{_forward_line()}")


def test_p7_a_state_detached_keeps_nothing(tmp_path: Path) -> None:
    path = tmp_path / "detached.tscope"
    _train(path, detach=True)
    steps = _steps(path)
    assert [st["graphs_alive"] for st in steps] == [0] * STEPS
    assert all("kept" not in st["memory"] for st in steps)
    assert not [f for f in diagnose(iter_events(path)) if f["code"] == "P7"]


def _forward_line() -> int:
    """The line of this file's training forward (what P7 points at for a carried state)."""
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "y, h = model(" in line)


@pytest.mark.parametrize("where", ["after_step", "before_backward", "in_a_list"])
def test_p7_points_at_the_line_that_keeps_the_loss(tmp_path: Path, where: str) -> None:
    """``running += loss`` after the step, ``total = total + loss`` before the backward: P7's
    source is that line, not the backward's.  ``history.append(loss)`` is no torch call: the
    backward's line stays."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / f"{where}.tscope"
    running: Any = 0.0
    history = []
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(8):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad()
            if where == "before_backward":
                running = running + loss  # keeps: before the backward
            loss.backward()
            opt.step()
            if where == "after_step":
                running += loss  # keeps: after the step
            elif where == "in_a_list":
                history.append(loss)
    (p7,) = [f for f in diagnose(iter_events(path)) if f["code"] == "P7"]
    want = {"after_step": "running += loss", "before_backward": "running = running + loss",
            "in_a_list": "loss.backward()"}[where]
    assert p7["src"] is not None and _line(p7["src"]).startswith(want)


def _line(src: str) -> str:
    """The source line a ``file:line`` of this test file names."""
    name, _, line = src.rpartition(":")
    assert name == Path(__file__).name
    return Path(__file__).read_text().splitlines()[int(line) - 1].strip()


class _Trainer:
    """A loop in a class, its history of losses an attribute."""

    def __init__(self, path: Path) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.losses: list[torch.Tensor] = []
        self.path = path

    def fit(self, steps: int) -> None:
        with torchscope.watch(self.model, self.opt, server=None, record=self.path):
            for _ in range(steps):
                loss = self.model(torch.randn(4, 8)).pow(2).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                self.losses.append(loss)


class _Tracker:
    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []


class _History:
    def __init__(self) -> None:
        self.history: dict[str, list[torch.Tensor]] = {"loss": []}


@pytest.mark.parametrize("where", ["local_list", "local_dict", "attribute", "tracker", "dict_attribute", "imported_module",
                                   "last_loss_only"])
def test_p7_names_the_container_that_keeps_the_losses(tmp_path: Path, where: str) -> None:
    """``history.append(loss)`` is no torch call the mode could see: once losses of two earlier
    steps are alive, the garbage collector's referrers name what holds them -- a list in a
    local variable, an instance's attribute.  A loop keeping only its last loss (``loss`` until
    the next iteration) names nothing: no P7 either."""
    path = tmp_path / f"{where}.tscope"
    if where == "attribute":
        _Trainer(path).fit(8)
    else:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        history: Any = {} if where == "local_dict" else []
        tracker, log = _Tracker(), _History()
        with torchscope.watch(model, opt, server=None, record=path):
            if where == "imported_module":  # a function of another module, its tracker a global there
                import p7_tracker

                p7_tracker.tracker.losses.clear()
                p7_tracker.loop(model, opt, 8)
            for i in range(8 if where != "imported_module" else 0):
                loss = model(torch.randn(4, 8)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if where == "local_list":
                    history.append(loss)
                elif where == "local_dict":
                    history[i] = loss
                elif where == "tracker":  # another object's attribute: named by the object's name (was '.losses')
                    tracker.losses.append(loss)
                elif where == "dict_attribute":  # a list in an attribute's dict (QA 47c: "'.loss' (a list)")
                    log.history["loss"].append(loss)
    held = {e["graphs_kept"].get("held_in") for e in _steps(path) if "graphs_kept" in e} - {None}
    p7 = [f for f in diagnose(iter_events(path)) if f["code"] == "P7"]
    if where == "last_loss_only":
        assert held == set() and p7 == []
        return
    want = {"local_list": "'history' (a list)", "local_dict": "'history' (a dict)", "attribute": "'self.losses' (a list)",
            "tracker": "'tracker.losses' (a list)", "dict_attribute": "'log.history[\"loss\"]' (a list)",
            "imported_module": "'tracker.losses' (a list)"}[where]
    assert held == {want}
    assert len(p7) == 1 and f"held by {want}" in p7[0]["message"], p7
    # the example is the loop's own code (QA 46a: a canned name; QA 46e: append() for a dict)
    code = {"local_list": "`history.append(loss)`", "local_dict": "`history[key] = loss`",
            "attribute": "`self.losses.append(loss)`", "tracker": "`tracker.losses.append(loss)`",
            "dict_attribute": "`log.history[\"loss\"].append(loss)`", "imported_module": "`tracker.losses.append(loss)`"}[where]
    assert code in p7[0]["message"], p7[0]["message"]


def test_an_average_of_losses_names_no_variable(tmp_path: Path) -> None:
    """``smooth = 0.98 * smooth + 0.02 * loss``: each step's loss tensor is gone, its graph held
    by the average's.  The loop's variable naming the latest loss is no holder (QA 46a: "held by
    'cur' (a variable)"); the line is the average's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "ema.tscope"
    smooth = None
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(12):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            cur = loss
            smooth = cur if smooth is None else 0.98 * smooth + 0.02 * cur  # (the average)
    held = {e["graphs_kept"].get("held_in") for e in _steps(path) if "graphs_kept" in e} - {None}
    assert held == set(), held
    (p7,) = [f for f in diagnose(iter_events(path)) if f["code"] == "P7"]
    assert p7["src"] is not None and _line(p7["src"]).endswith("# (the average)"), p7


class _Epoch:
    """A Lightning-style module keeping each batch's probabilities for the epoch's metric."""

    def __init__(self, path: Path) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.opt = torch.optim.Adam(self.model.parameters())
        self.path = path
        self.outputs: list[dict[str, torch.Tensor]] = []

    def fit(self, steps: int, detach: bool) -> None:
        with torchscope.watch(self.model, self.opt, server=None, record=self.path):
            for _ in range(steps):
                x = torch.randn(4, 8)
                logits = self.model(x).squeeze(1)
                loss = nn.functional.binary_cross_entropy_with_logits(logits, (x[:, 0] > 0).float())
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                probs = torch.sigmoid(logits)
                self.outputs.append({"probs": probs.detach() if detach else probs, "loss": loss.detach()})


@pytest.mark.parametrize("where", ["local_list", "attribute", "detached"])
def test_p7_names_the_list_that_keeps_outputs(tmp_path: Path, where: str) -> None:
    """``all_probs.append(torch.sigmoid(logits))`` for an epoch's accuracy keeps each step's
    forward graph: P7 pointed at the forward's line and said "kept in a list" without saying
    which (QA 44b).  The list that grows between boundaries holding tensors with a grad_fn is
    told: an attribute or a function's local by its name; with ``.detach()`` nothing is kept, nor told."""
    path = tmp_path / f"{where}.tscope"
    if where == "local_list":
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        all_probs, pair = [], [torch.ones(1, requires_grad=True) * 2, torch.ones(1, requires_grad=True) * 3]
        with torchscope.watch(model, opt, server=None, record=path):
            for _ in range(8):
                logits = model(torch.randn(4, 8))
                loss = logits.pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                all_probs.append(torch.sigmoid(logits))
        assert pair[0].grad_fn is not None  # (a list of two graphs that does not grow is no holder)
    else:
        _Epoch(path).fit(8, detach=where == "detached")
    held = {e["graphs_kept"].get("held_in") for e in _steps(path) if "graphs_kept" in e} - {None}
    p7 = [f for f in diagnose(iter_events(path)) if f["code"] == "P7"]
    if where == "detached":
        assert held == set() and p7 == []
        return
    # a function's local list is named too, its frame's locals read without leaving them a
    # snapshot that would keep the loop's tensors alive (test_naming_the_list_keeps_no_step...)
    want = {"local_list": "'all_probs' (a list)", "attribute": "'self.outputs' (a list)"}[where]
    assert len(held) == 1 and next(iter(held)).startswith(want), held
    told = "the model's outputs, or tensors computed from them, stay referenced after their step, held by "
    assert len(p7) == 1 and told + want in p7[0]["message"], p7
    code = {"local_list": "`all_probs.append(", "attribute": "`self.outputs.append("}[where]
    assert code in p7[0]["message"], p7[0]["message"]
    # an example of the kind, not the user's line read back (QA 48a: it read as what they wrote)
    assert f"(as {code}out)`" in p7[0]["message"], p7[0]["message"]


def test_naming_the_list_keeps_no_step_of_the_loop_alive(tmp_path: Path) -> None:
    """Naming ``'history'`` reads the loop's local variables.  In CPython before 3.13 that
    leaves a snapshot of them on the frame, which kept the loss (and so the graph) of the step
    it was read at alive after the loop emptied its list and rebound its variables.  Once the
    list is emptied, only the loss the loop's variable still names is alive."""
    import gc
    import weakref

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    history = []
    refs = []
    path = tmp_path / "run.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(8):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(loss)
            refs.append(weakref.ref(loss))
        history.clear()
        gc.collect()
        alive = [i for i, r in enumerate(refs) if r() is not None]
        assert alive == [7], alive
    held = {e["graphs_kept"].get("held_in") for e in _steps(path) if "graphs_kept" in e} - {None}
    assert held == {"'history' (a list)"}


def _train_with_cfg(path: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, lr = torch.randn(4, 8), 0.01
    cfg = locals()  # "save my hyper-parameters": in CPython before 3.13, the frame's snapshot itself
    history = []
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(8):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(loss)
    return cfg


def test_a_dict_locals_returned_keeps_its_entries(tmp_path: Path) -> None:
    """``cfg = locals()`` at the top of the training function is, before Python 3.13, the very
    dict the frame's ``f_locals`` snapshot is: naming ``history`` dropped its tensors from it,
    and the user's ``cfg["x"]`` raised ``KeyError`` (QA 46e).  A snapshot anyone else holds is
    left as it is."""
    cfg = _train_with_cfg(tmp_path / "cfg.tscope")
    assert {"model", "opt", "x", "lr"} <= set(cfg), sorted(cfg)
    assert isinstance(cfg["x"], torch.Tensor) and cfg["x"].shape == (4, 8)
    held = {e["graphs_kept"].get("held_in") for e in _steps(tmp_path / "cfg.tscope") if "graphs_kept" in e} - {None}
    assert held == {"'history' (a list)"}
