"""P3: exploding or vanishing gradients, step by step (total norm) and layer by layer (within a step).

Steps the GradScaler skipped are left out: their gradients overflowed and were never applied.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from typing import Any

from torchscope.schema import Finding, FindingTarget

from ..finding import Severity, describe_steps, make
from ..run import Run, as_dict, as_float, as_int, as_list, notes
from ..settings import Settings
from ..source import src_line
from ._grads import (
    applied_steps,
    clipped_from,
    column,
    floats,
    is_matrix,
    norm_made,
    norms_made,
    numel,
    sparse_params,
    value,
)

FIX_EXPLODE = ("Clip the gradient norm (torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)) before "
               "optimizer.step(), lower the learning rate, and normalise inputs/activations.")
FIX_EXPLODE_CLIPPED = ("Clipping bounds the update, not its cause: look at those steps' batches (unnormalised "
                       "inputs, outliers, labels out of range) and their loss, lower the learning rate, and "
                       "normalise inputs/activations.")
FIX_DIVERGING = ("Lower the learning rate (by 3-10x; for SGD on a quadratic loss, below 2 / the largest curvature), "
                 "or add a warm-up; clip the gradient norm (torch.nn.utils.clip_grad_norm_) to stop the runaway.")
FIX_UNBOUNDED = ("Check the sign of each term of the loss (a VAE's KL divergence is added: recon + kl), keep "
                 "log-variances bounded (clamp them, or parameterise a variance with softplus), and constrain a "
                 "critic (gradient penalty, spectral norm); print each term of the loss for a few steps.")
FIX_LAYERS = ("Keep signal size constant through depth: use ReLU/GELU instead of sigmoid/tanh stacks, proper "
              "init (kaiming/xavier), normalisation layers (LayerNorm/BatchNorm) or residual connections.")


def _loss(ev: dict[str, Any]) -> float | None:
    loss = as_float(ev.get("loss"))
    return loss if loss is not None and math.isfinite(loss) else None


def _times(x: float) -> str:
    """A growth factor as people read it: ``340x``, ``2.4e+06x`` (not 9290820114371861020672x, QA 46a)."""
    return f"{x:.0f}x" if x < 1e5 else f"{x:.2g}x"


def _sorted_median(values: list[float]) -> float:
    """The median of an already sorted list, without statistics.median's sort of a copy (per
    step over all earlier steps: a 100k-step run's P3 took a minute)."""
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _over_time(run: Run, settings: Settings) -> tuple[list[Finding], set[int]]:
    """The findings, and the steps they say exploded or diverged (which the layer-by-layer ratio
    leaves out).  Step by step.  Exploding: far above the median of all earlier steps (a robust baseline: a
    converged run's norms hover near zero and bounce back up on a hard batch).  Vanishing: far below the largest norm
    while the loss did not fall with it (a loss going to zero takes its gradient along: that is
    convergence, not a pitfall)."""
    history = [(step, norm_made(ev), _loss(ev)) for step, ev in applied_steps(run)]
    exploding: list[int] = []
    vanishing: list[int] = []
    earlier: list[float] = []  # sorted, for the median
    seen = 0
    peak, peak_loss = 0.0, None  # largest norm so far and the loss at that step
    for step, norm, loss in history:
        if norm is None:
            continue
        if seen >= settings.min_steps:
            base = _sorted_median(earlier)
            if base > 0 and norm >= base * settings.explode_factor and norm >= settings.explode_min_norm:
                exploding.append(step)
            stalled = loss is not None and peak_loss is not None and loss > 0 and loss >= peak_loss / 100
            if stalled and norm <= peak / settings.vanish_factor:
                vanishing.append(step)
        seen += 1
        bisect.insort(earlier, norm)
        if norm > peak:
            peak, peak_loss = norm, loss
    data = {"norm": [n for _, n, _ in history], "steps": [s for s, _, _ in history]}
    out = []
    blown: set[int] = set()
    below = _unbounded_below(history)
    if below is not None:
        # a loss term with no floor: the norms grow as the loss falls, a consequence
        first, low_step, low, start = below
        out.append(make("P3", "warning",
                        f"The loss fell without bound: below zero from step {first}, down to {low:.3g} at step {low_step}, "
                        f"{-low / start:.3g}x the size it started at ({start:.3g}). A loss that started positive and "
                        "keeps falling has a term unbounded below: a sign error (a KL or a penalty subtracted instead of "
                        "added), a log-likelihood whose variance collapses, or a critic without a Lipschitz constraint.",
                        FIX_UNBOUNDED, [s for s, _, v in history if s >= first and (v is None or v < 0)], rank=run.rank,
                        targets=[FindingTarget(step=first, rank=run.rank)], view="gradients",
                        data={**data, "loss": [v for _, _, v in history]}, title="Loss unbounded below"))
        exploding = [s for s in exploding if s < first]
    diverging = _diverging(history)
    if diverging is not None and (not exploding or diverging[1] < exploding[0]):
        # the usual level a median of all earlier steps gives rises with the run itself: a
        # steady divergence reaches explode_factor over it only dozens of steps late
        start, end, norm_x, loss_x = diverging
        steps = [s for s, n, _ in history if s >= start and n is not None]
        blown.update(steps)
        out.append(make("P3", "warning",
                        f"Training is diverging: the gradient norm grew at every step from step {start} to step {end} "
                        f"({_times(norm_x)}) while the loss grew {_times(loss_x)}"
                        + (f"; it exploded past {settings.explode_factor:g}x its usual level at step {exploding[0]}"
                           if exploding else "") + ".", FIX_DIVERGING, steps, rank=run.rank,
                        targets=[FindingTarget(step=start, rank=run.rank)], view="gradients", data=data))
        exploding = []
    if exploding:
        first = exploding[0]
        grew = _grew_most(run, first)
        names = [run.param_name(i) for i, _ in grew]
        where = ""
        if grew:
            jumps = ", ".join(f"{run.param_name(i)} ({_times(g)})" for i, g in grew)
            where = f" At step {first} it jumped most in {jumps}, against their own earlier norms."
        targets = [FindingTarget(step=first, rank=run.rank, param=n, module=run.param_module(i))
                   for (i, _), n in zip(grew, names, strict=True)] or [FindingTarget(step=first, rank=run.rank)]
        clipped = _clip_note(run, exploding)
        blown.update(exploding)
        out.append(make("P3", "warning",
                        f"The gradient norm exploded: over {settings.explode_factor:g}x its usual level "
                        f"({describe_steps(exploding, run.last_step)}).{where}{clipped}",
                        FIX_EXPLODE_CLIPPED if clipped else FIX_EXPLODE, exploding,
                        rank=run.rank, targets=targets, modules=list(dict.fromkeys(t["module"] for t in targets if t.get("module"))),
                        params=names, view="gradients", data=data))
    blowup = loss_blowup(run)
    # while it stays up: a later lone spike is no part of it
    stayed = diverged_steps(run, blowup) if blowup is not None else []
    # up from the blow-up to the run's end, over a window: the run never recovered (QA 37d: a
    # learning rate jumped to 50, the loss stayed 50x up and two layers dead for 244 steps, and
    # the explosion's 3-step warning was all that was said)
    for_good = bool(stayed) and stayed[-1] >= run.last_step and len(stayed) >= BLOWUP_WINDOW
    if blowup is not None and exploding and exploding[0] <= blowup[2] and not for_good:
        blowup = None  # the gradients jumped with the loss: the explosion's finding (a batch's scale) says it
    if blowup is not None and diverging is None:
        # a learning rate far past the stability limit: the loss jumps by orders of magnitude
        # within a few steps, never rising at every step for DIVERGE_STEPS nor (clipped, or
        # under Adam) taking the gradient norm along
        low_step, low, step, loss, lr = blowup
        at_lr = f", the learning rate {lr:g} then" if lr is not None else ""
        blown.update(stayed or [step])
        out.append(make("P3", "error" if for_good else "warning",
                        f"Training diverged: the loss went from {low:.3g} at step {low_step} to {loss:.3g} at step "
                        f"{step}, {loss / low:.3g}x within {step - low_step} step{'s' if step - low_step != 1 else ''}"
                        f"{at_lr}.{_never_recovered(run, low, step, stayed) if for_good else ''}",
                        FIX_DIVERGING, stayed or [step], rank=run.rank,
                        targets=[FindingTarget(step=step, rank=run.rank)], view="gradients",
                        data={**data, "loss": [v for _, _, v in history]}, title="Training diverged"))
    if vanishing:
        out.append(make("P3", "warning",
                        f"The gradient norm vanished: below 1/{settings.vanish_factor:g} of its earlier level while the loss "
                        f"stayed high "
                        f"({describe_steps(vanishing, run.last_step)}).", FIX_LAYERS, vanishing, rank=run.rank,
                        targets=[FindingTarget(step=vanishing[0], rank=run.rank)], view="gradients", data=data))
    return out, blown


