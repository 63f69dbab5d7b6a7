"""A BatchNorm inside a non-reentrant ``torch.utils.checkpoint`` segment keeps its running
statistics bit for bit.  Recording a captured step's graph read a saved operand of the
segment's last ``mul`` (Dropout's mask, ``x * sigmoid(x)``) to see what a loss is scaled by;
unpacking it ran checkpoint's hook, which recomputes the segment -- the BatchNorm's forward
once more, its running mean, variance and ``num_batches_tracked`` moved on each captured step
(QA 46b: 9 batches tracked for 8).  Losses and parameters did not show it; the saved model's
evaluation did.  And a checkpoint's recompute of the whole model is no forward of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import torchscope

TAILS = {"dropout": lambda: nn.Dropout(0.1), "swish": lambda: _Swish()}


class _Swish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


class _Net(nn.Module):
    def __init__(self, tail: str) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.seg = nn.Sequential(nn.BatchNorm1d(16), TAILS[tail]())
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.seg, self.stem(x), use_reentrant=False))


def _train(tail: str, mode: str | None, path: Path) -> tuple[dict[str, torch.Tensor], list[float]]:
    torch.manual_seed(0)
    model = _Net(tail)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    losses = []
    w = torchscope.watch(model, opt, server=None, record=path, mode=mode) if mode else None
    for _ in range(4):
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 2, (16,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if w is not None:
        w.close()
    return {k: v.clone() for k, v in model.state_dict().items()}, losses


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("tail", sorted(TAILS))
def test_batchnorm_in_a_checkpoint_segment_keeps_its_statistics(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tail: str, mode: str, native: bool) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    plain, plain_losses = _train(tail, None, tmp_path / "plain.tscope")
    watched, losses = _train(tail, mode, tmp_path / "run.tscope")
    assert losses == plain_losses
    # (the backward recomputes the segment: two of its forwards a step, also without torchscope)
    assert int(watched["seg.0.num_batches_tracked"]) == int(plain["seg.0.num_batches_tracked"]) == 8
    for k, v in plain.items():
        assert torch.equal(watched[k], v), k


@pytest.mark.parametrize("mode", ["light", "default", "full"])
@pytest.mark.parametrize("how", ["whole", "sequential"])
def test_a_recompute_inside_the_backward_is_no_forward_of_the_step(tmp_path: Path, mode: str, how: str) -> None:
    """``checkpoint(model, x, use_reentrant=False)`` and ``checkpoint_sequential`` run the
    model's forward again inside the backward: the same forward, not one more of the step (QA
    46b: two or three forwards a step, and a P6 info, "forward passes ... that no backward()
    used", on every step of checkpoint_sequential)."""
    from torch.utils.checkpoint import checkpoint_sequential

    from torchscope.doctor import diagnose
    from torchscope.sessionfile import iter_events

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / "ckpt.tscope"
    losses = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(6):
            x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
            opt.zero_grad()
            out = (checkpoint(model, x, use_reentrant=False) if how == "whole"
                   else checkpoint_sequential(model, 2, x, use_reentrant=False))
            loss = nn.functional.cross_entropy(out, y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    events = list(iter_events(path))
    steps = [e for e in events if e["kind"] == "step"]
    assert [st["loss"] for st in steps] == pytest.approx(losses)
    # the whole model: one forward a step; checkpoint_sequential calls its parts (each one a
    # forward of the model, from the step after the first: see README's "Not done yet")
    want = 1 if how == "whole" else len(model)
    assert all(len(st["forwards"]) == want for st in steps[1:]), [len(st["forwards"]) for st in steps]
    assert all(st["no_backward_forwards"] == 0 for st in steps)
    assert not [f for f in diagnose(events) if f["code"] in ("P6", "P11")]


def _reentrant_run(path: Path | None, mode: str, input_grad: bool) -> tuple[list[float], dict[str, torch.Tensor], list[list[float]]]:
    """The whole watched model under ``checkpoint(model, x, use_reentrant=True)``: its losses,
    its state afterwards and each step's gradient norms (plain PyTorch's when ``path`` is None)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    losses, norms = [], []
    w = torchscope.watch(model, opt, server=None, record=path, mode=mode) if path is not None else None
    for _ in range(5):
        x, y = torch.randn(16, 8, generator=g).requires_grad_(input_grad), torch.randn(16, 1, generator=g)
        opt.zero_grad()
        loss = ((checkpoint(model, x, use_reentrant=True) - y) ** 2).mean()
        try:
            loss.backward()
        except RuntimeError:  # no input requires grad: the loss has no grad_fn, as without torchscope
            break
        opt.step()
        losses.append(loss.item())
        norms.append([p.grad.norm().item() for p in model.parameters() if p.grad is not None])
    if w is not None:
        w.close()
    return losses, {k: v.clone() for k, v in model.state_dict().items()}, norms


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_the_whole_model_in_a_reentrant_checkpoint_is_a_training_forward(tmp_path: Path, mode: str) -> None:
    """``checkpoint(model, x, use_reentrant=True)`` runs the model's forward under no_grad and
    again, with autograd, inside the backward.  The step's backward went through it and trained
    the model: recorded so, with its gradients and (full) its graph, and no P11 for an
    "evaluation" in train mode (QA 46b: no backward recorded, no loss, no gradients, "Train mode
    in a no_grad forward of every step")."""
    from torchscope.doctor import diagnose
    from torchscope.sessionfile import iter_events

    path = tmp_path / "reentrant.tscope"
    plain_losses, plain_state, plain_norms = _reentrant_run(None, mode, True)
    losses, state, _ = _reentrant_run(path, mode, True)
    assert losses == plain_losses
    for k, v in plain_state.items():
        assert torch.equal(state[k], v), k
    events = list(iter_events(path))
    steps = [e for e in events if e["kind"] == "step"]
    assert [st["loss"] for st in steps] == pytest.approx(plain_losses)
    assert all(st["micro_batches"] == 1 and st["backward_us"] > 0 for st in steps)
    for st in steps:
        (fwd,) = st["forwards"]
        assert fwd["checkpoint"] is True and fwd["grad_mode"] is False
        assert fwd["built_graph"] is True and fwd["backward"] is True
    assert [st["grads"]["norm"] for st in steps] == [pytest.approx(n, rel=1e-5) for n in plain_norms]
    if mode == "full":
        assert all(st["graph_captured"] for st in steps)
    # the batch norm's statistics, updated again by the recompute, are the one thing told -- where
    # a graph shows the checkpoint (test_doctor_p11_checkpoint_bn.py)
    findings = diagnose(events)
    twice = [f for f in findings if f["code"] == "P11" and "twice" in f["title"]]
    assert [f for f in findings if f not in twice] == []
    assert [f["modules"] for f in twice] == ([] if mode == "light" else [["1"]])


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_reentrant_checkpoint_with_no_input_that_requires_grad_is_named(tmp_path: Path, mode: str) -> None:
    """No input of a reentrant checkpoint requires grad: its output has no graph and backward()
    fails, as without torchscope.  The doctor names the checkpoint and use_reentrant=False, not
    a forward written under torch.no_grad() by mistake."""
    from torchscope.doctor import diagnose
    from torchscope.sessionfile import iter_events

    path = tmp_path / "cut.tscope"
    assert _reentrant_run(path, mode, False)[0] == []
    (finding,) = diagnose(list(iter_events(path)))
    assert finding["code"] == "P1" and finding["severity"] == "error"
    assert "torch.utils.checkpoint with use_reentrant=True" in finding["message"]
    assert "use_reentrant=False" in finding["fix"]
    assert "torch.no_grad() block" not in finding["fix"]


@pytest.mark.parametrize("eval_mode", [True, False], ids=["eval", "train_mode"])
def test_an_evaluation_through_a_reentrant_checkpoint_under_no_grad_is_an_evaluation(tmp_path: Path, eval_mode: bool) -> None:
    """``with torch.no_grad(): checkpoint(model, x, use_reentrant=True)`` every third step: no
    graph, no backward -- an evaluation, not the training forward (QA 47c: the backward was
    credited to it, and P11 read "Training while the model is in eval mode" at its line).  Left
    in train mode, its batch-norm and dropout are P11's "Evaluating ... in train mode"."""
    from torchscope.doctor import diagnose
    from torchscope.sessionfile import iter_events

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    path = tmp_path / "eval.tscope"
    xv, yv = torch.randn(16, 8), torch.randint(0, 3, (16,))
    with torchscope.watch(model, opt, server=None, record=path):
        for i in range(9):
            model.train()
            x, y = torch.randn(16, 8, requires_grad=True), torch.randint(0, 3, (16,))
            loss = nn.functional.cross_entropy(checkpoint(model, x, use_reentrant=True), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i % 3 == 1:  # (after steps 1, 4, 7: each followed by a step that ends)
                if eval_mode:
                    model.eval()
                with torch.no_grad():
                    nn.functional.cross_entropy(checkpoint(model, xv, use_reentrant=True), yv)
    events = list(iter_events(path))
    forwards = [f for e in events if e["kind"] == "step" for f in e["forwards"]]
    assert len(forwards) == 12 and all(f["checkpoint"] for f in forwards)
    trained = [f for f in forwards if f["backward"]]
    assert len(trained) == 9 and all(f["training"] and f["built_graph"] for f in trained)
    evaluations = [f for f in forwards if not f["backward"]]
    assert len(evaluations) == 3 and all(not f["built_graph"] and f["training"] is not eval_mode for f in evaluations)
    p11 = [f for f in diagnose(events) if f["code"] == "P11" and "twice" not in f["title"]]
    if eval_mode:
        assert p11 == [], [f["message"] for f in p11]
    else:
        (finding,) = p11
        assert finding["message"].startswith("Evaluating with '1' (BatchNorm1d), '3' (Dropout) in train mode"), finding


def test_another_models_reentrant_checkpoint_is_not_the_steps(tmp_path: Path) -> None:
    """The watched model and an unwatched one, each under its own reentrant checkpoint, each
    with its loss and optimizer: only the watched one's backward is the step's (QA 47c: the
    other's loss was summed into the step, and its divergence blamed on the watched model)."""
    from torchscope.sessionfile import iter_events

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    other = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt, other_opt = torch.optim.Adam(model.parameters(), lr=1e-2), torch.optim.SGD(other.parameters(), lr=0.01)
    path = tmp_path / "two.tscope"
    losses = []
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(5):
            x, y = torch.randn(16, 8, requires_grad=True), torch.randint(0, 3, (16,))
            loss = nn.functional.cross_entropy(checkpoint(model, x, use_reentrant=True), y)
            opt.zero_grad()
            loss.backward()
            other_loss = checkpoint(other, torch.randn(16, 8, requires_grad=True), use_reentrant=True).pow(2).mean()
            other_opt.zero_grad()
            other_loss.backward()
            other_opt.step()
            opt.step()
            losses.append(loss.item())
    steps = [e for e in iter_events(path) if e["kind"] == "step"]
    assert [st["micro_batches"] for st in steps] == [1] * 5
    assert [st["loss"] for st in steps] == pytest.approx(losses)
