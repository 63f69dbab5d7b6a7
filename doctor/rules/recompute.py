"""P11 (info): a BatchNorm inside an activation-checkpointed segment updates its running statistics twice a step.

``torch.utils.checkpoint`` saves a segment's inputs and runs its forward again inside the
backward.  A BatchNorm in train mode there updates ``running_mean``, ``running_var`` and
``num_batches_tracked`` in both forwards, from the same batch: the gradients are those of the
unwatched step (the recompute normalises with the same batch statistics), but the statistics
eval() normalises with move with an effective momentum of 1 - (1 - m)^2 (0.19 for the default
0.1).  Plain PyTorch behaviour, which users meet as an eval accuracy that differs from the
same model trained without checkpointing (QA 47d).

Read from captured graphs: a batch-norm node whose saved tensors checkpoint's non-reentrant
hooks packed (``NodeRecord.checkpointed``), or, under ``use_reentrant=True``, a batch-norm op
that ran under no_grad beside the graph's ``CheckpointFunctionBackward`` node.  A light run has
no graph and is not judged.
"""

from __future__ import annotations

import re
from typing import Any

from torchscope.schema import Finding, FindingTarget

from ..finding import describe_steps, make
from ..run import Run, as_dict, as_int, as_list
from ..settings import Settings

FIX = ("Usually nothing to fix: the training's gradients are unchanged. To update the running statistics once a "
       "step, keep the BatchNorm layers out of the checkpointed function (checkpoint the convolutions and "
       "activations between them), or halve their momentum (momentum=0.05 updated twice moves them as 0.1 once).")

_MOMENTUM = re.compile(r"momentum=([0-9.eE+-]+|None)")


def _momentum(run: Run, path: str) -> float | None:
    """The module's momentum as its ``extra_repr`` prints it (0.1 unless said); None for a
    cumulative average (``momentum=None``), which two equal updates leave as it was."""
    for m in map(as_dict, as_list(run.session.get("modules"))):
        if m.get("path") == path:
            text = str(m.get("extra_repr") or "")
            if "track_running_stats=False" in text:
                return None
            found = _MOMENTUM.search(text)
            if found is None:
                return 0.1
            try:
                return float(found.group(1))
            except ValueError:  # "None"
                return None
    return None


def _running_stats(run: Run, path: str) -> bool:
    return "BatchNorm" in run.module_type(path) and _momentum(run, path) is not None


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _recomputed(graph: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Batch-norm module path -> its forward op, for each batch norm the backward of ``graph``
    runs again: a checkpointed node (non-reentrant), or a no_grad batch-norm op in the segment of
    a reentrant checkpoint's node (the node's module's parent: ``checkpoint_sequential``'s
    segments are runs of one ``Sequential``)."""
    ops = {as_int(op.get("id"), -1): op for op in map(as_dict, as_list(graph.get("ops")))}
    out: dict[str, dict[str, Any]] = {}
    segments: list[str] = []
    for node in map(as_dict, as_list(graph.get("nodes"))):
        name = str(node.get("name", ""))
        if name.startswith("CheckpointFunctionBackward"):
            segments.append(_parent(str(node.get("module", ""))))
        elif "BatchNorm" in name and node.get("checkpointed") and as_dict(node.get("attrs")).get("training") is not False:
            op = ops.get(as_int(node.get("op"), -1), {})
            out.setdefault(str(node.get("module", "")), op)
    for op in ops.values():
        module = str(op.get("module", ""))
        if "batch_norm" in str(op.get("name", "")) and op.get("grad_mode") is False \
                and op.get("phase", "forward") == "forward" \
                and any(not seg or module == seg or module.startswith(seg + ".") for seg in segments):
            out.setdefault(module, op)
    return out


def check(run: Run, settings: Settings) -> list[Finding]:
    seen: dict[str, tuple[int, dict[str, Any]]] = {}
    signatures: set[str] = set()
    for step, graph in run.all_graphs():
        found = {m: op for m, op in _recomputed(graph).items() if m and _running_stats(run, m)}
        for module, op in found.items():
            seen.setdefault(module, (step, op))
        if found:
            signatures.update(str(ev.get("graph_signature")) for s, ev in run.step_events()
                              if s == step and ev.get("graph_signature"))
    if not seen:
        return []
    # the steps of the same structure as a step whose graph showed it: the same segments ran
    steps = [s for s, ev in run.step_events() if str(ev.get("graph_signature")) in signatures] \
        or sorted({step for step, _ in seen.values()})
    mods = sorted(seen, key=lambda m: seen[m][0])
    momenta = sorted({m for m in (_momentum(run, p) for p in mods) if m is not None})
    m = momenta[0] if len(momenta) == 1 else 0.1
    shown = ", ".join(f"'{p}' ({run.module_type(p)})" for p in mods[:4]) + (f" and {len(mods) - 4} more" if len(mods) > 4 else "")
    one = len(mods) == 1
    first_op = seen[mods[0]][1]
    message = (f"{shown} {'runs' if one else 'run'} in train mode inside torch.utils.checkpoint "
               f"({describe_steps(steps, run.last_step)}): the backward's recompute runs {'its' if one else 'their'} "
               "forward again, so running_mean and running_var are updated twice a step from the same batch "
               f"(num_batches_tracked counts 2 a step) -- an effective momentum of {1 - (1 - m) ** 2:.3g} instead of "
               f"{m:g}. The gradients are unchanged; the statistics eval() normalises with move faster.")
    targets = [FindingTarget(step=seen[p][0], rank=run.rank, module=p) for p in mods[:20]]
    src = str(first_op.get("src") or "") or None
    if first_op.get("id") is not None:
        targets[0]["op"] = as_int(first_op.get("id"), -1)
    return [make("P11", "info", message, FIX, steps, rank=run.rank, targets=targets, modules=mods, src=src,
                 title="Batch-norm statistics updated twice under checkpointing", data={"momentum": m})]
