"""QA 52b (and 52a F8), on real scripts run in a subprocess: a prune mask that zeroes a whole
weight (``amount=1.0``) read as biases that "cancel out of the loss ... nothing to fix" (or as no
problem at all); a weight-tied embedding frozen through the output layer was not told; an LBFGS
closure without ``zero_grad()`` piled its passes up "since step 1", though step 0 summed 7 of
them; ``doctor --json`` of one unreadable file printed nothing on stdout."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from doctor_runs import script_findings

from torchscope.doctor.cli import run_files

SCRIPT = '''
import sys

import torch
import torch.nn.functional as F
import torch.nn.utils.prune as prune
from torch import nn

import torchscope

variant, mode, record = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)


def pruned() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    prune.l1_unstructured(model[0], "weight", amount=1.0 if variant == "prune_first" else 0.5)
    prune.random_structured(model[2], "weight", amount=0.25, dim=0)
    prune.l1_unstructured(model[4], "weight", amount=1.0 if variant == "prune_last" else 0.3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x_all = torch.randn(256, 16)
    y_all = (x_all[:, :4] * 2).argmax(1)
    with torchscope.watch(model, opt, server=None, record=record, mode=mode):
        for step in range(20):
            i = torch.randint(0, 256, (32,))
            opt.zero_grad()
            F.cross_entropy(model(x_all[i]), y_all[i]).backward()
            opt.step()
            if step == 10 and variant == "prune_clean":  # iterative pruning mid-run
                prune.l1_unstructured(model[0], "weight", amount=0.5)


class LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(64, 32)
        self.rnn = nn.GRU(32, 32, batch_first=True)
        self.decoder = nn.Linear(32, 64)
        self.decoder.weight = self.encoder.weight  # weight tying

    def forward(self, x):
        return self.decoder(self.rnn(self.encoder(x))[0])


def tied() -> None:
    model = LM()
    if variant == "tied_frozen":  # meant for the output layer: freezes the embedding too
        model.decoder.weight.requires_grad_(False)
    extra = []
    if variant == "tied_base":  # a frozen base model, a small adapter trained on top
        model.requires_grad_(False)
        adapter = nn.Linear(64, 64)
        extra = list(adapter.parameters())
        model.adapter = adapter
        model.forward = lambda x: adapter(model.decoder(model.rnn(model.encoder(x))[0]))
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad] + extra, lr=3e-3)
    data = torch.randint(0, 64, (64, 13))
    with torchscope.watch(model, opt, server=None, record=record, mode=mode):
        for _ in range(8):
            b = data[torch.randint(0, 64, (8,))]
            opt.zero_grad()
            F.cross_entropy(model(b[:, :-1]).reshape(-1, 64), b[:, 1:].reshape(-1)).backward()
            opt.step()


def lbfgs() -> None:
    model = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5, history_size=10, line_search_fn="strong_wolfe")
    x = torch.randn(128, 3)
    y = torch.sin(x[:, :1]) + x[:, 1:2] * x[:, 2:3]
    with torchscope.watch(model, opt, server=None, record=record, mode=mode):
        for _ in range(8):
            def closure():
                if variant == "lbfgs_clean":
                    opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                return loss
            opt.step(closure)


{"prune": pruned, "tied": tied, "lbfgs": lbfgs}[variant.partition("_")[0]]()
'''


def _findings(tmp_path: Path, variant: str, mode: str) -> list[dict[str, Any]]:
    return script_findings(tmp_path, SCRIPT, variant, mode)[1]


@pytest.mark.parametrize("mode", ["light", "default"])
def test_a_prune_mask_that_zeroes_a_whole_weight_is_a_dead_branch(tmp_path: Path, mode: str) -> None:
    """``amount=1.0`` on the last Linear: every gradient but its bias's is exact zeros.  A P2
    warning naming the pruned weights and the mask (QA 52b F1: an info that 0.bias and 2.bias
    "cancel out of the loss, by design ... Nothing to fix"); on the first Linear, the same (it
    was "no problems found"); normal pruning (0.25-0.5, again mid-run) stays silent."""
    found = _findings(tmp_path, "prune_last", mode)
    assert not [f for f in found if "cancels out" in f["title"]], [f["message"] for f in found]
    (p2,) = [f for f in found if f["code"] == "P2"]
    assert p2["severity"] == "warning", p2
    assert {"0.weight_orig", "2.weight_orig", "4.weight_orig", "0.bias", "2.bias"} == set(p2["params"]), p2["params"]
    assert "The prune mask of '4' zeroes the whole weight" in p2["message"], p2["message"]
    assert "0.weight_orig and 2.weight_orig, pruned too, are dead behind it" in p2["message"], p2["message"]
    assert "module.weight_mask.mean()" in p2["fix"] and "Nothing to fix" not in p2["fix"], p2["fix"]

    (p2,) = [f for f in _findings(tmp_path, "prune_first", mode) if f["code"] == "P2"]
    assert p2["severity"] == "warning" and p2["params"] == ["0.weight_orig"], p2
    assert "The prune mask of '0' zeroes the whole weight:" in p2["message"], p2["message"]

    assert _findings(tmp_path, "prune_clean", mode) == []


def test_a_frozen_tied_weight_is_a_note(tmp_path: Path) -> None:
    """``decoder.weight = encoder.weight``, then ``model.decoder.weight.requires_grad_(False)``:
    the embedding is frozen too.  An info naming both modules (QA 52b F3: silent); the tie
    trained, or frozen with the whole base model under an adapter, says nothing."""
    found = _findings(tmp_path, "tied_frozen", "light")
    (note,) = [f for f in found if f["code"] == "P17"]
    assert note["severity"] == "info" and note["title"] == "Frozen parameter shared by two modules", note
    assert note["params"] == ["encoder.weight"] and note["modules"] == ["decoder", "encoder"], note
    assert "is also decoder.weight" in note["message"], note["message"]
    assert "decoder.weight = nn.Parameter(encoder.weight.detach().clone())" in note["fix"], note["fix"]
    assert not [f for f in found if f["severity"] != "info"], found
    assert _findings(tmp_path, "tied_clean", "light") == []
    assert [f for f in _findings(tmp_path, "tied_base", "light") if f["code"] == "P17"] == []


def test_an_lbfgs_closure_without_zero_grad_piles_up_since_step_0(tmp_path: Path) -> None:
    """Step 0's closure already summed its passes into .grad (``accumulated`` 7): "since step
    0", not 1 (QA 52b F4); with zero_grad() in the closure, nothing."""
    (p5,) = [f for f in _findings(tmp_path, "lbfgs_bug", "light") if f["code"] == "P5"]
    assert p5["severity"] == "error" and p5["steps"][0] == 0, p5
    assert "since step 0, every step" in p5["message"] and "step 0 summed" in p5["message"], p5["message"]
    assert "inside the closure" in p5["fix"], p5["fix"]
    assert _findings(tmp_path, "lbfgs_clean", "light") == []


