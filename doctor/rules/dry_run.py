"""The dry run of a model with lazy modules: no evaluation (P11), no unused graph (P6).

``nn.LazyLinear``, ``nn.LazyConv2d``, ``nn.LazyBatchNorm2d``... make their parameters in their
first forward, and PyTorch's docs have a dry run -- one forward on a sample batch, its output
thrown away -- before the optimizer is built over the parameters it made.  A model watched
before that dry run records it as the first forward of the first step, before the first
training forward: in train mode (the dropout of an evaluation left in train mode, P11) and,
without ``no_grad``, with a graph no backward used (P6).  It is neither.  The capture marks the
forward whose call made those parameters (``ForwardInfo.materialized``).
"""

from __future__ import annotations

from typing import Any

from ..run import Run, as_dict, as_list


def lazy_dry_run(run: Run) -> dict[str, Any] | None:
    """The forward (the step event's own dict: compare with ``is``) that materialised the
    model's lazy modules and that no backward used, or None."""
    for _, ev in run.step_events():
        forwards = [f for f in as_list(ev.get("forwards")) if isinstance(f, dict)]
        if forwards:
            dry = as_dict(forwards[0])
            return dry if dry.get("materialized") is True and dry.get("backward") is not True else None
    return None
