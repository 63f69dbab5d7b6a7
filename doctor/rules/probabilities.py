"""P16: a loss that normalises its input itself given probabilities instead of logits.

``nn.CrossEntropyLoss`` / ``F.cross_entropy`` apply ``log_softmax`` to their input and
``nn.BCEWithLogitsLoss`` applies a sigmoid: fed the output of a ``Softmax`` / ``sigmoid`` layer,
the model is squashed twice -- the loss cannot fall much below its start, and the gradient
reaching the model shrinks by the softmax's Jacobian.  ``NLLLoss`` expects log-probabilities:
fed probabilities, it maximises p instead of log p.  Found in the captured graph's dataflow:
the loss op's input is, through ops that only move or cast it, the normaliser's output.

Fed raw scores (``log_softmax`` forgotten), ``NLLLoss`` raises the target's score without bound:
its input is a layer's output (a linear or convolution op), or, with no graph (light), a loss
that was ``NllLossBackward0`` alone went below zero, which log-probabilities never give (QA 48a).
"""

from __future__ import annotations

from typing import Any

from torchscope.schema import Finding

from ..finding import in_captured_graphs, make
from ..graph import ops, producers, target_of_op
from ..run import Run, as_float, as_int, as_list
from ..settings import Settings

# ops that hand their input on unchanged in value: a view, a copy, a cast (autocast's to float32)
_PASS = frozenset({
    "aten::view", "aten::reshape", "aten::_unsafe_view", "aten::squeeze", "aten::unsqueeze", "aten::flatten",
    "aten::transpose", "aten::permute", "aten::contiguous", "aten::clone", "aten::_to_copy", "aten::to",
    "aten::alias", "aten::t", "aten::expand", "aten::slice", "aten::select", "aten::detach_", "aten::_reshape_alias",
})
_NLL = ("aten::nll_loss_forward", "aten::nll_loss2d_forward", "aten::nll_loss")
# loss op -> (what feeds it wrongly, what the user called, what they meant)
_CASES: dict[str, tuple[str, str, str]] = {
    "aten::_log_softmax": ("aten::_softmax", "cross_entropy (CrossEntropyLoss)", "softmax"),
    "aten::log_softmax": ("aten::_softmax", "cross_entropy (CrossEntropyLoss)", "softmax"),
    **{n: ("aten::_softmax", "nll_loss (NLLLoss)", "softmax") for n in _NLL},
    "aten::binary_cross_entropy_with_logits": ("aten::sigmoid", "binary_cross_entropy_with_logits (BCEWithLogitsLoss)",
                                               "sigmoid"),
}
FIX = {
    "softmax": ("Give the loss the logits, the output before the Softmax: nn.CrossEntropyLoss / F.cross_entropy "
                "apply log_softmax themselves (for NLLLoss, use log_softmax instead of softmax). Keep the Softmax "
                "for predictions only: torch.softmax(model(x), dim=-1) outside the loss."),
    "sigmoid": ("Give BCEWithLogitsLoss the logits, the output before the sigmoid (it applies the sigmoid itself, "
                "stably); keep torch.sigmoid for predictions only."),
}


# ops whose output is a layer's raw scores
_SCORES = frozenset({"aten::addmm", "aten::linear", "aten::mm", "aten::matmul", "aten::bmm", "aten::convolution",
                     "aten::_convolution", "aten::conv2d", "aten::conv1d"})
FIX_RAW = ("Apply log_softmax before NLLLoss (F.nll_loss(F.log_softmax(logits, dim=-1), y)), or give the logits to "
           "nn.CrossEntropyLoss / F.cross_entropy, which does both.")


# a number added to, taken from, or multiplying the scores: still no log-probabilities (one tensor input)
_BY_A_NUMBER = frozenset({"aten::div", "aten::mul", "aten::sub", "aten::add", "aten::rsub"})


def _source(op: dict[str, Any], made: dict[int, dict[str, Any]], want: str | frozenset[str],
            by_numbers: bool = False) -> dict[str, Any] | None:
    """The ``want`` op (one of them) whose output reaches ``op``'s first input through pass-through
    ops only (``by_numbers``: and arithmetic with a number, ``out - 10.0``, ``out / T``)."""
    inputs = as_list(op.get("inputs"))
    cur = made.get(as_int(inputs[0], -1)) if inputs else None
    for _ in range(16):  # a chain of views and casts, never a long one
        if cur is None:
            return None
        name = str(cur.get("name", ""))
        if name == want or (isinstance(want, frozenset) and name in want):
            return cur
        if name not in _PASS and not (by_numbers and name in _BY_A_NUMBER and len(as_list(cur.get("inputs"))) == 1):
            return None
        ins = as_list(cur.get("inputs"))
        cur = made.get(as_int(ins[0], -1)) if ins else None
    return None


