"""P11 for modules that drop out by an argument of their own (QA 42a): an ``LSTM(num_layers=2,
dropout=0.25)`` and a ``MultiheadAttention(dropout=0.2)`` trained after an evaluation left the
model in eval mode -- their dropout off for the rest of the run -- went unseen, the rule knowing
only ``Dropout`` and ``BatchNorm`` modules.  The same model with that dropout at 0 (or a
one-layer LSTM, whose dropout acts between layers only) is no finding, and nor is the loop that
calls ``model.train()`` again.  The capture says which of them act in the session event."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

import torchscope
from torchscope.doctor import diagnose
from torchscope.session import load
from torchscope.sessionfile import iter_events


class Classifier(nn.Module):
    def __init__(self, lstm_layers: int, lstm_dropout: float, attn_dropout: float) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        self.attn = nn.MultiheadAttention(16, 2, dropout=attn_dropout, batch_first=True)
        self.lstm = nn.LSTM(16, 24, num_layers=lstm_layers, dropout=lstm_dropout, batch_first=True)
        self.fc = nn.Linear(24, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        x, _ = self.attn(x, x, x, need_weights=False)
        _, (h, _) = self.lstm(x)
        return self.fc(h[-1])


def _train(path: Path, forgets: bool, layers: int, lstm_p: float, attn_p: float) -> None:
    torch.manual_seed(0)
    model = Classifier(layers, lstm_p, attn_p)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with torchscope.watch(model, opt, server=None, record=path, mode="default"):
        for step in range(8):
            if not forgets or step == 0:
                model.train()
            ids, y = torch.randint(0, 30, (8, 10)), torch.randint(0, 3, (8,))
            opt.zero_grad()
            F.cross_entropy(model(ids), y).backward()
            opt.step()
            model.eval()  # a validation after every step
            with torch.no_grad():
                model(torch.randint(0, 30, (4, 10)))


def _p11(path: Path) -> list[dict[str, object]]:
    return [dict(f) for f in diagnose(list(iter_events(path))) if f["code"] == "P11"]


@pytest.mark.parametrize("which", ["both", "lstm", "attention"])
def test_a_forgotten_train_is_found_where_only_rnn_or_attention_dropout_changes(tmp_path: Path, which: str) -> None:
    lstm_p = 0.25 if which in ("both", "lstm") else 0.0
    attn_p = 0.2 if which in ("both", "attention") else 0.0
    path = tmp_path / "forgot.tscope"
    _train(path, True, 2, lstm_p, attn_p)
    inert = {m["path"]: m.get("mode_inert") for m in load(str(path)).meta["modules"]}
    assert inert["lstm"] is (lstm_p == 0) and inert["attn"] is (attn_p == 0) and inert["fc"] is None
    (f,) = _p11(path)
    assert f["severity"] == "warning" and f["steps"] == list(range(1, 8)), f
    acting = [m for m, p in (("attn", attn_p), ("lstm", lstm_p)) if p]
    assert all(f"'{m}'" in str(f["message"]) for m in acting) and "dropout is off" in str(f["message"]), f["message"]
    assert "batch-norm" not in str(f["message"]), f["message"]


@pytest.mark.parametrize("case", ["no dropout", "one-layer lstm", "train() called"])
def test_no_finding_where_the_mode_changes_nothing_or_is_right(tmp_path: Path, case: str) -> None:
    path = tmp_path / "clean.tscope"
    if case == "no dropout":
        _train(path, True, 2, 0.0, 0.0)
    elif case == "one-layer lstm":  # (PyTorch warns that its dropout does nothing)
        with pytest.warns(UserWarning, match="dropout"):
            _train(path, True, 1, 0.25, 0.0)
    else:
        _train(path, False, 2, 0.25, 0.2)
    assert _p11(path) == []
