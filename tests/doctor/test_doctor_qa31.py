"""Doctor findings from QA round 31 (third-party libraries, notebooks), on torch-only equivalents
of the reproducers: each test records real training code in-process and diagnoses the file.

- a run that dies on the step that proves zero_grad() missing (Opacus' DPOptimizer raises there): P5;
- LayerScale residual blocks (ConvNeXt, CaiT: ``x + gamma * f(x)``, gamma 1e-6): no P3 "vanishing";
- an LBFGS closure without zero_grad(): P5, not P15's "divide the loss by k";
- a custom autograd.Function or a full backward hook before a ``.detach()``: P1 names the detach;
- a notebook's Stop/error keeping one step's graph in its traceback: a P7 info, not a growth warning;
- submodules called directly with a ``.detach()`` between them: P1 names the detach, with its line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.schema import Finding
from torchscope.sessionfile import iter_events

HERE = Path(__file__)


def _line(marker: str) -> str:
    """``test_doctor_qa31.py:N`` of the line of this file that ends in the comment ``marker``."""
    lines = HERE.read_text().splitlines()
    hits = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(marker)]
    assert len(hits) == 1, (marker, hits)
    return f"{HERE.name}:{hits[0]}"


def _record(path: Path, model: nn.Module, opt: torch.optim.Optimizer, loop: Callable[[], None],
            mode: str = "default") -> list[Finding]:
    """Run ``loop`` under a watch recording to ``path`` (an exception it raises ends the run with
    an error, as a crashed script does) and diagnose the file."""
    try:
        with torchscope.watch(model, opt, server=None, record=path, mode=mode):
            loop()
    except ValueError:
        pass
    return diagnose(iter_events(path))


def _codes(findings: list[Finding]) -> list[str]:
    return [f"{f['code']}/{f['severity']}" for f in findings]


# ---------------------------------------------------------------- P5: the run dies on the step that proves it
def _refuse_uncleared(opt: torch.optim.Optimizer) -> None:
    """Make ``opt.step()`` raise on gradients not cleared since its last step, as Opacus'
    DPOptimizer does: a gradient backward accumulated into in place is the last step's tensor.
    (A step pre-hook, not a subclass calling ``super().step()``: torch hooks both classes' step
    once an SGD exists, and the subclass's step then counts twice.)"""
    last: dict[int, torch.Tensor] = {}

    def check(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if any(last.get(id(p)) is p.grad for p in params):
            raise ValueError("Gradients haven't been cleared since the last optimizer step")
        last.update((id(p), p.grad) for p in params if p.grad is not None)

    opt.register_step_pre_hook(check)


def test_p5_missing_zero_grad_is_found_when_the_run_crashes_on_the_step_that_shows_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _refuse_uncleared(opt)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))

    def loop() -> None:
        for _ in range(5):  # no opt.zero_grad(): the second step() raises
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()  # crash-backward
            opt.step()

    found = _record(tmp_path / "crash.tscope", model, opt, loop)
    end = [e for e in iter_events(tmp_path / "crash.tscope") if e.get("kind") == "end"]
    assert end[0]["status"] == "error" and "haven't been cleared" in end[0]["message"]
    p5 = [f for f in found if f["code"] == "P5"]
    assert len(p5) == 1, _codes(found)
    assert p5[0]["severity"] == "error" and p5[0]["steps"] == [1], p5[0]
    assert "zero_grad() is missing" in p5[0]["message"] and p5[0]["src"] == _line("# crash-backward")


def test_p5_a_trailing_backward_after_a_finished_loop_is_still_no_finding(tmp_path: Path) -> None:
    """The exception the crash case lifts: a run that ended well, whose last step (closed at the
    end) is a backward after the loop's last optimizer.step() -- a saliency map's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))

    def loop() -> None:
        for _ in range(4):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        nn.functional.cross_entropy(model(x), y).backward()  # after the loop, onto the last step's gradients

    assert "P5" not in [f["code"] for f in _record(tmp_path / "trailing.tscope", model, opt, loop)]


# ---------------------------------------------------------------- P3: LayerScale is no vanishing gradient
class LayerScaleBlock(nn.Module):
    """``x + gamma * mlp(x)`` with gamma starting at 1e-6 (ConvNeXt, CaiT, DeiT-III): the branch's
    weights get 1e-6 of the gradient of the main path beside them, at every depth."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.mix, self.norm = nn.Linear(d, d), nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.gamma = nn.Parameter(torch.full((d,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gamma * self.fc2(nn.functional.gelu(self.fc1(self.norm(self.mix(x)))))


