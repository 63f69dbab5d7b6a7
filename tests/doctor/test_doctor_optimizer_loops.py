"""The optimizer side of a loop, on real captures: zero_grad() inside the loop over
micro-batches (P5: only the last micro-batch's gradients reach optimizer.step()), an optimizer
built over another instance of the model (it steps none of the watched parameters), and two
optimizers stepping one model's parts (each one's parameters are trained).  And the loops that
look alike and are right: LBFGS's closure, an adversarial example's input-gradient pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def _diagnose(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    events = list(iter_events(path))
    return [dict(f) for f in diagnose(events)], [ev for ev in events if ev["kind"] == "step"]


def _accumulate(model: nn.Module, opt: torch.optim.Optimizer, inside: bool, steps: int = 4, k: int = 4) -> list[float]:
    """Gradient accumulation over k micro-batches; with ``inside``, zero_grad() in the micro-batch loop.
    Returns the gradient norm of the first parameter at each optimizer.step()."""
    norms = []
    data = iter(_batches(steps * k))
    for _ in range(steps):
        if not inside:
            opt.zero_grad()
        for _ in range(k):
            if inside:
                opt.zero_grad()  # the zero_grad inside
            x, y = next(data)
            loss = F.cross_entropy(model(x), y) / k
            loss.backward()  # the one backward line
        norms.append(float(next(model.parameters()).grad.norm()))
        opt.step()
    return norms


@pytest.mark.parametrize("mode", ["light", "default"])
def test_zero_grad_inside_the_accumulation_loop_is_found(tmp_path: Path, mode: str) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "inside.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        watched = _accumulate(model, opt, inside=True)
    found, steps = _diagnose(path)
    # what the capture saw: four passes a step, the last one alone in .grad at step()
    assert [(s["micro_batches"], s["accumulated"], s["zero_grad"]) for s in steps] == [(4, 1, 4)] * 4
    # what plain PyTorch's step() used: the last micro-batch's gradient alone, as recorded
    assert [s["grads"]["norm"][0] for s in steps] == pytest.approx(watched, rel=1e-6)
    (p5,) = [f for f in found if f["code"] == "P5"]
    assert p5["severity"] == "error" and p5["title"] == "zero_grad() inside the accumulation loop"
    assert "of step 0's 4 backward passes" in p5["message"] and "the other 3 were cleared" in p5["message"]
    # at the zero_grad() the capture saw clear the gradients between passes (it was the backward's line)
    assert p5["src"].endswith(f"test_doctor_optimizer_loops.py:{_line('# the zero_grad inside')}"), p5["src"]
    assert not [f for f in found if f["code"] == "P15"]


def test_zero_grad_before_the_accumulation_loop_is_no_finding(tmp_path: Path) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "right.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        _accumulate(model, opt, inside=False)
    found, steps = _diagnose(path)
    assert [(s["micro_batches"], s["accumulated"]) for s in steps] == [(4, 4)] * 4
    assert [f for f in found if f["severity"] != "info"] == []


def test_an_lbfgs_closure_that_zeroes_before_each_pass_is_no_finding(tmp_path: Path) -> None:
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    path = tmp_path / "lbfgs.tscope"
    x, y = _batches(1)[0]
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(3):
            def closure() -> torch.Tensor:
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                return loss

            opt.step(closure)
    found, steps = _diagnose(path)
    # every pass ran inside step(), from the closure's one line, each after a reset
    assert all(s["micro_batches"] >= 2 and s["accumulated"] == 1 for s in steps)
    assert [e for s in steps for e in s.get("events", []) if e["what"] == "closure"] == [
        {"what": "closure", "passes": s["micro_batches"]} for s in steps]
    assert [f for f in found if f["code"] == "P5"] == []


@pytest.mark.parametrize("mode", ["light", "default"])
@pytest.mark.parametrize("zero", ["outside", "none"])
def test_an_lbfgs_closure_without_zero_grad_inside_is_found(tmp_path: Path, mode: str, zero: str) -> None:
    """zero_grad() once per step, before step(closure) (what "once per optimizer step" reads
    as): LBFGS runs the closure several times and each evaluation reads the sum of all the
    passes before it -- it was no finding.  With no zero_grad() at all, P5's "missing" alone
    says it, its fix pointing inside the closure."""
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    path = tmp_path / "lbfgs.tscope"
    x, y = _batches(1)[0]
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            if zero == "outside":
                opt.zero_grad()

            def closure() -> torch.Tensor:
                loss = F.cross_entropy(model(x), y)
                loss.backward()  # marker: closure backward
                return loss

            opt.step(closure)
    found, steps = _diagnose(path)
    assert all(s["accumulated"] >= 2 for s in steps)
    p5 = [f for f in found if f["code"] == "P5"]
    assert len(p5) == 1 and "inside the closure" in p5[0]["fix"]
    if zero == "outside":
        assert p5[0]["title"] == "zero_grad() outside the closure" and p5[0]["steps"] == [0, 1, 2]
        assert p5[0]["src"] == f"test_doctor_optimizer_loops.py:{_line('marker: closure backward')}"
    else:
        assert p5[0]["title"] != "zero_grad() outside the closure"


@pytest.mark.parametrize("mode", ["light", "default"])
@pytest.mark.parametrize("divided", [True, False])
def test_an_lbfgs_closure_accumulating_micro_batches(tmp_path: Path, mode: str, divided: bool) -> None:
    """A closure that zeroes the gradients and sums 4 micro-batches (`loss / 4` each) is right:
    it was an error ("16 passes piled up", QA 37a), its step loss the first micro-batch's alone
    (a quarter of what step(closure) returns), and without the division no P15 was said."""
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    path = tmp_path / "lbfgs.tscope"
    batches = _batches(4)
    returned = []
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            def closure() -> torch.Tensor:
                opt.zero_grad()
                total = torch.zeros(())
                for x, y in batches:
                    loss = F.cross_entropy(model(x), y)
                    if divided:
                        loss = loss / 4
                    loss.backward()
                    total += loss.detach()
                return total

            returned.append(float(opt.step(closure)))
    found, steps = _diagnose(path)
    assert all(s["accumulated"] == 4 and s["zero_grad"] >= 2 for s in steps), steps
    assert [f for f in found if f["code"] == "P5"] == [], found
    # the loss of each step is the closure's first evaluation, as step(closure) returned it
    assert [s["loss"] for s in steps] == pytest.approx(returned, rel=1e-6)
    p15 = [f for f in found if f["code"] == "P15"]
    assert len(p15) == (0 if divided else 1), p15


def test_an_optimizer_of_the_head_while_the_backbone_is_unfrozen_is_no_foreign_model(tmp_path: Path) -> None:
    """Progressive unfreezing with the optimizer built over the head alone: from the unfreezing
    on, the backbone gets gradients no optimizer applies -- "Parameters no optimizer updates",
    naming them.  It was told as an optimizer of another instance of the model (the backbone's
    4 untrained parameters outnumbered the 2 trainable at watch())."""
    model = _model()
    model[0].requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    path = tmp_path / "unfreeze.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for i, (x, y) in enumerate(_batches(8)):
            if i == 3:
                model[0].requires_grad_(True)  # unfrozen, but never added to the optimizer
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    found, _ = _diagnose(path)
    p5 = [f for f in found if f["code"] == "P5"]
    assert [f["title"] for f in p5] == ["Parameters no optimizer updates"], p5
    assert p5[0]["params"] == ["0.weight", "0.bias"] and p5[0]["steps"] == list(range(3, 8))


def test_an_input_gradient_pass_before_the_training_pass_is_no_finding(tmp_path: Path) -> None:
    """FGSM adversarial training: backward for the input's gradient, zero_grad(), the real backward."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "fgsm.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for x, y in _batches(4):
            x = x.clone().requires_grad_(True)
            F.cross_entropy(model(x), y).backward()
            x_adv = (x + 0.1 * x.grad.sign()).detach()
            opt.zero_grad()
            F.cross_entropy(model(x_adv), y).backward()
            opt.step()
    found, _ = _diagnose(path)
    assert [f for f in found if f["code"] == "P5"] == []


