"""P12: redundant copies every step: data sent to a device (or dtype) and back, or copied over and over.

On a GPU the capture counts host<->device copies; on a CPU there are none, and what it can see
is the conversions themselves: `.to()`/`.cpu()` calls that return the same tensor (no-ops) and
dtype/device round trips (copy there, copy back) within one step, and repeated copies: a
conversion (`.to()`, `.float()`, `.cuda()`) of the same source storage it already converted
in an earlier step, or a copy of 1 MiB or more (`clone()`, `torch.tensor(t)`) of the same tensor
copied in an earlier step, i.e. work that could have been done once before the loop.
"""

from __future__ import annotations

from torchscope.schema import Finding, FindingTarget

from ..finding import Severity, describe_steps, fmt_bytes, make
from ..run import Run, as_dict, as_int, notes
from ..settings import Settings

FIX = ("Move the model and constant tensors to the device once, before the loop; keep tensors on the device "
       "between ops (no .cpu()/.numpy() round trips, no dtype back-and-forth); move each batch once; copy a dataset "
       "(clone(), torch.tensor(t)) once, not every step.")


SMALL_BYTES = 4096  # moved per step: below it a repeated conversion is told, not warned about


def check(run: Run, settings: Settings) -> list[Finding]:
    copy_steps: list[int] = []
    trip_steps: list[int] = []
    repeat_steps: list[int] = []
    noop_steps: list[int] = []
    per_step: list[int] = []
    bytes_moved: list[int] = []
    srcs: dict[str, list[str]] = {}  # kind of copy -> the lines of its events
    counted: list[int] = []  # steps whose copies the capture counted
    for step, ev in run.step_events():
        if "copies" in ev:
            counted.append(step)
        copies = as_dict(ev.get("copies"))
        count = as_int(copies.get("count"))
        trips = notes(ev, "round_trip")
        repeats = notes(ev, "repeat_copy")
        noops = notes(ev, "noop_to")
        noop_count = sum(max(1, as_int(e.get("count"), 1)) for e in noops)
        per_step.append(count)
        bytes_moved.append(as_int(copies.get("bytes")) + sum(as_int(e.get("bytes")) for e in trips + repeats))
        if count > settings.copies_per_step:
            copy_steps.append(step)
        if trips:
            trip_steps.append(step)
        if repeats:
            repeat_steps.append(step)
        if noop_count > settings.copies_per_step:
            noop_steps.append(step)
        for kind, found in (("repeat", repeats), ("trip", trips), ("noop", noops)):
            srcs.setdefault(kind, []).extend(str(e["src"]) for e in found if e.get("src"))
    need = max(1, min(settings.min_steps, len(run.steps)))
    data = {"copies": per_step, "bytes": bytes_moved}
    findings: list[Finding] = []
    moved = max(bytes_moved, default=0)
    # a few bytes a step (a class-weight vector's .float(): QA 45a, 16 B) cost nothing worth a warning
    small: Severity = "info" if 0 < moved < SMALL_BYTES else "warning"
    for steps, severity, text, kind in (
        (copy_steps, "warning", f"{max(per_step, default=0)} device copies per step", "copy"),
        (repeat_steps, small, "the same data converted/copied again every step", "repeat"),
        (trip_steps, small, "tensors copied to another device/dtype and back within each step", "trip"),
        (noop_steps, "info", ".to()/.cpu() called many times per step on tensors already there", "noop"),
    ):
        if len(steps) < need:
            continue
        # the line of this finding's kind of copy (QA 45a: a repeated .float() pointed at a no-op .to())
        mine = srcs.get(kind) or [x for k in ("repeat", "trip", "noop") for x in srcs.get(k, [])]
        src = mine[0] if mine else None
        # copies are counted on the steps the capture watches for them (the first four, then
        # every tenth): on a run where every one of those shows them, every step does
        # (a repeat needs an earlier conversion: never on the first)
        sampled = len(counted) < len(run.steps) and set(counted[1:]) <= set(steps)
        where = (f"{describe_steps(steps, run.last_step)}, judging by the steps copies are counted on -- the "
                 f"first four and every tenth" if sampled else describe_steps(steps, run.last_step))
        message = (f"Redundant copies: {text} ({where}"
                   f"{'; ' + fmt_bytes(moved) + ' moved per step' if moved else ''}).")
        findings.append(make("P12", severity, message, FIX, steps, rank=run.rank,  # type: ignore[arg-type]
                             targets=[FindingTarget(step=steps[0], rank=run.rank)], src=src, view="memory",
                             data=data))
    return findings