class LayerScaleNet(nn.Module):
    """A ConvNeXt-atto-like stack: a stem, four stages of (2, 2, 6, 2) blocks with a downsampling
    layer before each but the first, a head."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.stem = nn.Linear(16, d)
        self.stages = nn.Sequential(*[
            nn.Sequential(*([nn.Linear(d, d)] if i else []), *[LayerScaleBlock(d) for _ in range(n)])
            for i, n in enumerate((2, 2, 6, 2))])
        self.head = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


def _train_plain(path: Path, model: nn.Module, lr: float, inputs: int = 16, classes: int = 4,
                 steps: int = 6) -> list[Finding]:
    torch.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.randn(64, inputs), torch.randint(0, classes, (64,))

    def loop() -> None:
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    return _record(path, model, opt, loop, mode="light")


def test_p3_layer_scale_blocks_are_not_vanishing_gradients(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = LayerScaleNet()
    found = _train_plain(tmp_path / "layerscale.tscope", model, lr=0.01)
    assert "P3" not in [f["code"] for f in found], [f["message"] for f in found]
    # the branch weights' gradients are tiny indeed, the stem's (at the input end) is not
    block = model.stages[0][0]
    assert block.fc1.weight.grad is not None and model.stem.weight.grad is not None
    per_element = [float(p.grad.norm()) / p.numel() ** 0.5 for p in (block.fc1.weight, model.stem.weight)]
    assert per_element[0] * 1e4 < per_element[1], per_element


def test_p3_a_deep_sigmoid_stack_still_vanishes(tmp_path: Path) -> None:
    """The rule's true case, judged the same way: every weight near the input is small."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(12):
        layers += [nn.Linear(32, 32), nn.Sigmoid()]
    found = _train_plain(tmp_path / "sigmoid.tscope", nn.Sequential(*layers, nn.Linear(32, 4)), lr=0.01, inputs=32)
    p3 = [f for f in found if f["code"] == "P3"]
    assert len(p3) == 1 and "Gradients shrink" in p3[0]["message"], _codes(found)
    assert p3[0]["params"] == ["0.weight", "24.weight"], p3[0]["params"]


# ---------------------------------------------------------------- P15: an LBFGS closure's passes are no micro-batches
def test_lbfgs_closure_without_zero_grad_is_p5_not_accumulation(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 128).unsqueeze(1)
    y = torch.sin(3 * x)
    model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=10)

    def loop() -> None:
        for _ in range(5):
            def closure() -> torch.Tensor:
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()  # no opt.zero_grad() before it: every evaluation adds to the last
                return loss
            opt.step(closure)

    found = _record(tmp_path / "lbfgs.tscope", model, opt, loop)
    steps = [e for e in iter_events(tmp_path / "lbfgs.tscope") if e.get("kind") == "step"]
    assert any(e["what"] == "closure" and e["passes"] >= 2 for s in steps for e in s.get("events", []))
    codes = [f["code"] for f in found]
    assert "P5" in codes and "P15" not in codes, [f["message"] for f in found]


