"""P1 on one rank of a data-parallel run: parameters this rank's backward never reached whose
``.grad`` was filled all the same -- by DistributedDataParallel's all-reduce of the other
ranks' gradients (``find_unused_parameters=True`` lets a rank skip them without an error).
The rank's forward took another path than the others' (``if dist.get_rank() == 0: ...``):
the ranks train different functions, and those parameters learn from some ranks' data only,
at a fraction of the gradient.  Seen on steps whose every backward pass was captured: their
graphs name each parameter that pass accumulated into."""

from __future__ import annotations

from typing import Any

from torchscope.schema import Finding, FindingTarget

from ..finding import describe_steps, make
from ..run import Run, as_dict, as_int, as_list
from ..settings import Settings

FIX = ("Make the forward the same on every rank: a branch on dist.get_rank() (logging or a debug path on "
       "rank 0) must not change what the model computes. If some ranks really skip these layers (routing that "
       "depends on each rank's data), their gradient is the mean over all ranks' with zeros from the ranks that "
       "skipped them: scale their loss term to match, or keep these parameters out of DistributedDataParallel.")


def _accumulated(graphs: list[dict[str, Any]]) -> set[str]:
    """The parameters the step's AccumulateGrad nodes name."""
    return {str(n["param"]) for g in graphs for n in (as_dict(x) for x in as_list(g.get("nodes")))
            if n.get("param") and n.get("name") == "AccumulateGrad"}


def _skipped_here(run: Run, step: int, ev: dict[str, Any], names: list[str]) -> list[int]:
    """Indices of the parameters with a gradient of this step alone that no captured backward
    pass of it reached; none when the step was not captured whole or names no parameter."""
    graphs = run.graphs_of(step)
    micro = as_int(ev.get("micro_batches"), 0)
    if not graphs or len(graphs) != micro or any(g.get("complete") is False for g in graphs):
        return []
    reached = _accumulated(graphs)
    if not reached & set(names):  # sharded models accumulate into stand-ins the graph does not name
        return []
    grads = as_dict(ev.get("grads"))
    norms, stale = as_list(grads.get("norm")), {as_int(i, -1) for i in as_list(grads.get("pre_nonzero"))}
    return [i for i, name in enumerate(names)
            if i < len(norms) and norms[i] is not None and i not in stale and name not in reached]


def check(run: Run, settings: Settings) -> list[Finding]:
    if as_int(run.session.get("world_size"), 1) < 2 or not run.graphs:
        return []
    names = [run.param_name(i) for i in range(len(run.params))]
    hits: dict[int, list[int]] = {}  # parameter index -> steps
    for step, ev in run.step_events():
        for i in _skipped_here(run, step, ev, names):
            hits.setdefault(i, []).append(step)
    if not hits:
        return []
    indices = sorted(hits)
    steps = sorted({s for i in indices for s in hits[i]})
    shown = ", ".join(names[i] for i in indices[:4]) + (f" and {len(indices) - 4} more" if len(indices) > 4 else "")
    world = as_int(run.session.get("world_size"), 2)
    message = (f"{shown} took no part in rank {run.rank}'s backward ({describe_steps(steps, run.last_step)}: "
               f"no AccumulateGrad of {'theirs' if len(indices) > 1 else 'its'} in the graph), yet got a gradient: "
               f"the other ranks' of {world}, averaged in by DistributedDataParallel's all-reduce. This rank's "
               "forward skipped them -- a branch that depends on the rank makes the ranks train different "
               "functions, and these parameters learn from some ranks' data only, at a fraction of the gradient.")
    targets = [FindingTarget(step=steps[0], rank=run.rank, param=names[i], module=run.param_module(i)) for i in indices]
    return [make("P1", "warning", message, FIX, steps, rank=run.rank, targets=targets,
                 modules=sorted({run.param_module(i) for i in indices}), params=[names[i] for i in indices],
                 data={"graph_step": steps[0]})]