UNBOUNDED_FACTOR = 10.0  # below zero by this many times the size the loss started at


def _unbounded_below(history: list[tuple[int, float | None, float | None]]) -> tuple[int, int, float, float] | None:
    """(the step from which the loss stayed below zero, the step of its lowest, that loss, the
    size it started at) when a loss that started positive (the median of its first three)
    fell below zero to UNBOUNDED_FACTOR times that size and is still down there (its last at
    a tenth of the lowest or lower): no loss a model fits has no floor."""
    losses = [(s, v) for s, _, v in history if v is not None]
    if len(losses) < 4:
        return None
    first3 = [v for _, v in losses[:3]]
    start = statistics.median(first3)
    # a start clearly above zero: a loss that begins at noise around zero -- a policy
    # gradient's surrogate with normalised returns, SimSiam's negative cosine, both meant to go
    # negative -- has no size to be "ten times" of (QA 40a: 16.5x of 0.025)
    if min(first3) <= 0 or max(first3) - min(first3) > start:
        return None
    low_step, low = min(losses, key=lambda x: x[1])
    if low >= 0 or -low < UNBOUNDED_FACTOR * start or losses[-1][1] > low / 10:
        return None
    first = low_step
    for s, v in reversed([x for x in losses if x[0] <= low_step]):
        if v >= 0:
            break
        first = s
    return first, low_step, low, start