def test_json_of_one_unreadable_file_is_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``doctor BAD --json``: the ``{"file", "error"}`` the list of several files holds for it, on
    stdout, with the stderr line and exit 2 (QA 52a F8: stdout empty, `jq` failed on it)."""
    bad = tmp_path / "bad.tscope"
    bad.write_text("garbage\n")
    res = subprocess.run([sys.executable, "-m", "torchscope.doctor.cli", str(bad), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res
    assert json.loads(res.stdout) == {"file": str(bad), "error": res.stderr.strip().removeprefix("torchscope doctor: ")}
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    # a file the caller (`torchscope doctor`) already found unreadable: the same shape
    gz = str(tmp_path / "run.tscope.gz")
    assert run_files([gz], as_json=True, refused={gz: "it is gzip-compressed"}) == 2
    out, err = capsys.readouterr()
    assert json.loads(out) == {"file": gz, "error": "it is gzip-compressed"}
    assert err == "torchscope doctor: it is gzip-compressed\n"
    # without --json, no JSON
    assert run_files([gz], refused={gz: "it is gzip-compressed"}) == 2
    assert capsys.readouterr().out == ""
    # and `torchscope doctor` itself, which checks a file before the doctor reads it
    real = tmp_path / "real.tscope.gz"
    real.write_bytes(gzip.compress(b"torchscope"))
    res = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "doctor", str(real), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res
    assert json.loads(res.stdout)["error"].startswith(f"{real} is gzip-compressed"), res.stdout
