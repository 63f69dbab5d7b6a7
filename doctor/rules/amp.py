"""P14: AMP GradScaler trouble: steps skipped (inf/NaN after scaling), the scale collapsing, clipping
scaled gradients (unscale_ missing).

A GradScaler starts with a scale (65536 by default) that is usually too large for float16 and
halves it on every overflow until the scaled gradients fit: the skips of that calibration, at
the start of a run that then steps steadily, are normal (an info when there are enough of them to
look like trouble); skips after it are judged.
"""

from __future__ import annotations

from typing import Any

from torchscope.schema import Finding, FindingTarget

from ..finding import contiguous_runs, describe_steps, make
from ..run import Run, as_dict, as_float, as_int, as_list, notes
from ..settings import Settings
from ._grads import scaler_skipped
from .nonfinite import loss_nonfinite, origin, origin_target, origin_text

FIX = ("Find the overflow: normalise inputs, keep losses/softmax in float32 (autocast does for its own ops), "
       "check the data for inf/NaN; with clipping call scaler.unscale_(optimizer) before clip_grad_norm_.")
FIX_CLIP = ("Call scaler.unscale_(optimizer) after scaler.scale(loss).backward() and before clip_grad_norm_ / "
            "clip_grad_value_: clipping compares the threshold with the gradients as they are, and until then "
            "they are the scale times too large (scaler.step(optimizer) then does not unscale them again).")
FIX_NO_SCALER = ("Scale the loss with torch.amp.GradScaler: scaler.scale(loss).backward(); scaler.step(optimizer); "
                 "scaler.update(). Keep the parameters float32 and let autocast cast per op (model.half() makes the "
                 "updates float16 too), or autocast to torch.bfloat16, whose range is float32's and needs no scaler.")
FIX_CALIBRATION = ("Nothing to fix: a GradScaler starts at a large scale and halves it on each overflow until the "
                   "scaled gradients fit in float16; the steps it skips meanwhile do not update the model. Pass a "
                   "smaller init_scale to torch.amp.GradScaler to skip fewer.")


def _calibration(run: Run, settings: Settings) -> list[int]:
    """The skipped steps of the scaler's calibration: those before its first ``scaler_skip_steps``
    steps in a row without a skip (the scale found).  A run that never gets there (every step
    skipped, skips that never stop) has no calibration: all its skips are judged."""
    skips: list[int] = []
    steady = 0
    for step, ev in run.step_events():
        if loss_nonfinite(ev):  # a NaN batch: skipped whatever the scale, no calibration
            continue
        if scaler_skipped(ev):
            skips.append(step)
            steady = 0
        else:
            steady += 1
            if steady >= settings.scaler_skip_steps:
                return skips
    return []


def _many(skipped: list[int], run: Run, settings: Settings) -> bool:
    """A streak, or a large share of the run: more than the isolated skips of a scale that grew
    (every growth_interval steps) one step too far."""
    streak = max((len(r) for r in contiguous_runs(skipped)), default=0)
    share = len(skipped) / max(1, len(run.steps))
    return streak >= settings.scaler_skip_steps or (len(skipped) >= settings.scaler_skip_steps and share >= 0.1)


def _calibration_finding(run: Run, calibration: list[int], began: float | None, settled: float | None,
                         data: dict[str, object]) -> Finding:
    start = f"from {began:g} " if began is not None else ""
    to = f" ({start}to {settled:g})" if settled is not None else ""
    message = (f"GradScaler calibrated its scale: it skipped {len(calibration)} optimizer steps at the start "
               f"({describe_steps(calibration, run.last_step)}), lowering its scale after each float16 overflow{to}, "
               "then stepped steadily -- normal for a GradScaler, not a problem.")
    finding = make("P14", "info", message, FIX_CALIBRATION, calibration, rank=run.rank,
                   targets=[FindingTarget(step=calibration[0], rank=run.rank)], view="gradients", data=data)
    finding["title"] = "GradScaler calibrating its scale"
    return finding