def _clip_note(run: Run, steps: list[int]) -> str:
    """What clipping did on those steps, where the loop clips ('' where it does not)."""
    at = set(steps)
    clips = [(step, before, as_float(as_dict(ev.get("grads"))["clip"].get("max_norm"))) for step, ev in run.step_events()
             if step in at and (before := clipped_from(ev)) is not None]
    if not clips:
        return ""
    step, before, max_norm = clips[0]
    to = f" to max_norm={max_norm:g}" if max_norm is not None else ""
    return (f" These are the norms before clip_grad_norm_ (step {step}: {before:.3g}), which scaled the "
            f"gradients down{to} before optimizer.step() used them: the gradients themselves exploded.")


BLOWUP_FACTOR = 100.0  # a loss this many times its lowest of the last BLOWUP_WINDOW steps ...
BLOWUP_OVER_START = 10.0  # ... and this many times where the run started: not a spike off a converged ~0
BLOWUP_WINDOW = 20
BLOWUP_EARLY = 1e4  # ... and this many times a start of only one or two losses


def loss_blowup(run: Run, before: int | None = None) -> tuple[int, float, int, float, float | None] | None:
    """The first step (before ``before``) whose finite positive loss is BLOWUP_FACTOR times the
    lowest of the BLOWUP_WINDOW steps before it and BLOWUP_OVER_START times the run's starting
    level (the median of its first three losses, of those before it: a blow-up at step 1 or 2
    was its own start -- QA 51b, Adam at lr=1: 1.33, 1.4e5, 1.2e7 -- and must then be
    BLOWUP_EARLY times it, one or two losses being a shaky start: MoCo's first loss, against an
    empty queue, is 1/950 of its second): (that low step, its loss, the step, its loss,
    the largest learning rate of the step before).  A learning rate past the stability limit
    takes a loss up by orders of magnitude within a few steps; a loss that grows over thousands
    of steps (a value loss as returns grow) or a spike off a converged loss is not that."""
    events = [(step, ev) for step, ev in run.step_events() if before is None or step < before]
    losses = [(k, step, loss, ev) for k, (step, ev) in enumerate(events) if (loss := _loss(ev)) is not None and loss > 0]
    if len(losses) < 2:
        return None
    window: deque[tuple[int, float]] = deque(maxlen=BLOWUP_WINDOW)
    prev: dict[str, Any] | None = None
    for n, (k, step, loss, ev) in enumerate(losses):
        if window:
            start = statistics.median(v for _, _, v, _ in losses[:min(n, 3)])
            over = BLOWUP_OVER_START if n >= 3 else BLOWUP_EARLY
            low_step, low = min(window, key=lambda w: w[1])
            if (loss >= low * BLOWUP_FACTOR and loss >= start * over
                    and _stays(events, k, statistics.median(v for _, v in window))):
                lrs = [v for v in (as_float(x) for x in as_list((prev or ev).get("lr"))) if v is not None]
                return low_step, low, step, loss, max(lrs) if lrs else None
        window.append((step, loss))
        prev = ev
    return None


