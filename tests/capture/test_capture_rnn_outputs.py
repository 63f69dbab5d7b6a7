"""An RNN whose sequence output the loop discards (``_, h = gru(x)``, ``_, (h, c) = lstm(x)``,
a packed encoder's final state): the gradient reaches the module through ``h_n`` alone.  Its
``activation_grads`` row is that gradient's and its ``activations`` row ``h_n``'s values
(QA 42a: no gradient row at all, and the discarded output's values).  A module whose first
output the loss uses keeps that output's rows, as before.  Checked against what autograd hands
hooks the test registers, with and without the native extension."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import torchscope
from torchscope.sessionfile import iter_events


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 6, batch_first=True)
        self.lstm = nn.LSTM(6, 5, batch_first=True)
        self.enc = nn.GRU(4, 3, batch_first=True)  # packed
        self.seq = nn.GRU(4, 3, batch_first=True)  # its output used, its h_n discarded
        self.head = nn.Linear(5 + 3 + 3, 2)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        y, _ = self.gru(x)  # output used, h_n discarded
        _, (h, _c) = self.lstm(y)  # output and c_n discarded
        _, he = self.enc(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        s, _ = self.seq(x)
        return self.head(torch.cat([h[-1], he[-1], s[:, -1]], dim=1))


def _train(path: Path | None, mode: str) -> tuple[list[float], list[dict[str, tuple[torch.Tensor, torch.Tensor]]]]:
    """Losses, and per step each RNN's (the output its gradient reached, that gradient)."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    used = {"gru": 0, "lstm": 1, "enc": 1, "seq": 0}  # which of (output, h_n) the loss uses
    kept: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    grads: dict[str, torch.Tensor] = {}

    def fwd(m: nn.Module, args: Any, out: Any, name: str) -> None:
        t = out[used[name]]
        t = t[0] if isinstance(t, tuple) else t  # the LSTM's (h_n, c_n)
        t = t.data if name == "enc" and not used[name] else t
        kept[name] = (t.detach().clone(), t)
        t.register_hook(lambda g: grads.__setitem__(name, g.detach().clone()))

    if path is None:  # the test's own hooks in the plain run only: the watched run is unchanged
        for name in used:
            getattr(model, name).register_forward_hook(lambda m, a, o, name=name: fwd(m, a, o, name))
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode) if path else None
    losses, by_step = [], []
    for _ in range(3):
        x, lengths = torch.randn(4, 7, 4), torch.tensor([7, 5, 3, 6])
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x, lengths), torch.tensor([0, 1, 1, 0]))
        loss.backward()
        opt.step()
        losses.append(loss.item())
        by_step.append({k: (kept[k][0], grads[k]) for k in kept})
    if watch:
        watch.close()
    return losses, by_step


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("mode", ["default", "full"])
def test_the_rows_are_of_the_output_the_backward_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, native: bool) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    plain, truth = _train(None, mode)
    path = tmp_path / "run.tscope"
    losses, _ = _train(path, mode)
    assert [v.hex() for v in losses] == [v.hex() for v in plain]  # the training is unchanged
    captured = [e for e in iter_events(path) if e["kind"] == "step" and e["graph_captured"]]
    assert captured
    for e in captured:
        grads = {a["module"]: a for a in e["activation_grads"]}
        outs = {a["module"]: a for a in e["activations"]}
        for name, (value, grad) in truth[e["step"]].items():
            g, v = grad.double(), value.double()
            assert grads[name]["norm"] == pytest.approx(g.norm().item(), rel=1e-5), name
            assert grads[name]["max_abs"] == pytest.approx(g.abs().max().item(), rel=1e-6), name
            assert outs[name]["numel"] == v.numel(), name
            assert outs[name]["norm"] == pytest.approx(v.norm().item(), rel=1e-5), name
            assert outs[name]["min"] == v.min().item() and outs[name]["max"] == v.max().item(), name
            assert "calls" not in grads[name] and "calls" not in outs[name]  # one call each, one row
