"""Loops that compute their gradients with ``torch.autograd.grad`` and assign ``p.grad``
themselves (meta-learning, multi-task gradient surgery, ports of JAX code): each call for the
watched parameters' gradients is a backward pass of the step, with its loss and graph.  Before,
such steps had no loss, no backward and, in default mode, no graph."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _walk_size(root: torch.Tensor) -> int:
    seen, stack = set(), [root.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(c for c, _ in fn.next_functions)
    return len(seen)


def _run(mode: str | None, path: Path, tasks: int) -> tuple[list[float], list[list[float]], list[int]]:
    """``tasks`` losses a step, each differentiated with autograd.grad; their sum assigned."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, tasks))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    g = torch.Generator().manual_seed(1)
    w = torchscope.watch(model, opt, server=None, record=path, mode=mode) if mode else None
    losses, norms, sizes = [], [], []
    for _ in range(4):
        x = torch.randn(8, 6, generator=g)
        # an input gradient (saliency): not a gradient of the parameters, not a backward pass
        xr = x.clone().requires_grad_(True)
        torch.autograd.grad(model(xr).sum(), xr)
        out = model(x)
        total = [torch.zeros_like(p) for p in params]
        for t in range(tasks):
            loss = out[:, t].square().mean()
            sizes.append(_walk_size(loss))
            grads = torch.autograd.grad(loss, params, retain_graph=t < tasks - 1)
            total = [a + b for a, b in zip(total, grads, strict=True)]
            losses.append(loss.item())
        for p, gr in zip(params, total, strict=True):
            p.grad = gr
        norms.append([gr.norm().item() for gr in total])
        opt.step()
    if w is not None:
        w.close()
    return losses + [float(p.detach().sum()) for p in params], norms, sizes


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("tasks", [1, 2])
def test_autograd_grad_loop(mode: str, tasks: int, tmp_path: Path) -> None:
    path = tmp_path / "g.tscope"
    plain, _, _ = _run(None, tmp_path / "plain.tscope", tasks)
    watched, norms, sizes = _run(mode, path, tasks)
    assert watched == plain  # training untouched
    events = list(iter_events(path))
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 4
    for i, s in enumerate(steps):
        assert s["micro_batches"] == tasks  # the parameters' passes; the input gradient is not one
        assert s["losses"] == pytest.approx(watched[i * tasks : (i + 1) * tasks], rel=1e-6)
        assert s["grads"]["norm"] == pytest.approx(norms[i], rel=1e-5)
        assert s["grads"]["pre_nonzero"] == []  # .grad is assigned, never accumulated into
        assert sum(e["what"] == "autograd_grad" for e in s["events"]) == tasks
    graphs = [e for e in events if e["kind"] == "graph"]
    if mode != "light":
        assert graphs and graphs[0]["step"] == 0 and len(graphs[0]["nodes"]) == sizes[0]
        executed = [n for n in graphs[0]["nodes"] if "order" in n]
        # autograd.grad runs the graph but no AccumulateGrad: the gradients are returned
        assert executed and not any(n["name"] == "AccumulateGrad" for n in executed)
    # no missing zero_grad (P5) for assigned gradients, no unscaled accumulation (P15)
    found = {f["code"] for f in diagnose(events)}
    assert not found & {"P5", "P15"}, found


def _manual(mode: str | None, path: Path, subset: bool) -> tuple[list[float], list[list[float]]]:
    """No optimizer, no ``.grad``: ``autograd.grad`` and ``p -= lr * g`` (MAML's inner loop, a
    JAX port); with ``subset``, only the head's parameters are asked for and updated."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    params = list(model.parameters())
    asked = params[2:] if subset else params
    g = torch.Generator().manual_seed(1)
    norms = []
    with torchscope.watch(model, server=None, record=path, mode=mode) if mode else nullcontext():
        for _ in range(5):
            x = torch.randn(8, 6, generator=g)
            loss = nn.functional.mse_loss(model(x), x[:, :1].sin())
            grads = torch.autograd.grad(loss, asked)
            norms.append([gr.norm().item() for gr in grads])
            with torch.no_grad():
                for p, gr in zip(asked, grads, strict=True):
                    p -= 0.05 * gr
    return [float(p.detach().sum()) for p in params], norms


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("subset", [False, True])
def test_returned_gradients_of_a_hand_written_update_are_the_steps(mode: str, subset: bool, tmp_path: Path) -> None:
    """Their statistics come from what ``autograd.grad`` returned (``.grad`` stays None), so
    the gradients view has them and the doctor does not call them missing (a false P1 error
    before); parameters no pass asked for are left out by design, as with backward(inputs=)."""
    plain, _ = _manual(None, tmp_path / "plain.tscope", subset)
    watched, norms = _manual(mode, tmp_path / "g.tscope", subset)
    assert watched == plain
    events = list(iter_events(tmp_path / "g.tscope"))
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 5
    for s, want in zip(steps, norms, strict=True):
        got = s["grads"]["norm"]
        assert got[2:] == pytest.approx(want[-2:], rel=1e-5)
        if subset:
            assert got[:2] == [None, None] and s["grads"]["not_trained"] == [0, 1]
        else:
            assert got[:2] == pytest.approx(want[:2], rel=1e-5) and "not_trained" not in s["grads"]
        assert s["grads"]["none"] == ([0, 1] if subset else [])  # not_trained tells the doctor why
    assert not [f for f in diagnose(events) if f["code"] in {"P1", "P5", "P15"}]
