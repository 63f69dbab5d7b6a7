"""P2: dead branch: gradient reaches a parameter (or a module's output) but is (almost) all zeros.

Steps the GradScaler skipped are left out: their gradients overflowed (and clip_grad_norm_ then
zeroes the finite ones), so their zeros say nothing about the branch; so are the steps of a
diverged loss (P3's "Training diverged"), whose huge weights saturate the activations.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from torchscope.schema import Finding, FindingTarget

from .. import graph as g
from ..finding import and_list, describe_steps, make
from ..run import Run, as_dict, as_float, as_int, as_list, notes
from ..settings import Settings
from . import paths
from ._grads import applied_steps, column, floats, pruned_params, sparse_params, value
from .nonfinite import loss_nonfinite
from .norms import diverged_steps

FIX = ("Find what zeroes the branch: ReLUs that never fire (bad init or a large negative bias: try LeakyReLU/"
       "GELU or re-initialise), a gate multiplied by 0, a mask that is always off, or a branch whose output "
       "the loss ignores.")

FIX_SURGE = ("Lower the learning rate (or warm it up over the first steps), and clip gradients "
             "(torch.nn.utils.clip_grad_norm_ after backward()); then re-initialise or retrain: ReLUs switched off by "
             "those updates stay off.")

CANCELS_FIX = ("For a score-function (REINFORCE) loss take the log-probability of a sample that carries no "
               "gradient: a = dist.sample(), then -(dist.log_prob(a) * advantage).mean(); for a reparameterised loss "
               "use a = dist.rsample() in the loss itself, not in log_prob. A value less itself passes no gradient.")


def _cancelled(run: Run, modules: set[str]) -> tuple[str, str] | None:
    """(module, line) where a dead module's output reaches the loss only as ``(out + x) - out``:
    a Normal's ``log_prob`` of its own ``rsample()`` -- ``(loc + eps * scale - loc) / scale``
    does not depend on ``loc`` -- whose zero gradient read as a dead ReLU (QA 49a)."""
    for _, graph in run.all_graphs():
        graph_ops = g.ops(graph)
        made = g.producers(graph_ops)
        outputs = {int(t): str(op.get("module") or "") for op in graph_ops if _within(str(op.get("module") or ""), modules)
                   and op.get("phase", "forward") == "forward" for t in as_list(op.get("outputs")) if isinstance(t, int)}
        for op in graph_ops:
            ins = g.op_inputs(op)
            if str(op.get("name")) != "aten::sub" or len(ins) != 2:
                continue
            for total, part in ((ins[0], ins[1]), (ins[1], ins[0])):
                source = g.made_by(part, made)
                out = next((int(t) for t in as_list(source.get("outputs")) if t in outputs), None) if source else None
                added = g.made_by(total, made)
                if out is None or added is None or str(added.get("name")) != "aten::add":
                    continue
                if any(g.made_by(t, made) is source for t in g.op_inputs(added)):
                    return outputs[out], str(op.get("src") or "")
    return None


def _within(module: str, dead: set[str]) -> bool:
    """Whether ``module`` is a dead module or a sibling of one in its block (a ``Sequential``'s
    ReLU after its dead Linear: the block's output is the ReLU's; QA 49d)."""
    return module in dead or any("." in m and module.startswith(m.rsplit(".", 1)[0] + ".") for m in dead)


def _judged_steps(run: Run) -> Iterator[tuple[int, dict[str, Any]]]:
    """The steps whose zero gradients can tell a dead branch: not skipped by the GradScaler, not
    diverged, and finite -- a step whose loss or some gradient is NaN/Inf (P4's) zeroes
    gradients of its own: a ReLU's gradient at an input of -inf, a BatchNorm whose variance
    overflowed to inf (its output its bias alone, whatever its input).  A run fed inputs of
    ~1e20, NaN from its first step, read as a dead branch beside its P4 error (QA 53)."""
    diverged = set(diverged_steps(run))
    return ((step, ev) for step, ev in applied_steps(run) if step not in diverged and _finite(ev))


def _finite(ev: dict[str, Any]) -> bool:
    """Whether the step's losses and recorded gradients were all finite."""
    if loss_nonfinite(ev):
        return False
    if any(as_int(v) for name in ("nan", "inf") for v in column(ev, name)):
        return False
    return all(n is None or math.isfinite(n) for n in floats(ev, "norm"))


def _dead_params(run: Run, settings: Settings) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Parameters with (almost) all-zero gradients, by step: on steps where others learn (a dead
    branch), and on steps where every gradient is zero although the loss is not and no
    ``zero_grad(set_to_none=False)`` could have zeroed them (P5's case): the whole model."""
    dead: dict[int, list[int]] = {}
    whole: dict[int, list[int]] = {}
    # a pruned weight's gradient is zero where its mask is, by design -- but not everywhere: a
    # mask that zeroes the whole weight (amount=1.0, or pruning repeated until nothing is left)
    # leaves its layer's output its bias alone, and nothing before it learns (QA 52b: the
    # biases before it read as cancelling out of the loss, "nothing to fix")
    pruned = pruned_params(run)
    sparse = sparse_params(run) - pruned
    # a parameter the step's backward never reached keeps whatever .grad it had -- zeros after
    # zero_grad(set_to_none=False): not dead, unused that step (the idle head of a multi-task
    # loop whose heads take turns; QA 36a: a "dead branch" on every step)
    unreached = paths.unreached_by_step(run)
    # ... on the steps it is idle: one never reached at all (a layer the forward never uses,
    # zeros from zero_grad(set_to_none=False) at every step) is still told
    alive = {i for _, ev in _judged_steps(run) for i, n in enumerate(floats(ev, "norm")) if n} if unreached else set()
    # ... and, where no graph tells, a gradient of exactly zero left by zero_grad(set_to_none=False)
    # on a step between others that reach it: an expert of a mixture no token was routed to on
    # that step (its routing changes the graph nearly every step, so few were captured; QA 47b).
    # A dead branch does not come back: its zeros last to the end -- or, gone idle for good,
    # the whole expert is exactly zero while the same layer of another expert learns (a dead
    # ReLU inside an expert leaves its output layer's gradient; QA 47b: 'dead' for the last 6
    # steps of a 15-step run)
    last_alive = {i: step for step, ev in _judged_steps(run) for i, n in enumerate(floats(ev, "norm")) if n}
    first_alive = {i: step for step, ev in reversed(list(_judged_steps(run))) for i, n in enumerate(floats(ev, "norm")) if n}
    for step, ev in _judged_steps(run):
        norms = floats(ev, "norm")
        routed_away = ({i for i, n in enumerate(norms) if n == 0.0 and (
            last_alive.get(i, -1) > step or first_alive.get(i, step) < step and _other_member(run, i, norms))}
            if ev.get("zero_grad_set_to_none") is False else set())
        # zero_frac may be sampled every few steps; meanwhile a norm of exactly 0 says "all zeros"
        # (and a non-zero norm, conservatively, "not dead").
        sampled = floats(ev, "zero_frac")
        zf = [sampled[i] if i < len(sampled) and sampled[i] is not None
              else None if n is None else 1.0 if n == 0.0 else 0.0 for i, n in enumerate(norms)]
        idle = unreached.get(step, set()) & alive | routed_away
        flagged = [i for i, frac in enumerate(zf) if frac is not None and frac >= settings.dead_zero_frac
                   and i < len(norms) and norms[i] is not None and i not in sparse and i not in idle
                   and (i not in pruned or norms[i] == 0.0)]
        if not flagged:
            continue
        if len(flagged) < sum(1 for frac in zf if frac is not None) or any(norms[i] for i in flagged):
            # (every parameter mostly zeros but some not exactly: no "every gradient is exactly
            # zero" -- a factorisation machine's two tables, read by a few rows each, QA 48a)
            into = dead
        else:
            loss = as_float(ev.get("loss"))
            # the gradients were None before the backward (recorded: a file without the fact
            # cannot tell a zero_grad(set_to_none=False) after it, P5's case)
            # (a NaN loss with zero gradients is P4's mean over no elements, QA 47c)
            if ev.get("zero_grad_set_to_none") is not True or loss is None or loss == 0.0 or not math.isfinite(loss):
                continue
            into = whole
        for i in flagged:
            into.setdefault(i, []).append(step)
    return dead, whole


def _other_member(run: Run, index: int, norms: list[float | None]) -> bool:
    """Whether parameter ``index``'s whole member of a ``ModuleList`` got a gradient of exactly
    zero (or none) while the same parameter of another member got a non-zero one."""
    def norm(j: int) -> float | None:
        return norms[j] if j < len(norms) else None
    return any(all(not norm(j) for j in member) and any(norm(j) for j in same)
               for member, same in run.list_siblings(index))


def _dead_activations(run: Run, settings: Settings) -> dict[str, list[int]]:
    """Modules whose output's gradient was (almost) all zeros, by step -- unless a parameter of
    the module learned that step: its output got a gradient in some pass.  A step's output
    statistics gather its calls' (up to 32), and one of them may be all but zeros where
    another is not: a WGAN-GP critic's gradient penalty ``D(x_hat)``, whose double backward
    leaves exact zeros at a LeakyReLU's input."""
    dead: dict[str, list[int]] = {}
    for step, ev in _judged_steps(run):
        if paths.higher_order_step(run, step):
            # a loss made of gradients alone (StyleGAN2's lazy R1 step, QA 45a): its double
            # backward leaves exact zeros at a LeakyReLU's input on the penalty's own step
            continue
        acts = [as_dict(a) for a in as_list(ev.get("activation_grads"))]
        if any(a.get("module") == "" and (as_float(a.get("zero_frac")) or 0.0) >= settings.dead_zero_frac for a in acts):
            # no gradient into the model's own output: the loss is flat there (a hinge or margin
            # loss met on every sample, a solved batch), so nothing below it can be judged dead
            # (QA 48a: "Dead branch" on 105 of a MultiMarginLoss run's 120 steps)
            continue
        learning: set[str] | None = None
        for act in acts:
            act = as_dict(act)
            frac = as_float(act.get("zero_frac"))
            if frac is None or frac < settings.dead_zero_frac or act.get("module") is None:
                continue
            if learning is None:
                learning = _learning_modules(run, ev, settings)
            module = str(act["module"])
            parent = module.rpartition(".")[0]
            # a module without parameters (a ReLU) whose block learned: its output got a
            # gradient in another pass (SAC's policy loss takes min(q1, q2): no gradient for q2
            # there, while q2 learns from the critic's loss)
            if module not in learning and not (parent and parent in learning and not _owns_params(run, module)):
                dead.setdefault(module, []).append(step)
    return dead


FIX_TABLE = ("Nothing to fix if it is a table read by rows; if it is a layer's weight, find what zeroes its branch "
             "(a ReLU that never fires, a mask always off). mode='default' captures graphs that tell which.")


def _maybe_tables(run: Run, params: dict[int, list[int]]) -> dict[int, list[int]]:
    """With no captured graph to tell (``Run.row_tables``): the flagged parameters that are no
    layer's weight or bias but a module's own -- learned positions sliced to the sequence's
    length (``self.pos[:, :T]``), a centre-loss table indexed by the labels, a factorisation
    machine's rows -- which get a gradient in the rows they are read by only (QA 48a: light's
    "Dead branch" on both)."""
    if any(True for _ in run.all_graphs()):
        return {}
    # (one whose gradient is exactly zero on every such step reads no row at all: a dead branch,
    # QA 48c -- a table read by rows has those rows' gradients)
    norms = {step: floats(ev, "norm") for step, ev in run.step_events()}
    return {i: s for i, s in params.items()
            if "weight" not in (leaf := run.param_name(i).rpartition(".")[2]) and leaf != "bias"
            and any(i < len(norms.get(step, [])) and norms[step][i] for step in s)}


def _tables_finding(run: Run, tables: dict[int, list[int]], settings: Settings) -> Finding:
    names = [run.param_name(i) for i in sorted(tables)]
    steps = sorted({s for v in tables.values() for s in v})
    one = len(names) == 1
    message = (f"Gradient reaching {', '.join(names[:4])}{f' and {len(names) - 4} more' if len(names) > 4 else ''} is "
               f"{settings.dead_zero_frac:.0%}+ exact zeros ({describe_steps(steps, run.last_step)}). "
               f"{'It is' if one else 'They are'} no layer's weight or bias but a parameter of {'its' if one else 'their'} own, as a table is: learned "
               "positions sliced to the sequence's length, a centre-loss table indexed by the labels get a gradient "
               "in the rows they read only, by design; a weight of a dead branch looks the same, and a light run "
               "has no graph to tell which.")
    return make("P2", "info", message, FIX_TABLE, steps, rank=run.rank, params=names, view="gradients",
                modules=sorted({run.param_module(i) for i in tables}),
                targets=[FindingTarget(step=tables[i][0], rank=run.rank, param=run.param_name(i),
                                       module=run.param_module(i)) for i in sorted(tables)],
                title="Mostly zero gradients of a table (or a dead branch)")


def _owns_params(run: Run, module: str) -> bool:
    prefix = f"{module}."
    return any(run.param_module(i) == module or run.param_module(i).startswith(prefix) for i in range(len(run.params)))


def _learning_modules(run: Run, ev: dict[str, object], settings: Settings) -> set[str]:
    """The modules (and every module above them) with a parameter whose gradient this step is
    not (almost) all zeros."""
    norms, fracs = floats(ev, "norm"), floats(ev, "zero_frac")
    out: set[str] = set()
    for i, norm in enumerate(norms):
        frac = fracs[i] if i < len(fracs) else None
        if not norm or (frac is not None and frac >= settings.dead_zero_frac):
            continue
        module = run.param_module(i)
        out.add(module)
        while module:
            module = module.rpartition(".")[0]
            out.add(module)
    return out


FIX_CANCELS_PENALTY = ("Nothing to fix: on those steps the loss is made of gradients (a create_graph=True penalty "
                       "alone), which a bias does not change; it learns on the other steps.")
FIX_CANCELS = ("Nothing to fix: the loss is the same whatever this bias is (a difference of two outputs of the "
               "same layer -- a siamese distance, a WGAN critic's fake minus real -- or a normalisation right "
               "after the layer), so it cannot learn. Drop it (bias=False) to save the parameter.")


def _cancelling(run: Run, dead: dict[int, list[int]], candidates: dict[int, list[int]]) -> dict[int, list[int]]:
    """The biases among ``candidates`` whose gradient is zero while a weight of their own module
    gets one: the output gradient is not zero (the weight's is its product with the input) but
    sums to zero, so the loss does not change when the layer's outputs shift together.  A dead
    branch zeroes the weights' gradients too.  A bias with a tensor hook of the user's is left
    out: the hook may be what zeroes it (``g * 0``), and the dead-branch finding names it."""
    out: dict[int, list[int]] = {}
    hooked = set(_gradient_hooks(run)[0])
    for i, steps in candidates.items():
        if i in hooked:
            continue
        name, module = run.param_name(i), run.param_module(i)
        # (a parametrized weight -- spectral_norm, weight_norm -- is held by the layer's
        # ``parametrizations.weight``: its layer's all the same, QA 44d)
        siblings = [j for j in range(len(run.params)) if j != i and _layer_of(run.param_module(j)) == module]
        if name.rpartition(".")[2] == "bias" and siblings and any(j not in dead for j in siblings):
            out[i] = steps
    return out


def _layer_of(module: str) -> str:
    """The layer a parameter's module path belongs to: ``4`` of ``4.parametrizations.weight``."""
    head, sep, _ = module.partition(".parametrizations.")
    if sep:
        return head
    return "" if module.startswith("parametrizations.") else module


def _cancels_finding(run: Run, params: dict[int, list[int]]) -> Finding:
    names = [run.param_name(i) for i in sorted(params)]
    steps = sorted({s for v in params.values() for s in v})
    message = (f"The gradient of {', '.join(names[:4])}{' and more' if len(names) > 4 else ''} is exactly zero "
               f"while its layer's weight learns ({describe_steps(steps, run.last_step)}): the bias cancels out "
               "of the loss, by design -- not a dead branch.")
    # a loss made of gradients on some steps only (a lazy R1 penalty step): the bias learns on the
    # others, so no bias=False (QA 45a)
    penalty = all(paths.higher_order_step(run, s) for s in steps) and len(steps) < len(run.steps)
    finding = make("P2", "info", message, FIX_CANCELS_PENALTY if penalty else FIX_CANCELS, steps, rank=run.rank, params=names,
                   modules=sorted({run.param_module(i) for i in params}), view="gradients",
                   targets=[FindingTarget(step=params[i][0], rank=run.rank, param=run.param_name(i),
                                          module=run.param_module(i)) for i in sorted(params)])
    finding["title"] = "Bias that cancels out of the loss"
    return finding


def _gradient_hooks(run: Run) -> tuple[list[int], list[str]]:
    """The parameters with a tensor hook (``register_hook``) and the modules with a backward hook
    of the user's, as the capture last saw them (``gradient_hooks`` events)."""
    params: list[int] = []
    modules: list[str] = []
    for _, ev in run.step_events():
        for e in notes(ev, "gradient_hooks"):
            params = [as_int(i, -1) for i in as_list(e.get("params"))]
            modules = [str(m) for m in as_list(e.get("modules"))]
    return params, modules


def _hooks_note(run: Run, dead: list[int]) -> str:
    """The user's gradient hooks that can zero what reaches the dead parameters: tensor hooks on
    them, backward hooks on modules."""
    params, modules = _gradient_hooks(run)
    on = [run.param_name(i) for i in dead if i in params]
    parts = ([f"a tensor hook (register_hook) on {', '.join(on[:3])}"] if on else []) + (
        [f"a backward hook on {', '.join(repr(m) if m else 'the root module' for m in modules[:3])}"] if modules else [])
    return f" Gradient hooks of yours that can change it: {'; '.join(parts)} -- check what they return." if parts else ""


def _gate(run: Run, settings: Settings, steps: set[int]) -> tuple[str, str, float] | None:
    """(module, the module it reads, the share of zeros in the gradient of the latter's output)
    where the gradient stops, on the first captured step of
    ``steps``: the first module, in the forward's order, whose output gets a gradient while the
    output of a module it reads gets (almost) none -- a ReLU that never fires, a gate
    multiplied by 0.  Everything before it is dead because of it."""
    events = dict(run.step_events())
    for step, graph in run.all_graphs():
        if step not in steps:
            continue
        fracs = {str(a.get("module")): frac for act in as_list(events.get(step, {}).get("activation_grads"))
                 if (a := as_dict(act)).get("module") is not None and (frac := as_float(a.get("zero_frac"))) is not None}
        ops = g.ops(graph)
        written = g.writers(ops)
        for op in ops:
            module = str(op.get("module", ""))
            if op.get("phase") != "forward" or not module or fracs.get(module, 1.0) >= settings.dead_zero_frac:
                continue
            for t in as_list(op.get("inputs")):
                w = g.writer_before(written, as_int(t, -1), as_int(op.get("id"), -1))
                fed = str(w.get("module", "")) if w is not None else ""
                inside = fed.startswith(f"{module}.") or module.startswith(f"{fed}.")
                if fed and fed != module and not inside and fracs.get(fed, 0.0) >= settings.dead_zero_frac:
                    return module, fed, fracs[fed]
    return None


SURGE_FACTOR = 5.0  # a loss this many times its low before, on two steps or more: updates too large
SURGE_WINDOW = 20


def _surge_note(run: Run, first: int) -> str:
    """Whether the loss surged in the SURGE_WINDOW steps before the branch died (``first``), in
    words: a learning rate too high sends weights far enough to switch ReLUs off for good,
    short of P3's blow-up (a CNN whose loss rose 12x in two steps under SGD, then died)."""
    losses = [(step, v, ev) for step, ev in run.step_events() if first - SURGE_WINDOW <= step < first
              and (v := as_float(ev.get("loss"))) is not None and math.isfinite(v) and v > 0]
    for k, (low_step, low, _) in enumerate(losses):
        high = [(step, v, ev) for step, v, ev in losses[k + 1:] if v >= low * SURGE_FACTOR]
        if len(high) >= 2:
            step, peak, ev = max(high, key=lambda h: h[1])
            lrs = [v for v in (as_float(x) for x in as_list(ev.get("lr"))) if v is not None]
            at_lr = f", learning rate {max(lrs):g}" if lrs else ""
            return (f" It died after the loss surged {peak / low:.3g}x (from {low:.3g} at step {low_step} to {peak:.3g} "
                    f"at step {step}{at_lr}): updates that large can push a ReLU's inputs below zero for good -- "
                    "lower the learning rate (or warm it up).")
    return ""


def _sampled_note(run: Run, steps: list[int]) -> str:
    """How many steps had their gradients' share of zeros read (every tenth and captured ones,
    outside full mode), when fewer than all: "386 steps" of 5,000 are 386 of the 500 read."""
    read = {step for step, ev in applied_steps(run) if any(v is not None for v in floats(ev, "zero_frac"))}
    # (a step not read whose gradient norm was exactly 0 is flagged too: then the count is no share)
    return (f"; {len(steps):,} of the {len(read):,} steps whose share of zeros was read"
            if len(read) < len(run.steps) and set(steps) <= read else "")


def _all_zero(run: Run, params: dict[int, list[int]], steps: list[int]) -> bool:
    """Whether the flagged parameters' gradients were all exact zeros wherever it was read (not
    99% of them: a layer with a few live units still learns through them)."""
    at = set(steps)
    return all(frac == 1.0 for step, ev in applied_steps(run) if step in at
               for i, frac in enumerate(floats(ev, "zero_frac")) if i in params and frac is not None)


def _gate_note(run: Run, gate: tuple[str, str, float] | None) -> str:
    if gate is None:
        return ""
    module, fed, frac = gate
    kind, fed_kind = run.module_type(module), run.module_type(fed)
    none = "none" if frac == 1.0 else f"almost none ({frac:.1%} exact zeros)"
    why = f": a ReLU whose input is {'never' if frac == 1.0 else 'rarely'} positive" if "ReLU" in kind else ""
    return (f" The gradient stops at {module!r}{f' ({kind})' if kind else ''}: its output gets a gradient, but its "
            f"input, the output of {fed!r}{f' ({fed_kind})' if fed_kind else ''}, gets {none}{why}.")


FIX_PRUNED = ("Check the prune mask: module.weight_mask.mean() is the share of the weight kept (0.0: none). "
              "Prune a smaller amount (prune.l1_unstructured(module, 'weight', amount=0.5)), and mind that pruning a "
              "module again prunes that share of what is left (amount=0.9 three times keeps 0.1%); "
              "prune.remove(module, 'weight') makes the mask permanent.")


def _masked(run: Run, dead: dict[int, list[int]], params: dict[int, list[int]], pruned: set[int],
            gate: tuple[str, str, float] | None) -> tuple[list[int], list[int], bool]:
    """(culprits, behind, sure) of the dead parameters ``torch.nn.utils.prune`` masks: a pruned
    weight gets zeros where its mask is, by design, so one whose gradient is exact zeros
    everywhere has a mask that zeroes the whole weight (``amount=1.0``; QA 52b: light and
    default said only that the biases before it cancel out of the loss, "nothing to fix") or an
    input of zeros.  The culprits: where the modules' output gradients tell, those of the layer
    the gradient stops at (``sure``); else (light) those whose own layer's bias learns -- the
    layer's output gets a gradient and its weight none -- sure when nothing else is dead (a dead
    layer before it zeroes its input the same way).  ``behind``: the other pruned ones, dead
    behind them.  No culprit: ``behind`` is [] and the pruned ones are left to the dead branch
    found elsewhere (a dead ReLU before a pruned layer: QA 26), unless nothing else is dead."""
    masked = sorted(i for i in params if i in pruned)
    if not masked:
        return [], [], False
    if gate:
        culprits = [i for i in masked if _layer_of(run.param_module(i)) == gate[0]]
    else:
        learns = {j for _, ev in _judged_steps(run) for j, n in enumerate(floats(ev, "norm")) if n and j not in dead}
        culprits = [i for i in masked if any(j != i and _layer_of(run.param_module(j)) == _layer_of(run.param_module(i))
                                             for j in learns)]
    layers = {_layer_of(run.param_module(i)) for i in culprits}
    sure = bool(gate) or all(_layer_of(run.param_module(i)) in layers for i in params)
    return culprits, [i for i in masked if i not in culprits], sure


def _mask_buffer(run: Run, index: int) -> str:
    """The buffer that holds a pruned parameter's mask: ``torch.nn.utils.prune`` keeps the
    parameter as ``<name>_orig`` and the mask as ``<name>_mask`` on the same module
    (``2.weight_orig``: ``2.weight_mask``); pruned after ``watch()``, the parameter keeps its name."""
    name = run.param_name(index)
    return f"{name.removesuffix('_orig')}_mask"


def _masked_note(run: Run, culprits: list[int], behind: list[int], sure: bool, others: list[int]) -> tuple[str, str]:
    """The sentence and the fix of a dead branch with pruned weights in it (``_masked``);
    ``others``: the dead parameters of no culprit's layer."""
    if not culprits:
        names = [run.param_name(i) for i in behind]
        masks = [_mask_buffer(run, i) for i in behind]
        one = len(names) == 1
        checks = " and ".join(f"{m}.mean()" for m in masks[:3])
        return (f" {and_list(names)} {'is' if one else 'are'} pruned (torch.nn.utils.prune) and {'its' if one else 'their'} "
                "gradient is exact zeros everywhere, not only where the mask is: a prune mask zeroes the whole "
                f"weight ({checks} {'is' if one else 'are'} 0.0 then), or the layer's input is all zeros.",
                FIX + f" A pruned layer's mask can zero it all: check {checks}.")
    layers = list(dict.fromkeys(_layer_of(run.param_module(i)) for i in culprits))
    names = [run.param_name(i) for i in culprits]
    masks = [_mask_buffer(run, i) for i in culprits]
    one = len(culprits) == 1
    each = "the layer passes" if len(layers) == 1 else "each layer passes"
    checks = " and ".join(f"{m}.mean()" for m in masks[:3])
    shown = and_list([repr(m) for m in layers])
    if sure:
        note = (f" The prune mask of {shown} zeroes the whole weight: {and_list(names)} "
                f"(pruned with torch.nn.utils.prune) {'gets' if one else 'get'} a gradient of exact zeros everywhere, not "
                f"only where the mask is, so {each} its bias alone, whatever its input ({and_list(masks)}, the mask, "
                f"{'is' if one else 'are'} all zeros).")
    else:
        # light mode records no module outputs: a mask of zeros and an input of zeros (a dead
        # layer before it) leave the same gradients, so both are told (QA 53)
        before = [run.param_name(i) for i in others if i not in behind]
        dead_before = (f"{and_list(before[:3])}{' ...' if len(before) > 3 else ''} "
                       f"{'gets' if len(before) == 1 else 'get'} no gradient either") if before else ""
        learns = "its layer's bias learns" if one else "their layers' biases learn"
        light = run.session.get("mode") == "light"
        unseen = ("This run records no module outputs (mode='light')" if light else
                  "No captured step of this run shows the module outputs where it is dead")
        record = ", or record with mode='default'" if light else ""
        note = (f" The prune mask of {shown} zeroes the whole weight ({and_list(masks)} all zeros), or the mask keeps "
                "weights and the layer's input is all zeros, from a dead layer before it"
                f"{f' ({dead_before})' if dead_before else ''}: {and_list(names)} (pruned with torch.nn.utils.prune) "
                f"{'gets' if one else 'get'} a gradient of exact zeros everywhere, not only where the mask is, while "
                f"{learns}, and both leave these gradients. {unseen} to tell which: {checks} says (0.0: the mask, "
                f"and {each} its bias alone, whatever its input){record}.")
    if behind:
        note += (f" {'' if sure else 'If it is the mask, '}{and_list([run.param_name(i) for i in behind])}, pruned too, "
                 f"{'is' if len(behind) == 1 else 'are'} dead behind it: no gradient goes back through a weight of zeros.")
    kept = FIX_PRUNED[FIX_PRUNED.index("Prune a smaller"):]
    leaves = sorted({m.rpartition(".")[2] for m in masks})
    mask = f"{' / '.join(f'module.{leaf}.mean()' for leaf in leaves)} of {shown} ({and_list(masks)})"
    fix = (f"Check the prune mask: {mask} is the share of the weight kept (0.0: none). {kept}" if sure else
           f"Check the prune mask: {mask}, 0.0 means the mask zeroes the whole weight -- p{kept[1:]} Otherwise the "
           f"mask keeps weights and the layer's input is dead: {FIX[0].lower()}{FIX[1:]}")
    return note, fix


FIX_WHOLE = ("Look at what the loss sees last: a round()/floor()/sign() of the prediction (its gradient is zero: "
             "compute the loss on the raw prediction and round only for reporting, or pass the gradient straight "
             "through with x + (x.round() - x).detach()); an output activation that cannot produce the targets (a "
             "ReLU or clamp at the end of a regression net whose targets are negative or out of range), or a layer "
             "saturated everywhere: re-initialise or remove it.")


def _zeroed_by_loop(run: Run, params: dict[int, list[int]]) -> dict[int, tuple[list[int], str]]:
    """The dead parameters the loop itself zeroed (or set to None) after the backward on most of
    their dead steps -- ``p.grad.zero_()`` to keep a pretrained layer fixed (QA 46d: a "dead
    branch" whose fix sent the user after ReLUs): the capture's ``grads_cleared`` events."""
    cleared: dict[str, list[tuple[int, str]]] = {}
    for step, ev in run.step_events():
        last = as_int(ev.get("micro_batches"))
        for e in notes(ev, "grads_cleared"):
            if as_int(e.get("micro"), -1) != last:
                continue  # before a later backward of the step: a reset, not what optimizer.step() saw
            for name in as_list(e.get("params")):
                cleared.setdefault(str(name), []).append((step, str(e.get("src") or "")))
    out: dict[int, tuple[list[int], str]] = {}
    for i, steps in params.items():
        seen = cleared.get(run.param_name(i), [])
        if 2 * len({s for s, _ in seen} & set(steps)) > len(steps):
            out[i] = (steps, seen[0][1])
    return out


def _zeroed_finding(run: Run, zeroed: dict[int, tuple[list[int], str]]) -> Finding:
    names = [run.param_name(i) for i in sorted(zeroed)]
    steps = sorted({s for v, _ in zeroed.values() for s in v})
    src = next((src for _, src in zeroed.values() if src), "")
    at = f" at {src}" if src else ""
    message = (f"The gradient of {', '.join(names[:4])}{' ...' if len(names) > 4 else ''} is zeroed (or set to None) "
               f"by the loop after backward(){at} ({describe_steps(steps, run.last_step)}): "
               f"{'it does' if len(names) == 1 else 'they do'} not learn -- on purpose, when the layer is meant to "
               "stay fixed.")
    finding = make("P2", "info", message, FIX_ZEROED, steps, rank=run.rank, params=names, view="gradients",
                   modules=sorted({run.param_module(i) for i in zeroed}), src=src or None,
                   targets=[FindingTarget(step=steps[0], rank=run.rank, param=run.param_name(i),
                                          module=run.param_module(i)) for i in sorted(zeroed)])
    finding["title"] = "Gradient zeroed by the loop"
    return finding


FIX_ZEROED = ("To keep a layer fixed, p.requires_grad_(False) says so, skips its gradient and keeps the optimizer "
              "(its weight decay, its momentum) from moving it; to train it, remove the zeroing.")


FIX_ALL_ZERO = ("Initialise one factor of each product randomly and the other at zero, so the product starts at zero "
                "and still learns: LoRA initialises A with nn.init.kaiming_uniform_(A, a=math.sqrt(5)) and B with "
                "zeros (PEFT's default), a gated branch its value layer as usual and its gate at zero.")


def _all_zero_weights(run: Run, params: dict[int, list[int]]) -> bool:
    """Whether each of ``params`` held only zeros when its weights were first measured
    (``grads.weight_norm``, on the steps that sample updates)."""
    for _, ev in run.step_events():
        weights = as_list(as_dict(ev.get("grads")).get("weight_norm"))
        if weights:
            return all(i < len(weights) and weights[i] == 0.0 for i in params)
    return False


def _whole_finding(run: Run, params: dict[int, list[int]]) -> Finding:
    """Every gradient exactly zero while the loss is not: nothing reaches the model."""
    steps = sorted({s for v in params.values() for s in v})
    names = [run.param_name(i) for i in sorted(params)]
    fix = FIX_WHOLE
    message = (f"Every parameter's gradient is exactly zero although the loss is not "
               f"({describe_steps(steps, run.last_step)}): no gradient reaches the model, so it does not learn -- "
               "something between the model's output and the loss passes none (a step function whose gradient is "
               "zero everywhere -- round, floor, sign, a quantiser --, an output ReLU or clamp that is always off, a "
               "saturated activation).")
    if _all_zero_weights(run, params):
        # LoRA's A and B both initialised to zero: each one's gradient is the other's value
        # (QA 50a: the message blamed a round() or ReLU between the output and the loss)
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        message = (f"Every trainable parameter ({shown}) is all zeros and so is its gradient, although the loss is not "
                   f"({describe_steps(steps, run.last_step)}): where parameters enter the output as a product (LoRA's "
                   "B @ A, a gate times a value), each one's gradient is the others' value -- zero -- so none ever "
                   "moves.")
        fix = FIX_ALL_ZERO
    finding = make("P2", "warning", message, fix, steps, rank=run.rank, params=names, view="gradients",
                   modules=sorted({run.param_module(i) for i in params}),
                   targets=[FindingTarget(step=steps[0], rank=run.rank)])
    finding["title"] = "No gradient reaches the model"
    return finding


def check(run: Run, settings: Settings) -> list[Finding]:
    need = max(1, min(settings.min_steps, len(run.steps)))
    dead, whole = _dead_params(run, settings)
    params = {i: s for i, s in dead.items() if len(s) >= need}
    everything = {i: s for i, s in whole.items() if len(s) >= need}
    if everything and not paths.check_non_differentiable(run, settings):  # P9's zeros are told there
        return [_whole_finding(run, everything)]
    cancels = _cancelling(run, dead, params)
    params = {i: s for i, s in params.items() if i not in cancels}
    zeroed = _zeroed_by_loop(run, params)
    params = {i: s for i, s in params.items() if i not in zeroed}
    acts = {m: s for m, s in _dead_activations(run, settings).items() if len(s) >= need}
    found = [_cancels_finding(run, cancels)] if cancels else []
    if zeroed:
        found.append(_zeroed_finding(run, zeroed))
    tables = _maybe_tables(run, params)
    if tables:
        found.append(_tables_finding(run, tables, settings))
        params = {i: s for i, s in params.items() if i not in tables}
    if not params and not acts:
        return found
    steps = sorted({s for v in [*params.values(), *acts.values()] for s in v})
    gate = _gate(run, settings, set(steps))
    culprits, behind, sure = _masked(run, dead, params, pruned_params(run), gate)
    if behind and not culprits and (acts or any(i not in behind for i in params)):
        # a pruned layer behind a dead one (its input all zeros): told as before, by that one
        params = {i: s for i, s in params.items() if i not in behind}
        behind = []
        steps = sorted({s for v in [*params.values(), *acts.values()] for s in v})
    names = [run.param_name(i) for i in sorted(params)]
    # the module where the gradient stops first: the dashboard opens it
    modules = list(dict.fromkeys([*(gate[:1] if gate else ()), *sorted({run.param_module(i) for i in params} | set(acts))]))
    # the parameters themselves, not their modules: a layer after a dead one gets zero weight
    # gradients (its input is all zeros) while its bias still learns
    what = [*names, *(f"the output of {m!r}" if m else "the root module's output" for m in sorted(acts))]
    shown = ", ".join(what[:4]) + (f" and {len(what) - 4} more" if len(what) > 4 else "")
    if len(what) > 4 and names and acts:
        # counted apart: "0.weight, ... and 768 more" read as 772 parameters of a model with 604 (QA 46c)
        shown = (f"{len(names)} parameter{'s' if len(names) > 1 else ''} ({', '.join(names[:3])}"
                 f"{', ...' if len(names) > 3 else ''}) and the outputs of {len(acts)} module{'s' if len(acts) > 1 else ''}")
    surge = _surge_note(run, steps[0])
    message = (f"Gradient reaching {shown} is {settings.dead_zero_frac:.0%}+ exact zeros "
               f"({describe_steps(steps, run.last_step)}{_sampled_note(run, steps)}): "
               f"{'this branch is dead and does not learn' if _all_zero(run, params, steps) else 'this branch is (nearly) dead: it barely learns'}."
               f"{_gate_note(run, gate)}{surge}{_hooks_note(run, sorted(params))}")
    # died after a loss surge: the updates were too large, not the initialisation (QA 51b: the fix
    # line said "bad init ... try LeakyReLU" under a message saying to lower the learning rate)
    fix = FIX_SURGE if surge else FIX
    if culprits or behind:
        layers = {_layer_of(run.param_module(i)) for i in culprits}
        others = [i for i in sorted(params) if _layer_of(run.param_module(i)) not in layers]
        note, fix = _masked_note(run, culprits, behind, sure, others)
        message += note
    cancelled = _cancelled(run, {run.param_module(i) for i in params}) if params else None
    if cancelled is not None:
        module, src = cancelled
        message += (f" The output of {module!r} cancels out of the loss{f' at {src}' if src else ''}: it is read as "
                    "(output + x) - output, which does not depend on it -- as a Normal's log_prob of its own rsample() "
                    "reads (loc + eps * scale - loc) / scale.")
        fix = CANCELS_FIX
    targets = [FindingTarget(step=steps[0], rank=run.rank, module=m) for m in modules]
    targets += [FindingTarget(step=params[i][0], rank=run.rank, param=run.param_name(i),
                              module=run.param_module(i)) for i in sorted(params)]
    zero_frac = {run.param_name(i): [value(column(ev, "zero_frac"), i) for _, ev in run.step_events()]
                 for i in sorted(params)}
    return [*found, make("P2", "warning", message, fix, steps, rank=run.rank, targets=targets, modules=modules,
                         params=names, view="gradients", data={"zero_frac": zero_frac, "activations": acts})]
