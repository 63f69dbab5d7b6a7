"""The rules, one module per pitfall family, registered in one list (the order findings are computed in)."""

from __future__ import annotations

from collections.abc import Callable

from torchscope.schema import Finding

from ..run import Run
from ..settings import Settings
from . import (
    accumulation,
    amp,
    copies,
    dead,
    errors,
    modes,
    nonfinite,
    norms,
    paths,
    retention,
    unused_graph,
    zero_grad,
)

Rule = Callable[[Run, Settings], list[Finding]]

RULES: list[tuple[str, Rule]] = [
    ("P1", paths.check_cut_paths),
    ("P2", dead.check),
    ("P3", norms.check),
    ("P4", nonfinite.check),
    ("P5", zero_grad.check),
    ("P6", unused_graph.check),
    ("P7", retention.check_graphs_alive),
    ("P8", errors.check_inplace),
    ("P9", paths.check_non_differentiable),
    ("P10", errors.check_double_backward),
    ("P11", modes.check),
    ("P12", copies.check),
    ("P13", retention.check_hooks),
    ("P14", amp.check),
    ("P15", accumulation.check),
]