def _raw_scores(run: Run) -> Finding | None:
    """NLLLoss given a layer's raw scores: seen in a captured graph, or, without one, told by
    a loss below zero on a step whose only backward root was the NLL loss."""
    steps: list[int] = []
    layer: tuple[int, dict[str, Any], dict[str, Any]] | None = None
    for step, g in run.all_graphs():
        graph_ops = ops(g)
        made = producers(graph_ops)
        for op in graph_ops:
            if str(op.get("name", "")) in _NLL and op.get("phase", "forward") == "forward":
                src = _source(op, made, _SCORES, by_numbers=True)
                if src is not None:
                    steps.append(step)
                    layer = layer or (step, src, op)
    below = [(s, v) for s, ev in run.step_events()
             if (v := as_float(ev.get("loss"))) is not None and v < 0
             and as_list(ev.get("backward_roots")) and all(str(r).startswith("NllLoss") for r in as_list(ev.get("backward_roots")))]
    if layer is None and not below:
        return None
    parts = []
    targets = []
    if layer is not None:
        first, src, op = layer
        kind = run.module_type(str(src.get("module")))
        where = f" of module {src['module']!r}" + (f" ({kind})" if kind else "") if src.get("module") else ""
        at = f" at {src['src']}" if src.get("src") else ""
        parts.append(f"its input is the raw output{where}{at}, not log_softmax's")
        targets = [target_of_op(first, run.rank, src), target_of_op(first, run.rank, op)]
    if below:
        s0, v0 = min(below, key=lambda b: b[1])
        parts.append(f"the loss went below zero ({v0:.3g} at step {s0}), which log-probabilities cannot give")
    what = "raw scores" if layer is not None else "raw scores or probabilities"  # (light: no graph to tell)
    message = (f"nll_loss (NLLLoss) was given {what}, not log-probabilities: " + "; ".join(parts) + ". It then "
               "raises the target's score without bound instead of its log-probability (a loss that falls past zero "
               "toward -inf, and no softmax over the classes).")
    return make("P16", "warning", message, FIX_RAW, sorted(set(steps) | {s for s, _ in below}), rank=run.rank,
                targets=targets, modules=[str(layer[1]["module"])] if layer and layer[1].get("module") else [],
                src=str(layer[2].get("src") or "") or None if layer else None, title="NLLLoss not given log-probabilities")


def check(run: Run, settings: Settings) -> list[Finding]:
    # (loss, line) -> the steps of each call, the normalising op, the loss op, its step, modules
    found: dict[tuple[str, str], tuple[list[int], dict[str, Any], dict[str, Any], int, list[str]]] = {}
    for step, g in run.all_graphs():
        graph_ops = ops(g)
        made = producers(graph_ops)
        for op in graph_ops:
            case = _CASES.get(str(op.get("name", "")))
            if case is None or op.get("phase", "forward") != "forward":
                continue
            src = _source(op, made, case[0])
            if src is None:
                continue
            key = (case[1], str(src.get("src") or src.get("module") or ""))
            if key not in found:
                found[key] = ([], src, op, step, [])
            found[key][0].append(step)
            if src.get("module") and src["module"] not in found[key][4]:
                # one line, several modules: an early-exit network's exits, each its softmax
                # (QA 50a: "exits.0.1" alone, and "captured graphs on 3 steps (0, 0, 0)")
                found[key][4].append(src["module"])
    findings: list[Finding] = []
    for (loss, _), (calls, norm_op, loss_op, first, mods) in found.items():
        steps = sorted(set(calls))
        kind = _CASES[str(loss_op.get("name"))][2]
        kind_of = run.module_type(str(norm_op.get("module")))
        named = ", ".join(repr(m) for m in mods[:4]) + (f" and {len(mods) - 4} more" if len(mods) > 4 else "")
        where = (f" of module{'s' if len(mods) > 1 else ''} {named}" + (f" ({kind_of})" if kind_of else "")) if mods else ""
        at = f" ({norm_op['src']})" if norm_op.get("src") else ""
        if kind == "sigmoid":
            why = "it applies a sigmoid itself, so the model's output is squashed twice and its gradient shrinks"
        elif "nll" in loss:
            why = ("it expects log-probabilities (log_softmax), so it reads the probabilities as log-probabilities: "
                   "the loss is minus the target's probability, not its log, and its gradient is off")
        else:
            why = ("it applies log_softmax itself, so the scores are squashed twice: the loss stalls well above "
                   "zero and the gradient reaching the model shrinks")
        message = (f"{loss} was given probabilities: its input is the {kind} output{where}{at}, not the logits; "
                   f"{why} ({in_captured_graphs(run, steps)}).")
        findings.append(make("P16", "warning", message, FIX[kind], steps, rank=run.rank,
                             targets=[target_of_op(first, run.rank, norm_op), target_of_op(first, run.rank, loss_op)],
                             modules=[str(m) for m in mods],
                             src=str(norm_op.get("src") or loss_op.get("src") or "") or None))
    # (probabilities into NLLLoss also give a loss below zero: told above, as what they are)
    raw = None if any("nll" in loss for loss, _ in found) else _raw_scores(run)
    return [*findings, raw] if raw is not None else findings