def test_an_optimizer_of_another_instance_of_the_model_is_found(tmp_path: Path) -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model = _model()  # the model made again after its optimizer
    before = [p.detach().clone() for p in model.parameters()]
    path = tmp_path / "other.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for x, y in _batches(4):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # never trained
    found, _ = _diagnose(path)
    (p5,) = [f for f in found if f["code"] == "P5"]
    assert p5["title"] == "The optimizer steps none of the model's parameters"
    assert p5["message"].startswith("AdamW steps none of the 4 trainable parameters of Sequential")
    assert "zero_grad() is missing" not in p5["message"]
    # (QA 44e: an EMA teacher watched with the student's optimizer read as "created again" only)
    assert "created again" in p5["message"] and "an EMA teacher" in p5["message"], p5["message"]


def test_watch_model_alone_with_an_optimizer_of_another_model_is_found(tmp_path: Path, capfd: Any) -> None:
    model = _model()
    opt = torch.optim.AdamW(_model().parameters(), lr=1e-2)
    path = tmp_path / "alone.tscope"
    with torchscope.watch(model, server=None, record=path):
        for x, y in _batches(5):
            model.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    assert "AdamW steps none of Sequential's parameters" in capfd.readouterr().err
    found, _ = _diagnose(path)
    assert [f["title"] for f in found if f["severity"] != "info"] == ["The optimizer steps none of the model's parameters"]