def _skips_finding(run: Run, later: list[int], collapsed: list[int], calibration: list[int],
                   scales: list[float | None], data: dict[str, object]) -> Finding:
    steps = sorted(set(later) | set(collapsed))
    # each step records the scale it ran with (the update after the last one is not seen)
    low = min((s for s in scales if s is not None), default=None)
    scale_txt = f"; steps ran at a scale down to {low:g}" if low is not None else ""
    after = (f" besides the {len(calibration)} of its calibration ({describe_steps(calibration, run.last_step)})"
             if calibration else "")
    events = dict(run.step_events())
    nan_loss = [s for s in later if loss_nonfinite(events.get(s, {}))]
    if nan_loss and len(nan_loss) == len(later):
        why = ("because their loss itself was NaN/Inf, not because the scaling overflowed (the scaler skips any step "
               "whose gradients are not finite, and lowers its scale each time; see P4)")
    elif nan_loss:
        why = f"because the gradients overflowed ({len(nan_loss)} of those steps had a NaN/Inf loss already, see P4)"
    else:
        why = "because the gradients overflowed"
    # every step lost from some point on (or a scale that can no longer represent the gradients)
    # means no learning; fewer lost steps only slow it
    stuck = bool(later) and later[-1] == run.last_step and len(later) * 2 >= len(run.steps)
    effect = "the model is not learning" if stuck else "the skipped steps did not update the model"
    below = sorted(set(collapsed) - set(later))
    fell = (f"; after that its scale stayed below min_scale ({describe_steps(below, run.last_step)}), where "
            "float16 gradients underflow to zero: those steps learn little or nothing" if below else "")
    message = (f"GradScaler skipped {len(later)} of {len(run.steps)} optimizer steps{after} "
               f"({describe_steps(later or steps, run.last_step)}) {why}{scale_txt}: {effect}{fell}.")
    targets = [FindingTarget(step=steps[0], rank=run.rank)]
    src = None
    traced = _traced(run, later)
    if traced is not None:
        step, op, node = traced
        where = "turned finite (scaled) gradients into Inf/NaN" if node else "made Inf/NaN in the forward"
        message += f" Traced at step {step}: {origin_text(run, op, node)} {where}."
        targets.insert(0, origin_target(step, run.rank, op, node))
        src = str(op.get("src") or "") or None
    return make("P14", "warning", message, FIX, steps, rank=run.rank, targets=targets, src=src,
                view="graph" if traced is not None else "gradients", data=data)


def _traced(run: Run, skipped: list[int]) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
    """The latest skipped step whose capture was checked for Inf/NaN (the capture checks the
    step after a skipped one) and where its overflow began: the latest, as skips that go on
    have their lasting cause there, where the first may be the scale's calibration."""
    events = dict(run.step_events())
    for step in sorted(skipped, reverse=True):
        for graph in run.graphs_of(step):
            op, node = origin(graph, loss_nonfinite(events.get(step, {})))
            if op or node:
                return step, op, node
    return None


FIX_UNSCALED = ("Call backward() on what the scaler returns: scaler.scale(loss).backward() -- scaler.scale(loss) "
                "alone makes a new tensor and leaves loss as it was.")


def _unscaled(run: Run, settings: Settings) -> list[Finding]:
    """Steps a GradScaler unscales (it has a scale) whose backward passes ran on no scaled loss:
    a scaled loss is ``loss * scale`` (a MulBackward root); ``scaler.scale(loss)`` with its
    result dropped and ``loss.backward()`` leaves every gradient divided by the scale at step()."""
    steps: list[int] = []
    scale: float | None = None
    src: str | None = None
    for step, ev in run.step_events():
        this = as_float(as_dict(ev.get("scaler")).get("scale"))
        roots = [str(r) for r in as_list(ev.get("backward_roots"))]
        if this is None or this == 1.0 or as_int(ev.get("micro_batches")) <= 0 or not roots:
            continue
        if not any(r.startswith("MulBackward") for r in roots):
            steps.append(step)
            scale = scale or this
            src = src or next((str(b) for b in as_list(ev.get("backward_src")) if b), None)
    if len(steps) < settings.min_steps:
        return []
    message = (f"backward() ran on a loss the GradScaler did not scale ({describe_steps(steps, run.last_step)}), "
               f"while scaler.step() divides the gradients by its scale ({scale:g}) before the update: every update "
               f"is {scale:g} times too small, and float16 gradients underflow.")
    return [make("P14", "error", message, FIX_UNSCALED, steps, rank=run.rank, src=src, view="gradients",
                 targets=[FindingTarget(step=steps[0], rank=run.rank)], title="Loss not scaled by the GradScaler")]


