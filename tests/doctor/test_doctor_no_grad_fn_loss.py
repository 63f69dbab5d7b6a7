"""backward() on a loss without grad_fn ("element 0 of tensors does not require grad and does not
have a grad_fn"), on real runs: the loss was cut from the graph -- the model's output detached, or
the training forward run under ``torch.no_grad()`` by an indentation slip -- which is P1 at the
line that cut it, not P9 (a non-differentiable op) with a fix about argmax surrogates; the
forward under no_grad is no evaluation in train mode (P11) and the detached one no graph built
for nothing (P6).  A loss through an argmax is still P9, at the argmax."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import forkrun
import pytest

from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events

# The user's loop: the backward error is raised to them; this notebook catches it and goes on.
SCRIPT = '''
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchscope

variant, mode, record = sys.argv[1:4]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torchscope.watch(model, opt, server=None, record=record, mode=mode)
x_val = torch.randn(16, 4)
for i in range(3):
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    opt.zero_grad()
    if variant == "eval_and_no_grad":
        with torch.no_grad():
            val = model(x_val)  # EVAL: an evaluation left in train mode (a real P11)
    if variant in ("no_grad", "eval_and_no_grad"):
        with torch.no_grad():
            x_mix = 0.7 * x + 0.3 * x.flip(0)
            out = model(x_mix)  # FORWARD_NO_GRAD: belongs outside the no_grad block
    elif variant == "functional_call":
        params = {k: v.detach() for k, v in model.named_parameters()}  # the torch.func habit, here a bug
        out = torch.func.functional_call(model, (params, dict(model.named_buffers())), (x,))  # FUNCTIONAL
    else:
        out = model(x)
    if variant == "detach":
        out = out.detach()  # DETACH: "targets carry no gradient" applied to the prediction
    if variant == "argmax":
        loss = F.mse_loss(out.argmax(1).float(), y.float())  # ARGMAX
    else:
        loss = F.cross_entropy(out, y)
    try:
        loss.backward()
    except RuntimeError as exc:
        assert "does not have a grad_fn" in str(exc), exc
    opt.step()
'''


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(SCRIPT.splitlines(), 1) if f"# {marker}" in text)


def _findings(tmp_path: Path, variant: str, mode: str) -> list[dict[str, Any]]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    record = tmp_path / f"{variant}_{mode}.tscope"
    res = forkrun.run([str(script), variant, mode, str(record)], timeout=240, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [dict(f) for f in diagnose(iter_events(record))]


def _of(found: list[dict[str, Any]], code: str) -> list[dict[str, Any]]:
    return [f for f in found if f["code"] == code]


def test_detached_output_is_p1_at_the_detach(tmp_path: Path) -> None:
    found = _findings(tmp_path, "detach", "default")
    (p1,) = _of(found, "P1")
    assert p1["severity"] == "error" and p1["steps"] == [0, 1, 2]
    assert p1["src"] == f"train.py:{_line('DETACH')}"
    assert "detached" in p1["message"] and ".detach()" in p1["fix"]
    assert "argmax" not in p1["message"] + p1["fix"]
    assert p1["targets"][0]["op"] >= 0 and p1["data"]["op"] == "torch::Tensor.detach"
    # not a non-differentiable op, and no graph built for nothing: the detached forward was the training one
    assert _of(found, "P9") == [] and _of(found, "P6") == []


def test_detached_output_without_a_graph_is_p1_without_naming_an_op(tmp_path: Path) -> None:
    found = _findings(tmp_path, "detach", "light")
    (p1,) = _of(found, "P1")
    assert p1["severity"] == "error" and p1["steps"] == [0, 1, 2]
    assert "cut from" in p1["message"] and ".detach()" in p1["message"] and "torch.no_grad()" in p1["message"]
    assert "argmax" not in p1["message"] + p1["fix"]
    assert _of(found, "P9") == [] and _of(found, "P6") == []


@pytest.mark.parametrize("mode", ["default", "light"])
def test_training_forward_under_no_grad_is_p1_at_the_forward_and_no_p11(tmp_path: Path, mode: str) -> None:
    found = _findings(tmp_path, "no_grad", mode)
    (p1,) = _of(found, "P1")
    assert p1["severity"] == "error" and p1["steps"] == [0, 1, 2]
    assert p1["src"] == f"train.py:{_line('FORWARD_NO_GRAD')}"
    assert "ran under torch.no_grad()" in p1["message"] and "outside the torch.no_grad()" in p1["fix"]
    assert "argmax" not in p1["message"] + p1["fix"]
    # the forward whose output the failing backward was called on trained: no evaluation in train mode
    assert _of(found, "P11") == [] and _of(found, "P9") == []


def test_an_evaluation_in_train_mode_beside_it_is_still_p11(tmp_path: Path) -> None:
    found = _findings(tmp_path, "eval_and_no_grad", "default")
    (p1,) = _of(found, "P1")
    assert p1["src"] == f"train.py:{_line('FORWARD_NO_GRAD')}" and "ran under torch.no_grad()" in p1["message"]
    (p11,) = _of(found, "P11")
    assert p11["severity"] == "warning" and "Evaluating with '1' (BatchNorm1d) in train mode" in p11["message"]
    assert p11["src"] == f"train.py:{_line('EVAL')}"


def test_a_loss_through_argmax_is_still_p9_at_the_argmax(tmp_path: Path) -> None:
    found = _findings(tmp_path, "argmax", "default")
    (p9,) = _of(found, "P9")
    assert p9["severity"] == "error" and p9["src"] == f"train.py:{_line('ARGMAX')}"
    assert "aten::argmax" in p9["message"] and "surrogate" in p9["fix"]
    assert [f for f in _of(found, "P1") if f["severity"] == "error"] == []


def test_a_forward_on_detached_copies_of_the_parameters_is_p1_at_that_forward(tmp_path: Path) -> None:
    """``functional_call`` with a params dict of detached tensors: the forward's ops read tensors
    of the parameters' shapes that are not them, and the loss reaches no parameter.  The doctor
    said only "computed from tensors cut from the graph -- a .detach(), .data, ..." (QA)."""
    found = _findings(tmp_path, "functional_call", "default")
    (p1,) = _of(found, "P1")
    assert p1["severity"] == "error" and p1["steps"] == [0, 1, 2] and p1["data"]["cut"] == "param_copies"
    assert p1["src"] == f"train.py:{_line('FUNCTIONAL')}"
    assert "copies of the parameters cut from the graph (0.weight, 0.bias, 1.weight and 3 more)" in p1["message"]
    assert "functional_call" in p1["message"] and "dict(model.named_parameters())" in p1["fix"]
    assert _of(found, "P9") == []
