"""P14: AMP GradScaler trouble: steps skipped (inf/NaN after scaling), the scale collapsing, clipping
scaled gradients (unscale_ missing)."""

from __future__ import annotations

from torchscope.schema import Finding, FindingTarget

from ..finding import contiguous_runs, describe_steps, make
from ..run import Run, as_dict, as_float, as_list
from ..settings import Settings

FIX = ("Find the overflow: normalise inputs, keep losses/softmax in float32 (autocast does for its own ops), "
       "check the data for inf/NaN; with clipping call scaler.unscale_(optimizer) before clip_grad_norm_.")


def check(run: Run, settings: Settings) -> list[Finding]:
    skipped: list[int] = []
    collapsed: list[int] = []
    clip: list[int] = []
    clip_src: str | None = None
    scales: list[float | None] = []
    for step, ev in run.step_events():
        scaler = as_dict(ev.get("scaler"))
        scale = as_float(scaler.get("scale"))
        scales.append(scale)
        if scaler.get("skipped") is True:
            skipped.append(step)
        if scale is not None and scale < settings.min_scale:
            collapsed.append(step)
        at = [as_dict(e) for e in as_list(ev.get("events")) if as_dict(e).get("what") == "clip_before_unscale"]
        if at:
            clip.append(step)
            clip_src = clip_src or str(at[0].get("src") or "") or None  # the clip call's line
    findings: list[Finding] = []
    data = {"scale": scales, "skipped": skipped}
    # A few isolated skips are the scaler calibrating its scale; a streak, or a large share, is trouble.
    streak = max((len(r) for r in contiguous_runs(skipped)), default=0)
    share = len(skipped) / max(1, len(run.steps))
    if streak >= settings.scaler_skip_steps or (len(skipped) >= settings.scaler_skip_steps and share >= 0.1) or collapsed:
        steps = sorted(set(skipped) | set(collapsed))
        low = min((s for s in scales if s is not None), default=None)
        scale_txt = f"; its scale fell to {low:g}" if low is not None else ""
        message = (f"GradScaler skipped {len(skipped)} of {len(run.steps)} optimizer steps because the gradients "
                   f"overflowed ({describe_steps(steps, run.last_step)}){scale_txt}: the model is not learning.")
        findings.append(make("P14", "warning", message, FIX, steps, rank=run.rank,
                             targets=[FindingTarget(step=steps[0], rank=run.rank)], view="gradients", data=data))
    if clip:
        findings.append(make("P14", "warning", f"Gradients were clipped while still scaled by the GradScaler "
                             f"({describe_steps(clip, run.last_step)}): call scaler.unscale_(optimizer) first.",
                             FIX, clip, rank=run.rank, targets=[FindingTarget(step=clip[0], rank=run.rank)],
                             src=clip_src, view="gradients", data=data))
    return findings