# ---------------------------------------------------------------- P1: the .detach() after an autograd.Function
class Swish(torch.autograd.Function):
    """A hand-written activation: autograd runs its forward with grad mode off."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s + x * s * (1 - s))


class Detached(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.enc = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "function":
            h = Swish.apply(self.enc[0](x)).detach()  # function-detach
        elif self.kind == "no_grad":
            with torch.no_grad():
                h = self.enc(x)  # no-grad-block
            self.seen = h.mean().item()  # read off to the side: no cut on the path to the loss
        else:
            h = self.enc(x).detach()  # hook-detach
        return self.head(h)


def _train_detached(path: Path, kind: str) -> list[Finding]:
    torch.manual_seed(0)
    model = Detached(kind)
    if kind == "hook":  # Opacus, captum and torchinfo register these
        model.enc[0].register_full_backward_hook(lambda m, gi, go: None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 20)
    y = (x[:, 0] > 0).long()

    def loop() -> None:
        for _ in range(4):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    return _record(path, model, opt, loop)


def test_p1_names_the_detach_after_a_full_backward_hook_or_a_custom_function(tmp_path: Path) -> None:
    for kind, marker in (("hook", "# hook-detach"), ("function", "# function-detach")):
        found = _train_detached(tmp_path / f"{kind}.tscope", kind)
        p1 = [f for f in found if f["code"] == "P1"]
        assert len(p1) == 1, (kind, _codes(found))
        assert p1[0]["data"]["break_op"].endswith("Tensor.detach()"), (kind, p1[0]["message"])
        assert "no_grad" not in p1[0]["message"] and "use_reentrant" not in p1[0]["fix"], (kind, p1[0])
        assert p1[0]["src"] == _line(marker), (kind, p1[0]["src"])


def test_p1_a_real_no_grad_block_is_still_named(tmp_path: Path) -> None:
    found = _train_detached(tmp_path / "no_grad.tscope", "no_grad")
    p1 = [f for f in found if f["code"] == "P1"]
    assert len(p1) == 1 and "it ran under torch.no_grad()" in p1[0]["message"], _codes(found)
    assert p1[0]["src"] == _line("# no-grad-block")


# ---------------------------------------------------------------- P7: one graph held by a traceback
def _notebook(path: Path, keep: bool) -> tuple[list[Finding], list[int]]:
    """A notebook's cells: train, a cell stopped by an error in the middle of a step (IPython
    keeps the exception, its traceback and the step's frame), train again.  ``keep``: the
    training cell also keeps every step's loss (the real leak)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    last_error: list[BaseException] = []  # IPython's last traceback
    history: list[torch.Tensor] = []

    def train(n: int, stop_at: int = -1) -> None:
        for i in range(n):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            if i == stop_at:
                raise RuntimeError("stopped in the middle of a step")
            loss.backward()
            opt.step()
            if keep:
                history.append(loss)

    with torchscope.watch(model, opt, server=None, record=path, mode="default"):
        train(12)
        try:
            train(5, stop_at=2)
        except RuntimeError as exc:
            last_error.append(exc)
        train(10)
    alive = [int(e.get("graphs_alive", 0)) for e in iter_events(path) if e.get("kind") == "step"]
    return diagnose(iter_events(path)), alive


def test_p7_one_graph_held_by_a_kept_exception_is_an_info_not_growth(tmp_path: Path) -> None:
    found, alive = _notebook(tmp_path / "held.tscope", keep=False)
    assert max(alive) > 0 and alive[-1] == max(alive)  # the stopped step's graph really is alive
    p7 = [f for f in found if f["code"] == "P7"]
    assert len(p7) == 1 and p7[0]["severity"] == "info", _codes(found)
    assert "per step" not in p7[0]["message"] and "traceback" in p7[0]["message"], p7[0]["message"]
    assert "history.append" not in p7[0]["message"] + p7[0]["fix"]


def test_p7_losses_kept_every_step_still_warn_with_their_growth(tmp_path: Path) -> None:
    found, alive = _notebook(tmp_path / "leak.tscope", keep=True)
    p7 = [f for f in found if f["code"] == "P7"]
    assert len(p7) == 1 and p7[0]["severity"] == "warning", _codes(found)
    per_step = p7[0]["data"]["nodes_per_step"]
    assert per_step >= 1 and f"+{per_step:.0f} per step" in p7[0]["message"], p7[0]["message"]


# ---------------------------------------------------------------- P1: submodules called directly, a .detach() between
def test_p1_direct_submodule_calls_with_a_detach_name_the_detach(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))

    def loop() -> None:
        for i in range(6):
            xb, yb = x[i * 8 : (i + 1) * 8], y[i * 8 : (i + 1) * 8]
            opt.zero_grad()
            h = model[1](model[0](xb)).detach()  # direct-detach
            loss = nn.functional.cross_entropy(model[3](model[2](h)), yb)
            loss.backward()
            opt.step()

    found = _record(tmp_path / "direct.tscope", model, opt, loop)
    p1 = [f for f in found if f["code"] == "P1"]
    assert len(p1) == 1, _codes(found)
    assert p1[0]["params"] == ["0.weight", "0.bias"] and "never used" not in p1[0]["message"], p1[0]["message"]
    assert p1[0]["data"]["break_op"].endswith("Tensor.detach()") and p1[0]["src"] == _line("# direct-detach")
