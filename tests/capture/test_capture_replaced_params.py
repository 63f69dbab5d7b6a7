"""Parameters replaced under the names ``watch()`` found -- ``to_empty()`` of a model built on
the meta device, ``load_state_dict(..., assign=True)`` mid-run (a resume) -- are followed by
name: their gradient statistics, memory and names in captured graphs are the new tensors'
(they were all None and 0 from then on, a dead parameter's name could label a new one whose
``id()`` it reused, and the run was told the model had "gained" parameters)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope.sessionfile import iter_events


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 4))


def _walk_names(loss: torch.Tensor, names: dict[int, str]) -> set[tuple[str, str]]:
    """(parent node, parameter name) of every AccumulateGrad under ``loss``, by our own walk."""
    out, seen, todo = set(), set(), [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        for child, _ in fn.next_functions:
            if child is not None and type(child).__name__ == "AccumulateGrad":
                out.add((type(fn).__name__, names[id(child.variable)]))
            todo.append(child)
    return out


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, norms: list[list[float]],
           walked: list[set[tuple[str, str]]]) -> None:
    names = {id(p): n for n, p in model.named_parameters()}
    for _ in range(steps):
        opt.zero_grad()
        loss = (model(torch.randn(8, 16)) - torch.randn(8, 4)).pow(2).mean()
        walked.append(_walk_names(loss, names))
        loss.backward()
        norms.append([float(p.grad.norm()) for p in model.parameters()])  # type: ignore[union-attr]
        opt.step()


def _check(path: Path, model: nn.Module, norms: list[list[float]], walked: list[set[tuple[str, str]]]) -> list[Any]:
    events = list(iter_events(path))
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == len(norms)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for e, want in zip(steps, norms, strict=True):
        assert e["grads"]["none"] == []
        assert e["grads"]["norm"] == pytest.approx(want, rel=1e-5)
        assert e["memory"]["params"] == nbytes and e["memory"]["grads"] == nbytes
    for g in (e for e in events if e["kind"] == "graph"):
        nodes = {n["id"]: n for n in g["nodes"]}
        labels = {(nodes[a]["name"], nodes[c]["param"]) for a, c, _ in g["edges"]
                  if nodes[c]["name"] == "AccumulateGrad"}
        assert labels == walked[g["step"]]
    return [e for e in events if e["kind"] == "log"]


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_model_watched_on_meta_then_materialised(tmp_path: Path, mode: str) -> None:
    for _trial in range(4):  # new parameters often reuse the dead meta ones' ids
        with torch.device("meta"):
            model = _model()
        path = tmp_path / f"meta{_trial}.tscope"
        norms: list[list[float]] = []
        walked: list[set[tuple[str, str]]] = []
        with torchscope.watch(model, server=None, record=path, mode=mode):
            model.to_empty(device="cpu")
            torch.manual_seed(0)
            for m in model.modules():
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            _train(model, opt, 6, norms, walked)
        logs = _check(path, model, norms, walked)
        assert not [e for e in logs if "gained" in e["message"]]
        # the session is the materialised model's: where it trains, not "meta" (it waits for the
        # first forward, as a lazy model's does); that forward is no lazy dry run
        events = list(iter_events(path))
        session = events[0]
        assert session["kind"] == "session" and session["device"] == "cpu"
        assert {p["device"] for p in session["params"]} == {"cpu"}
        first = next(e for e in events if e["kind"] == "step")
        assert not any(f.get("materialized") for f in first["forwards"])


@pytest.mark.parametrize("mode", ["light", "full"])
def test_a_resume_with_load_state_dict_assign(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / "resume.tscope"
    norms: list[list[float]] = []
    walked: list[set[tuple[str, str]]] = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        _train(model, opt, 4, norms, walked)
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(saved, assign=True)  # new tensors under the same names
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        _train(model, opt, 4, norms, walked)
    logs = _check(path, model, norms, walked)
    assert not [e for e in logs if "gained" in e["message"]]