@pytest.mark.parametrize("watched", ["head", "backbone"])
def test_a_cut_is_found_whichever_of_two_optimizers_is_watched(tmp_path: Path, watched: str) -> None:
    """The backbone's SGD and the head's Adam step every step; the backbone's output is detached
    by mistake: the backbone gets no gradient, though the head's optimizer does not hold it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(6, 12), nn.Tanh()), nn.Linear(12, 3))
    backbone, head = model[0], model[1]
    opt_bb = torch.optim.SGD(backbone.parameters(), lr=0.1)
    opt_head = torch.optim.Adam(head.parameters(), lr=1e-2)
    path = tmp_path / "two.tscope"
    with torchscope.watch(model, opt_head if watched == "head" else opt_bb, server=None, record=path):
        for x, y in _batches(5):
            opt_bb.zero_grad()
            opt_head.zero_grad()
            F.cross_entropy(head(backbone(x).detach()), y).backward()
            opt_bb.step()
            opt_head.step()
    assert all(p.grad is None for p in backbone.parameters())
    found, steps = _diagnose(path)
    assert all(s["grads"]["none"] == [0, 1] for s in steps[1:])
    assert all(s["grads"].get("not_trained", []) == [] for s in steps[1:])  # both optimizers train
    (p1,) = [f for f in found if f["code"] == "P1"]
    assert p1["severity"] == "error" and set(p1["params"]) == {"0.0.weight", "0.0.bias"}


def test_two_optimizers_of_one_model_are_no_finding(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(6, 12), nn.Tanh()), nn.Linear(12, 3))
    opt_bb = torch.optim.SGD(model[0].parameters(), lr=0.1)
    opt_head = torch.optim.Adam(model[1].parameters(), lr=1e-2)
    path = tmp_path / "two-ok.tscope"
    with torchscope.watch(model, opt_head, server=None, record=path):
        for x, y in _batches(5):
            opt_bb.zero_grad()
            opt_head.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt_bb.step()
            opt_head.step()
    found, _ = _diagnose(path)
    assert [f for f in found if f["severity"] != "info"] == []


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if marker in text and "_line(" not in text)


def test_an_optimizer_followed_under_watch_model_is_named_to_p15(tmp_path: Path) -> None:
    """`watch(model)` (the README's one line) follows the first optimizer that steps the model:
    its class was lost, and P15 judged an AdamW loop's undivided accumulation as SGD's ("each
    optimizer step is 4x larger") -- QA 37a."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    path = tmp_path / "adamw.tscope"
    data = iter(_batches(16))
    with torchscope.watch(model, server=None, record=path):
        for _ in range(4):
            opt.zero_grad()
            for _ in range(4):
                x, y = next(data)
                F.cross_entropy(model(x), y).backward()
            opt.step()
    found, steps = _diagnose(path)
    assert [e for s in steps for e in s.get("events", []) if e["what"] == "optimizer"] == [
        {"what": "optimizer", "optimizer": "AdamW"}]
    (p15,) = [f for f in found if f["code"] == "P15"]
    assert "AdamW divides each step by the gradients' running scale" in p15["message"], p15
    assert "larger than intended" not in p15["message"]


def test_gradient_surgery_that_sets_grad_itself_is_no_accumulation_finding(tmp_path: Path) -> None:
    """PCGrad: a backward per task, each task's gradients saved and cleared, the merged
    gradient assigned to ``.grad`` before ``step()``.  Only the last pass was in ``.grad`` at
    the reset, but the loop set what the step reads itself (QA 46d: "zero_grad() inside the
    accumulation loop")."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "pcgrad.tscope"
    data = iter(_batches(16))
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(8):
            per_task = []
            for _ in range(2):
                x, y = next(data)
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                per_task.append([p.grad.clone() for p in model.parameters()])
            opt.zero_grad()
            for p, g1, g2 in zip(model.parameters(), *per_task, strict=True):
                p.grad = (g1 + g2) / 2
            opt.step()
    found, _ = _diagnose(path)
    assert not [f for f in found if f["code"] == "P5"], found
