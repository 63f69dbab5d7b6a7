"""QA 53a: what the capture leaves in sight of the loop's own tools.  A user's TorchFunctionMode
counted two ``torch._C._set_grad_enabled`` calls of ours a step (the grad-mode restores of the
optimizer hooks).  Its optimizers collected before the watch closes (a ``train()``
returning its models) are remembered as stepping their parameters."""

from __future__ import annotations

import collections
import gc
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import torchscope


class _Count(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen[getattr(func, "__qualname__", str(func))] += 1
        return func(*args, **(kwargs or {}))


def _counted_loop(mode: str | None, path: Path) -> list[dict[str, int]]:
    """Twelve steps (the whole step -- zero_grad, forward, backward, clipping, step, a scheduler,
    .item(), an evaluation under no_grad now and then -- inside the user's mode): what it saw,
    per step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 5)
    xs, ys = torch.randn(64, 8), torch.randint(0, 3, (64,))
    watch = torchscope.watch(model, opt, server=None, record=path, mode=mode, sample_every=5) if mode else None
    seen = []
    try:
        for i in range(12):
            with _Count() as counted:
                opt.zero_grad(set_to_none=i % 2 == 0)
                x, y = xs[i % 8 * 8:(i % 8 + 1) * 8], ys[i % 8 * 8:(i % 8 + 1) * 8]
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                loss.item()
                if i % 4 == 3:
                    with torch.no_grad():
                        (model(xs).argmax(1) == ys).float().mean().item()
            seen.append(dict(counted.seen))
    finally:
        if watch is not None:
            watch.close()
    return seen


@pytest.mark.parametrize("mode", ["light", "default", "full"])
def test_a_user_function_mode_sees_only_its_loop(mode: str, tmp_path: Path) -> None:
    """Per step, the user's function mode sees exactly the calls it sees unwatched (QA 53a: two
    more ``_set_grad_enabled`` a step in every mode)."""
    plain = _counted_loop(None, tmp_path / "plain.tscope")
    watched = _counted_loop(mode, tmp_path / "w.tscope")
    for step, (a, b) in enumerate(zip(plain, watched, strict=True)):
        extra = {k: b.get(k, 0) - a.get(k, 0) for k in {*a, *b} if a.get(k, 0) != b.get(k, 0)}
        assert not extra, (step, extra)


def test_an_optimizer_collected_before_the_end_still_stepped_its_parameters(tmp_path: Path) -> None:
    """A critic's optimizer that went with its train()'s locals stepped the critic: the last
    step's graph, asked at close, marks none of the critic's parameters unregistered (QA 53a)."""
    from torchscope.sessionfile import iter_events

    def train() -> tuple[nn.Module, nn.Module]:
        torch.manual_seed(0)
        actor = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        critic = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        oa = torch.optim.Adam(actor.parameters(), lr=1e-3)
        oc = torch.optim.Adam(critic.parameters(), lr=1e-3)
        watch = torchscope.watch(actor, oa, mode="full", server=None, record=tmp_path / "a.tscope")
        for _ in range(3):
            s, a, r = torch.randn(8, 3), torch.rand(8, 1), torch.randn(8, 1)
            oc.zero_grad()
            nn.functional.mse_loss(critic(torch.cat([s, a], 1)), r).backward()
            oc.step()
            oa.zero_grad()
            (-critic(torch.cat([s, actor(s)], 1)).mean()).backward()
            oa.step()
        held.append(watch)
        gone.append(weakref.ref(oc))
        return actor, critic

    held: list[Any] = []
    gone: list[weakref.ref[torch.optim.Optimizer]] = []
    nets = train()
    gc.collect()
    assert gone[0]() is None  # the critic's optimizer is gone before the watch closes
    held[0].close()
    graphs = [e for e in iter_events(tmp_path / "a.tscope") if e["kind"] == "graph"]
    assert graphs and all(not n.get("unregistered") for g in graphs for n in g["nodes"]), \
        [(g.get("step"), [n["name"] for n in g["nodes"] if n.get("unregistered")]) for g in graphs]
    del nets


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
