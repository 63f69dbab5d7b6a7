"""P3: exploding or vanishing gradients, step by step (total norm) and layer by layer (within a step)."""

from __future__ import annotations

import math

from torchscope.schema import Finding, FindingTarget

from ..finding import describe_steps, make
from ..run import Run
from ..settings import Settings
from ._grads import column, is_matrix, numel, sparse_by_design, total_norm, value

FIX_EXPLODE = ("Clip the gradient norm (torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)) before "
               "optimizer.step(), lower the learning rate, and normalise inputs/activations.")
FIX_LAYERS = ("Keep signal size constant through depth: use ReLU/GELU instead of sigmoid/tanh stacks, proper "
              "init (kaiming/xavier), normalisation layers (LayerNorm/BatchNorm) or residual connections.")


def _over_time(run: Run, settings: Settings) -> list[Finding]:
    history = [(step, total_norm(ev)) for step, ev in run.step_events()]
    exploding: list[int] = []
    vanishing: list[int] = []
    seen: list[float] = []
    for step, norm in history:
        if norm is None:
            continue
        if len(seen) >= settings.min_steps:
            low = min((v for v in seen if v > 0), default=0.0)
            if low > 0 and norm >= low * settings.explode_factor:
                exploding.append(step)
            if norm <= max(seen) / settings.vanish_factor:
                vanishing.append(step)
        seen.append(norm)
    data = {"norm": [n for _, n in history], "steps": [s for s, _ in history]}
    out = []
    if exploding:
        out.append(make("P3", "warning",
                        f"The gradient norm exploded: over {settings.explode_factor:g}x its earlier level "
                        f"({describe_steps(exploding, run.last_step)}).", FIX_EXPLODE, exploding, rank=run.rank,
                        targets=[FindingTarget(step=exploding[0], rank=run.rank)], view="gradients", data=data))
    if vanishing:
        out.append(make("P3", "warning",
                        f"The gradient norm vanished: below 1/{settings.vanish_factor:g} of its earlier level "
                        f"({describe_steps(vanishing, run.last_step)}).", FIX_LAYERS, vanishing, rank=run.rank,
                        targets=[FindingTarget(step=vanishing[0], rank=run.rank)], view="gradients", data=data))
    return out


def _layer_sizes(run: Run, ev: dict[str, object]) -> dict[int, float]:
    """param index -> per-element gradient size (norm / sqrt(numel)) of weights with a live gradient."""
    norms, zf = column(ev, "norm"), column(ev, "zero_frac")  # type: ignore[arg-type]
    sizes = {}
    for i in range(len(norms)):
        norm, frac = value(norms, i), value(zf, i)
        if norm is None or not math.isfinite(norm) or norm <= 0 or not is_matrix(run, i) or sparse_by_design(run, i):
            continue
        if frac is not None and frac >= 0.99:  # a dead branch is P2's finding, not a depth effect
            continue
        sizes[i] = norm / math.sqrt(numel(run, i))
    return sizes


def _across_layers(run: Run, settings: Settings) -> list[Finding]:
    flagged: list[int] = []
    worst: tuple[float, int, int, int] = (0.0, -1, -1, -1)  # ratio, step, smallest, largest
    for step, ev in run.step_events():
        sizes = _layer_sizes(run, ev)
        if len(sizes) < 2:
            continue
        small = min(sizes, key=lambda i: sizes[i])
        large = max(sizes, key=lambda i: sizes[i])
        ratio = sizes[large] / sizes[small]
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
    targets = [FindingTarget(step=step, rank=run.rank, param=s_name, module=run.param_module(small)),
               FindingTarget(step=step, rank=run.rank, param=l_name, module=run.param_module(large))]
    per_layer = {run.param_name(i): [value(column(ev, "norm"), i) for _, ev in run.step_events()]
                 for i in sorted(_layer_sizes(run, run.steps[-1]))}
    return [make("P3", "warning", message, FIX_LAYERS, flagged, rank=run.rank, targets=targets,
                 modules=[run.param_module(small), run.param_module(large)], params=[s_name, l_name],
                 view="gradients", data={"ratio": ratio, "norm_by_param": per_layer})]


def check(run: Run, settings: Settings) -> list[Finding]:
    return _over_time(run, settings) + _across_layers(run, settings)
