"""P15: gradient accumulation over k micro-batches without dividing each loss by k."""

from __future__ import annotations

from typing import Any

from torchscope.schema import Finding, FindingTarget

from ..finding import describe_steps, make
from ..run import Run, as_dict, as_int, as_list
from ..settings import Settings
from ._grads import total_norm

# The loss handed to backward() ends in one of these when it was scaled (loss / k, loss * (1 / k)).
_SCALED_ROOTS = ("DivBackward", "MulBackward")

FIX = "Divide each micro-batch loss by the accumulation count before backward(): (loss / accum_steps).backward()."


def _scaled(graph: dict[str, Any], node: int, children: dict[int, list[int]], names: dict[int, str], depth: int = 0) -> bool:
    """Whether the loss at ``node`` is scaled on every term: a Div/Mul, or a sum or difference
    of scaled terms (``ce / k + 0.01 * reg / k`` ends in an add)."""
    name = names.get(node, "")
    if name.startswith(_SCALED_ROOTS):
        return True
    if depth > 16 or not name.startswith(("AddBackward", "SubBackward")):
        return False
    terms = [c for c in children.get(node, []) if names.get(c, "") not in ("", "AccumulateGrad")]
    return bool(terms) and all(_scaled(graph, c, children, names, depth + 1) for c in terms)


def _scaled_signatures(run: Run) -> set[object]:
    """Graph signatures whose captured graph shows every term of the loss scaled: the steps
    between captures share their step's structure (``graph_signature``)."""
    sigs: set[object] = set()
    for step, ev in run.step_events():
        for graph in run.graphs_of(step):
            names = {as_int(n.get("id"), -1): str(n.get("name", "")) for n in as_list(graph.get("nodes"))
                     if isinstance(n, dict)}
            children: dict[int, list[int]] = {}
            for e in as_list(graph.get("edges")):
                if isinstance(e, list) and len(e) >= 2:
                    children.setdefault(as_int(e[0], -1), []).append(as_int(e[1], -1))
            if ev.get("graph_signature") and _scaled(graph, as_int(graph.get("root"), -1), children, names):
                sigs.add(ev.get("graph_signature"))
    return sigs


def check(run: Run, settings: Settings) -> list[Finding]:
    steps: list[int] = []
    counts: list[int] = []
    roots_seen: set[str] = set()
    srcs: list[str] = []
    scaled = _scaled_signatures(run)
    for step, ev in run.step_events():
        # A backward that raised (P8/P10) accumulated nothing, nor does torch.autograd.grad
        # (it returns the gradients): don't count either as a micro-batch.
        grad_calls = [e for e in as_list(ev.get("events")) if as_dict(e).get("what") == "autograd_grad"]
        k = as_int(ev.get("micro_batches")) - len(as_list(ev.get("backward_errors"))) - len(grad_calls)
        if isinstance(ev.get("accumulated"), int):
            # the passes summed into .grad since it was last reset: an optimizer that zeroes
            # the gradients before each of its own backward passes (LBFGS) accumulates nothing
            k = as_int(ev.get("accumulated"))
        consumed = sum(1 for f in as_list(ev.get("forwards")) if as_dict(f).get("backward"))
        if consumed:
            # micro-batches are forwards: several losses backpropagated through one forward
            # (multi-task, loss1.backward(retain_graph=True); loss2.backward()) are one batch
            k = min(k, consumed)
        roots = [str(r) for r in as_list(ev.get("backward_roots"))]
        if k <= 1 or not roots or as_dict(ev.get("scaler")):
            continue  # GradScaler's own multiply hides whether the loss was divided: don't guess
        if not any(r.startswith(_SCALED_ROOTS) for r in roots) and ev.get("graph_signature") not in scaled:
            steps.append(step)
            counts.append(k)
            roots_seen.update(roots)
            srcs += [str(s) for s in as_list(ev.get("backward_src"))[:1]]
    if not steps:
        return []
    k = max(counts)
    message = (f"Gradients of {k} micro-batches were summed without dividing the loss by {k} "
               f"({describe_steps(steps, run.last_step)}): each optimizer step is {k}x larger than intended.")
    return [make("P15", "warning", message, FIX, steps, rank=run.rank,
                 targets=[FindingTarget(step=steps[0], rank=run.rank)], src=srcs[0] if srcs else None,
                 view="gradients",
                 data={"micro_batches": counts, "backward_roots": sorted(roots_seen),
                       "norm": [total_norm(ev) for _, ev in run.step_events()]})]
