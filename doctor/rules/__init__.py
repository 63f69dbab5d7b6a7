"""The rules, one module per pitfall family, registered in one list (the order findings are computed in)."""

from __future__ import annotations

from collections.abc import Callable

from torchscope.schema import Finding

from ..run import Run
from ..settings import Settings
from . import (
    accumulation,
    advantage,
    amp,
    copies,
    dead,
    errors,
    frozen,
    loss_cut,
    modes,
    nonfinite,
    norms,
    paths,
    penalty,
    probabilities,
    ranks,
    recompute,
    retention,
    unregistered,
    unused_graph,
    zero_grad,
)

Rule = Callable[[Run, Settings], list[Finding]]

RULES: list[tuple[str, Rule]] = [
    ("P1", lambda run, settings: (paths.check_cut_paths(run, settings) + unregistered.check(run, settings)
                                  + ranks.check(run, settings))),
    ("P2", dead.check),
    ("P3", norms.check),
    ("P4", nonfinite.check),
    ("P5", zero_grad.check),
    ("P6", unused_graph.check),
    ("P7", lambda run, settings: retention.check_graphs_alive(run, settings) + retention.check_weight_copies(run, settings)),
    ("P8", errors.check_inplace),
    # a loss without grad_fn is cut where it was computed: P1 for a detach or no_grad, P9 for an op
    ("P9", lambda run, settings: (paths.check_non_differentiable(run, settings) + loss_cut.check(run, settings)
                                  + penalty.check(run, settings))),
    ("P10", errors.check_double_backward),
    ("P11", lambda run, settings: modes.check(run, settings) + recompute.check(run, settings)),
    ("P12", copies.check),
    ("P13", retention.check_hooks),
    ("P14", amp.check),
    ("P15", accumulation.check),
    ("P16", probabilities.check),
    ("P17", frozen.check),
    ("P18", advantage.check),
]