def _no_scaler(run: Run) -> list[Finding]:
    """Backward passes of float16 -- a forward under ``autocast(dtype=torch.float16)``, or float16
    parameters (``model.half()``) -- in a run no GradScaler scaled a loss of: gradients below
    float16's smallest (6e-8) flush to zero, large ones overflow, and nothing tells."""
    trained = [(step, ev) for step, ev in run.step_events() if as_int(ev.get("micro_batches")) > 0]
    if not trained or any("scaler" in ev for _, ev in run.step_events()):
        return []
    half = [run.param_name(i) for i, p in enumerate(run.params)
            if p.get("dtype") == "float16" and p.get("requires_grad", True)]
    steps = [step for step, ev in trained if half or ev.get("autocast_dtype") == "float16"]
    if not steps:
        return []
    if half:
        shown = ", ".join(half[:3]) + (f" and {len(half) - 3} more" if len(half) > 3 else "")
        what = f"{len(half)} trained parameter{'s are' if len(half) > 1 else ' is'} float16 ({shown})"
    else:
        what = "the forward ran under torch.autocast(dtype=torch.float16)"
    message = (f"{what[0].upper()}{what[1:]} and no GradScaler scales the loss ({describe_steps(steps, run.last_step)}): gradients smaller than "
               f"float16's 6e-8 flush to zero and large ones overflow to inf, without an error.")
    return [make("P14", "warning", message, FIX_NO_SCALER, steps, rank=run.rank, params=half[:32], view="gradients",
                 targets=[FindingTarget(step=steps[0], rank=run.rank)],
                 title="float16 training without a GradScaler")]


def check(run: Run, settings: Settings) -> list[Finding]:
    skipped: list[int] = []
    collapsed: list[int] = []
    clip: list[int] = []
    clip_src: str | None = None
    scales: list[float | None] = []
    by_step: dict[int, float | None] = {}
    for step, ev in run.step_events():
        scale = as_float(as_dict(ev.get("scaler")).get("scale"))
        scales.append(scale)
        by_step[step] = scale
        if scaler_skipped(ev):
            skipped.append(step)
        if scale is not None and scale < settings.min_scale:
            collapsed.append(step)
        at = notes(ev, "clip_before_unscale")
        if at:
            clip.append(step)
            clip_src = clip_src or str(at[0].get("src") or "") or None  # the clip call's line
    findings: list[Finding] = []
    # a scale that fell below min_scale has collapsed: its skips were no calibration
    calibration = [] if collapsed else _calibration(run, settings)
    later = sorted(set(skipped) - set(calibration))
    data: dict[str, object] = {"scale": scales, "skipped": skipped, "calibration": calibration}
    if _many(later, run, settings) or collapsed:
        findings.append(_skips_finding(run, later, collapsed, calibration, scales, data))
    elif _many(calibration, run, settings):  # enough to look like trouble: say why it is not
        # each step records the scale it ran with: where it settled is the first steady step's
        settled = next((by_step[s] for s in sorted(by_step) if s > calibration[-1]), None)
        findings.append(_calibration_finding(run, calibration, by_step.get(calibration[0]), settled, data))
    if clip:
        findings.append(make("P14", "warning", f"Gradients were clipped while still scaled by the GradScaler "
                             f"({describe_steps(clip, run.last_step)}): call scaler.unscale_(optimizer) first.",
                             FIX_CLIP, clip, rank=run.rank, targets=[FindingTarget(step=clip[0], rank=run.rank)],
                             src=clip_src, view="gradients", data=data))
    return findings + _unscaled(run, settings) + _no_scaler(run)