def diverged_steps(run: Run, blowup: tuple[int, float, int, float, float | None] | None = None) -> list[int]:
    """The steps of a loss blow-up (``loss_blowup``, or the one given) while the loss stays up
    (BLOWUP_OVER_START times the low before it) or is NaN/Inf: weights grown huge there saturate
    tanh and sigmoid and switch ReLUs off for good, zeroing gradients as a symptom of the divergence."""
    blowup = blowup or loss_blowup(run)
    if blowup is None:
        return []
    _, low, start, _, _ = blowup
    out: list[int] = []
    for step, ev in run.step_events():
        if step < start:
            continue
        loss = _loss(ev)
        if loss is not None and loss < low * BLOWUP_OVER_START:
            break
        out.append(step)
    return out


BLOWUP_STAYS = 5  # the steps after a blow-up whose median loss must stay up


def _never_recovered(run: Run, low: float, step: int, stayed: list[int]) -> str:
    """What a divergence the run never came back from left: the loss's level after it, and the
    parameters whose gradients were exactly zero on most steps since (the weights it grew switch
    ReLUs off and saturate tanh/sigmoid for good: no dead-branch finding says it, P2 leaves a
    diverged run's steps out)."""
    after = [s for s in stayed if s > step]
    at = set(after)
    losses = sorted(v for s, ev in run.step_events() if s in at and (v := _loss(ev)) is not None)
    level = (f" It never recovered: over the {len(after)} steps to the run's end the loss stayed at "
             f"{losses[len(losses) // 2]:.3g} (median), {losses[len(losses) // 2] / low:.3g}x where it was."
             if losses else " It never recovered: the loss stayed up to the run's end.")
    zeros: dict[int, int] = {}
    for s, ev in run.step_events():
        if s in at:
            for i, n in enumerate(floats(ev, "norm")):
                if n == 0.0:
                    zeros[i] = zeros.get(i, 0) + 1
    dead = [i for i, c in sorted(zeros.items()) if 2 * c >= len(after)]
    if not dead:
        return level
    modules = list(dict.fromkeys(run.param_module(i) or "(root)" for i in dead))
    shown = ", ".join(modules[:4]) + (f" and {len(modules) - 4} more" if len(modules) > 4 else "")
    return (f"{level} {shown} got exactly zero gradients on most of those steps: the weights it grew switched "
            "their units off, and they no longer learn.")


