"""Wording the forty-sixth session's QA (46a) found hard to read, on real captures."""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import torchscope
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


def test_huge_growth_factors_are_written_in_powers_of_ten(tmp_path: Path) -> None:
    """Regression on raw targets in the thousands at lr=0.05 explodes: P3 printed the layers'
    jumps as "9290820114371861020672x"."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / "raw.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(12):
            x = torch.randn(64, 8)
            loss = F.mse_loss(model(x), x.sum(1, keepdim=True) * 300 + 1000)
            opt.zero_grad()
            loss.backward()
            opt.step()
    p3 = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P3" and "jumped most" in f["message"]]
    assert p3, "no explosion told"
    assert re.search(r"\(\d\.\de\+\d\dx\)", p3[0]["message"]), p3[0]["message"]
    assert not re.search(r"\d{7,}x", p3[0]["message"]), p3[0]["message"]


def test_a_long_dead_branch_counts_parameters_and_outputs_apart(tmp_path: Path) -> None:
    """A deep MLP whose ReLUs never fire: P2 listed "0.weight, 0.bias, 2.weight, 2.bias and
    N more", N counting parameters and module outputs together -- more than the model's
    parameters (QA 46c)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(8, 8), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(8, 1))
    with torch.no_grad():
        for layer in layers[::2]:
            layer.bias.fill_(-100.0)  # every ReLU is off for every input: only the head's bias learns
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "dead.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for _ in range(6):
            x = torch.randn(16, 8)
            loss = F.mse_loss(model(x), x[:, :1])
            opt.zero_grad()
            loss.backward()
            opt.step()
    (p2,) = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P2" and "Dead branch" in f["title"]]
    n_params = len(p2["params"])
    assert n_params <= len(list(model.parameters()))
    assert re.search(rf"Gradient reaching {n_params} parameters \(0\.weight, 0\.bias, 2\.weight, \.\.\.\) and the outputs "
                     r"of \d+ modules is", p2["message"]), p2["message"]


class _Clamped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.fc1(x) * 3)
        h.data.clamp_(0.1, 0.9)  # writes into the output sigmoid saved for its backward
        return self.fc2(h)


def test_a_silent_inplace_write_on_every_recorded_step_does_not_read_as_a_one_off(tmp_path: Path) -> None:
    """Default mode records the ops of one step of 12 here: P8 said "(at step 0)", which read as
    a one-off (QA 46a)."""
    torch.manual_seed(0)
    model = _Clamped()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / "clamp.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(12):
            x, y = torch.randn(32, 16), torch.randn(32, 1)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    events = list(iter_events(path))
    recorded = len([e for e in events if e["kind"] == "graph"])
    (p8,) = [f for f in diagnose(events) if f["code"] == "P8"]
    assert recorded < 12
    assert f"on every step whose ops were recorded, {recorded} of 12; the other steps' ops were not" in p8["message"], p8


def test_probabilities_given_to_nll_loss_say_what_the_loss_computes(tmp_path: Path) -> None:
    """P16 for ``nll_loss(softmax(...))`` said the loss "raises p instead of log p" (QA 46a)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.Softmax(dim=-1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "nll.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(6):
            x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
            opt.zero_grad()
            F.nll_loss(model(x), y).backward()
            opt.step()
    (p16,) = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P16"]
    assert "reads the probabilities as log-probabilities" in p16["message"] and "raises p" not in p16["message"], p16


def test_a_second_optimizer_never_zeroed_is_not_told_as_zero_grad_missing(tmp_path: Path) -> None:
    """The head's optimizer is zeroed each step, the body's never: "zero_grad() is missing" read
    wrong beside the loop's zero_grad() (QA 46a).  The message says it is missing for the
    optimizer holding those parameters, the one that runs not reaching them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt_body = torch.optim.Adam(model[0].parameters(), lr=1e-4)
    opt_head = torch.optim.SGD(model[2].parameters(), lr=1e-2)
    path = tmp_path / "two.tscope"
    with torchscope.watch(model, opt_head, server=None, record=path):
        for _ in range(8):
            x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
            opt_head.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt_body.step()
            opt_head.step()
    (p5,) = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P5"]
    assert p5["severity"] == "error" and p5["params"] == ["0.weight", "0.bias"], p5
    assert p5["message"].startswith("The gradients of 0.weight, 0.bias were already non-zero before backward"), p5
    assert "zero_grad() is missing for the optimizer that holds these (the zero_grad() that runs" in p5["message"], p5


class _ListEnsemble(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(16, 16)
        self.heads = nn.ModuleList([nn.Linear(16, 1) for _ in range(3)])
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.trunk(x))
        outs = [head(h).squeeze(-1) for head in self.heads]
        return torch.tensor([o.tolist() for o in outs]).mean(0) + self.bias  # (one line, three cuts)


def test_one_line_cutting_several_paths_is_one_finding(tmp_path: Path) -> None:
    """Three heads cut by ``.tolist()`` on one line were three P1 errors at that line (QA 46a)."""
    torch.manual_seed(0)
    model = _ListEnsemble()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / "heads.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(6):
            x, y = torch.randn(32, 16), torch.randn(32)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    p1 = [f for f in diagnose(list(iter_events(path))) if f["code"] == "P1"]
    assert len(p1) == 1, [f["message"] for f in p1]
    assert set(p1[0]["params"]) == {n for n, _ in model.named_parameters()} - {"bias"}
    assert "Tensor.tolist()" in p1[0]["message"] and p1[0]["src"].endswith(
        str(next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if t.endswith("# (one line, three cuts)"))))


def test_a_gradient_the_loop_zeroes_is_no_dead_branch(tmp_path: Path) -> None:
    """``model[0].weight.grad.zero_()`` after each backward keeps a pretrained weight fixed: P2's
    "Dead branch" sent the user after ReLUs that never fire (QA 46d).  It is an info at the
    zeroing line; a dead ReLU elsewhere would still be the warning."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "fixed.tscope"
    with torchscope.watch(model, opt, server=None, record=path):
        for _ in range(12):
            x, y = torch.randn(32, 10), torch.randint(0, 3, (32,))
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            model[0].weight.grad.zero_()  # (keep it fixed)
            opt.step()
    found = [dict(f) for f in diagnose(list(iter_events(path)))]
    assert not [f for f in found if f["severity"] in ("warning", "error")], found
    (f,) = [f for f in found if f["title"] == "Gradient zeroed by the loop"]
    assert f["code"] == "P2" and f["params"] == ["0.weight"] and f["severity"] == "info"
    line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if t.rstrip().endswith("# (keep it fixed)"))
    assert f["src"] == f"{Path(__file__).name}:{line}", f