def _stays(events: list[tuple[int, dict[str, Any]]], k: int, typical: float) -> bool:
    """Whether the loss after the k-th step stays up -- the median of the next BLOWUP_STAYS
    losses (NaN/Inf counting as up) at BLOWUP_OVER_START times ``typical``, the median of the
    window before -- or the run ends there: outlier batches whose loss falls back within a step
    or two to its noisy level are no divergence (two in a row passed a look at the next step
    alone, against the window's lowest batch: a long run with a few bad targets "diverged")."""
    after = [as_float(ev.get("loss")) for _, ev in events[k + 1:k + 1 + BLOWUP_STAYS]]
    ups = sorted(math.inf if v is None or not math.isfinite(v) else v for v in after)
    return not ups or ups[len(ups) // 2] >= typical * BLOWUP_OVER_START


DIVERGE_STEPS = 8  # consecutive steps of growth that make a divergence, not a hard batch or two
DIVERGE_FACTOR = 10.0  # growth over them of both the gradient norm and the loss


def _diverging(history: list[tuple[int, float | None, float | None]]) -> tuple[int, int, float, float] | None:
    """(first step, last step, norm growth, loss growth) of the first DIVERGE_STEPS consecutive
    steps over which the gradient norm rose at every step and both it and the loss grew at
    least DIVERGE_FACTOR-fold: a learning rate past the stability limit.  Healthy training's
    loss falls; a loss that rises tenfold with ever larger gradients does not."""
    rising: deque[tuple[int, float, float | None]] = deque(maxlen=DIVERGE_STEPS)  # the last steps of growth
    for step, norm, loss in history:
        if norm is None or not math.isfinite(norm):
            rising.clear()
            continue
        if rising and norm <= rising[-1][1]:
            rising.clear()
        rising.append((step, norm, loss))
        if len(rising) == DIVERGE_STEPS:
            (s0, n0, l0), (s1, n1, l1) = rising[0], rising[-1]
            if n0 > 0 and n1 >= n0 * DIVERGE_FACTOR and l0 is not None and l1 is not None and l0 > 0 \
                    and l1 >= l0 * DIVERGE_FACTOR:
                return s0, s1, n1 / n0, l1 / l0
    return None


def _grew_most(run: Run, at: int) -> list[tuple[int, float]]:
    """The parameters whose gradient norm grew most at step ``at`` over the median of their own
    earlier norms (a layer, not the model, is where an explosion starts): up to three, those
    within 10x of the largest growth, with their growth."""
    earlier: dict[int, list[float]] = {}
    now: list[float | None] = []
    for step, ev in applied_steps(run):
        norms = norms_made(ev)
        if step == at:
            now = norms
            break
        for i, v in enumerate(norms):
            if v is not None and math.isfinite(v):
                earlier.setdefault(i, []).append(v)
    growth: dict[int, float] = {}
    for i, v in enumerate(now):
        base = statistics.median(earlier[i]) if earlier.get(i) else 0.0
        if v is not None and math.isfinite(v) and base > 0:
            growth[i] = v / base
    top = max(growth.values(), default=0.0)
    if top <= 1:
        return []
    return sorted(((i, g) for i, g in growth.items() if g >= top / 10), key=lambda ig: -ig[1])[:3]


def _weights(run: Run) -> dict[int, float]:
    """param index -> sqrt(numel) of the weight matrices that carry the layer-by-layer signal."""
    sparse = sparse_params(run)
    n = len(run.params) or max((len(column(ev, "norm")) for ev in run.steps), default=0)
    return {i: math.sqrt(numel(run, i)) for i in range(n) if is_matrix(run, i) and i not in sparse}


def _layer_sizes(weights: dict[int, float], ev: dict[str, Any]) -> dict[int, float]:
    """param index -> per-element gradient size (norm / sqrt(numel)) of weights with a live gradient."""
    norms, zf = floats(ev, "norm"), floats(ev, "zero_frac")
    sizes = {}
    for i, norm in enumerate(norms):
        if i not in weights or norm is None or not math.isfinite(norm) or norm <= 0:
            continue
        if i < len(zf) and (zf[i] or 0.0) >= 0.99:  # a dead branch is P2's finding, not a depth effect
            continue
        sizes[i] = norm / weights[i]
    return sizes


def _depth_ratio(sizes: dict[int, float]) -> tuple[float, int, int]:
    """(ratio, first, large): how much larger the per-element gradient sizes are at the output
    end of the model than anywhere at its input end, the first weight, and the output end's
    largest.  In parameter order (the order modules are built in: the forward's for nearly
    every model) the output end is the median of its last quarter, each weight standing for the
    largest size among it and the next ones (up to 3); the input end is the largest size of its
    first quarter.

    Not the smallest weight against the largest, nor a median at the input end: some weights
    carry small gradients by design at every depth -- a transformer's attention query and key
    weights get theirs only through the attention scores, 1e-5 of a fresh BERT classifier's,
    and the weights of a residual branch scaled by a learnable LayerScale (ConvNeXt, CaiT,
    DeiT-III: ``x + gamma * f(x)``, gamma starting at 1e-6) get gamma times the gradient of the
    main path beside them, at every depth.  Vanishing gradients shrink whole layers, more the
    further they are from the loss: every weight at the input end is small.  One there with a
    gradient as large as the output end's (a ConvNeXt's stem) shows the gradient does reach it."""
    order = sorted(sizes)
    vals = [sizes[i] for i in order]
    q = max(1, len(vals) // 4)
    w = min(3, q)  # a window no wider than a quarter: a short model keeps its resolution
    env = [max(vals[k : k + w]) for k in range(len(vals))]
    # the output end's largest weight (the latest on a tie): the name beside the ratio is one
    # whose gradient is large, and the first weight's is at most the input end's largest
    large = max(reversed(order[-q:]), key=lambda i: sizes[i])
    return statistics.median(env[-q:]) / max(vals[:q]), order[0], large


def _across_layers(run: Run, settings: Settings, blown: set[int]) -> list[Finding]:
    """``blown``: the steps of an explosion or a divergence, left out -- the output end's
    gradient blown up and saturated layers passing nothing back are that finding's, no
    architecture's (QA 40a: "shrink 6e+61x" on an LSTM at lr=3 whose loss reached 6.9e33)."""
    flagged: list[int] = []
    worst: tuple[float, int, int, int] = (0.0, -1, -1, -1)  # ratio, step, input-end weight, output-end weight
    weights = _weights(run)
    for step, ev in applied_steps(run):
        if step in blown:
            continue
        sizes = _layer_sizes(weights, ev)
        if len(sizes) < 2:
            continue
        ratio, small, large = _depth_ratio(sizes)
        if ratio >= settings.layer_ratio:
            flagged.append(step)
            if ratio > worst[0]:
                worst = (ratio, step, small, large)
    if len(flagged) < max(1, min(settings.min_steps, len(run.steps))):
        return []
    ratio, step, small, large = worst
    s_name, l_name = run.param_name(small), run.param_name(large)
    message = (f"Gradients shrink {ratio:.0e}x from {l_name} to {s_name} within one step "
               f"({describe_steps(flagged, run.last_step)}): the layers near {s_name} barely learn.")
    severity: Severity = "warning"
    fix, title = FIX_LAYERS, None
    moves = _updates_alike(run, small, large)
    if moves is not None:
        # an adaptive optimizer (Adam) scales each parameter's step by its own gradient's size:
        # the weights move alike, so the small gradients are no layer that barely learns (QA 44d:
        # the Annotated Transformer's post-LN encoder, 3e4x, learning at 1.1e-2 against 1.7e-2)
        severity, fix, title = "info", FIX_ADAPTIVE, "Gradients shrink through depth, updates do not"
        message = (f"Gradients shrink {ratio:.0e}x from {l_name} to {s_name} within one step "
                   f"({describe_steps(flagged, run.last_step)}), but the updates do not: update ÷ weight "
                   f"{moves[0]:.2g} for {s_name} against {moves[1]:.2g} for {l_name} -- the optimizer scales each "
                   "parameter's step (as Adam does), so those layers still learn.")
    elif _adaptive(run) and not _ratios_read(run):
        # ``light`` reads no update ratios: under Adam the small gradients alone do not say that
        # those layers barely learn (QA 44e: a post-LN transformer was warned in light only)
        severity, fix, title = "info", FIX_ADAPTIVE, "Gradients shrink through depth"
        message = (f"Gradients shrink {ratio:.0e}x from {l_name} to {s_name} within one step "
                   f"({describe_steps(flagged, run.last_step)}). {run.session.get('optimizer')} scales each "
                   "parameter's step by its own gradient's size, so those layers may still learn; this run read no "
                   "update ÷ weight ratios to tell (mode='default' reads them).")
    targets = [FindingTarget(step=step, rank=run.rank, param=s_name, module=run.param_module(small)),
               FindingTarget(step=step, rank=run.rank, param=l_name, module=run.param_module(large))]
    per_layer = {run.param_name(i): [value(column(ev, "norm"), i) for _, ev in run.step_events()]
                 for i in sorted(_layer_sizes(weights, run.steps[-1]))}
    return [make("P3", severity, message, fix, flagged, rank=run.rank, targets=targets,
                 modules=[run.param_module(small), run.param_module(large)], params=[s_name, l_name],
                 view="gradients", title=title, data={"ratio": ratio, "norm_by_param": per_layer})]


FIX_ADAPTIVE = ("Nothing to fix while the optimizer scales each parameter's step (Adam, AdamW, RMSprop); with SGD "
                "those layers would barely move -- then keep the signal's size through depth (normalisation "
                "layers, residual connections, kaiming/xavier init).")


# Optimizers that divide each parameter's step by a running size of its own gradient
_ADAPTIVE = frozenset(("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "SparseAdam",
                       "Adafactor", "LAMB", "Lamb", "Lion"))


def _adaptive(run: Run) -> bool:
    return str(run.session.get("optimizer")) in _ADAPTIVE


def _ratios_read(run: Run) -> bool:
    return any(v is not None for _, ev in run.step_events() for v in column(ev, "update_ratio"))


def _updates_alike(run: Run, small: int, large: int) -> tuple[float, float] | None:
    """The median update ÷ weight of parameters ``small`` and ``large`` over the steps that read
    both (default mode: every tenth), when the small-gradient one moves at least a tenth as fast
    as the other: its gradient is small, its learning is not.  None: not read on two steps, or it
    does move that much slower."""
    pairs = [(a, b) for _, ev in run.step_events()
             for a, b in [(value(column(ev, "update_ratio"), small), value(column(ev, "update_ratio"), large))]
             if a is not None and b is not None and b > 0]
    if len(pairs) < 2:
        return None
    ours, theirs = statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs)
    return (ours, theirs) if ours >= theirs / 10 else None


FIX_CLIP_EARLY = ("Clip between backward and step: loss.backward(), then torch.nn.utils.clip_grad_norm_("
                  "model.parameters(), max_norm), then optimizer.step() (with a GradScaler, after "
                  "scaler.unscale_(optimizer)).")
FIX_CLIP_LATE = ("Clip between backward() and step(), not after the update: loss.backward(), then torch.nn.utils.clip_grad_norm_("
                 "model.parameters(), max_norm), then optimizer.step() (with a GradScaler, after "
                 "scaler.unscale_(optimizer)) -- a clip after step() only rescales gradients that zero_grad() "
                 "then clears.")


def _clip_after_step(ev: dict[str, Any], clip_src: str) -> str | None:
    """``optimizer.step()``'s line when the loop's lines read backward, then step, then the clip,
    in one file (``loss.backward()`` at 13, ``opt.step()`` at 14, ``clip_grad_norm_`` at 15): the
    clip that came where no backward of its step had ran after the update, not before the
    backward; None when the lines do not say so (another order, another file)."""
    clip, step = src_line(clip_src), src_line(ev.get("step_src"))
    backs = [b for b in (src_line(x) for x in as_list(ev.get("backward_src"))) if b is not None]
    if clip is None or step is None or not backs or any(b[0] != clip[0] for b in backs) or step[0] != clip[0]:
        return None
    return str(ev.get("step_src")) if max(b[1] for b in backs) < step[1] < clip[1] else None


def _clipped_before_backward(run: Run) -> list[Finding]:
    """clip_grad_norm_ of the watched gradients where no backward of its step had run (before
    loss.backward(), or after optimizer.step()): it clipped gradients this step's update does not
    use, and the ones it does use went unclipped (``events[{what: "clip_before_backward"}]``; a
    step that also clipped after its backward is left alone).  Which of the two, the lines tell
    (``_clip_after_step``): a clip after step() is seen at the next step's event, and is said as
    the step whose gradients it came too late for."""
    hits: list[tuple[int, str, str | None]] = []
    for step, ev in run.step_events():
        early = notes(ev, "clip_before_backward")
        if early and as_int(ev.get("micro_batches")) > 0 and "clip" not in as_dict(ev.get("grads")):
            src = str(as_dict(early[0]).get("src") or "")
            # the capture saw it come after the last step's update (before any forward, on its
            # gradients: ``after_step``, QA 52c), or the lines say so
            after_step = as_dict(early[0]).get("after_step") is True
            hits.append((step, src, _clip_after_step(ev, src) or (str(ev.get("step_src") or "?") if after_step else None)))
    if not hits:
        return []
    seen_at = [s for s, _, _ in hits]
    src = hits[0][1]
    after = hits[0][2] if all(h[2] for h in hits) else None
    # light/default watch that part of a step (optimizer.step() to the forward) on their first
    # steps and every few after: a loop that clips there does so on the steps between too
    partial = run.session.get("mode") != "full" and seen_at[-1] < run.last_step
    where = f" at {src}" if src else ""
    # seen at the step after (its boundary is the update): the gradients it clipped were the step's before
    steps = ([s - 1 for s in seen_at if s > 0] or seen_at) if after else seen_at
    seen = (f"seen {describe_steps(steps, run.last_step)}; the capture looks there on some steps only, and a loop "
            "does it on every step" if partial else describe_steps(steps, run.last_step))
    if after:
        step_at = f" (at {after})" if after != "?" else ""
        message = (f"clip_grad_norm_(){where} ran after optimizer.step(){step_at}, on gradients the update had "
                   f"already applied ({seen}): it changed nothing the model learned, so optimizer.step() applied "
                   "each step's gradients unclipped.")
        title = "Gradients clipped after optimizer.step()"
        fix = FIX_CLIP_LATE
    else:
        message = (f"clip_grad_norm_(){where} ran where no backward of its step had ({seen}): "
                   "before loss.backward(), or after optimizer.step(). It clipped gradients this step's update does not "
                   "use (the last step's, or zeros after zero_grad()), so optimizer.step() applied this step's "
                   "gradients unclipped.")
        title = "Gradients clipped before backward()"
        fix = FIX_CLIP_EARLY
    return [make("P3", "error", message, fix, steps, rank=run.rank,
                 targets=[FindingTarget(step=steps[0], rank=run.rank)], src=src or None, view="gradients",
                 title=title)]


def check(run: Run, settings: Settings) -> list[Finding]:
    over, blown = _over_time(run, settings)
    return over + _across_layers(run, settings, blown) + _clipped_before_backward(run)
