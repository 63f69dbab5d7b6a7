"""P5: zero_grad() missing (gradients pile up across steps) or misplaced (cleared before step used them)."""

from __future__ import annotations

from typing import Any

from torchscope.schema import Finding, FindingTarget

from ..finding import Severity, and_list, describe_steps, list_steps, make
from ..run import (
    Run,
    as_dict,
    as_float,
    as_int,
    as_list,
    cleared_at,
    grad_off,
    moved_params,
    notes,
    trainable,
)
from ..settings import Settings

FIX_MISSING = ("Call optimizer.zero_grad() once per optimizer step, before the forward/backward of that step "
               "(with accumulation: after optimizer.step(), not after every backward).")
FIX_CLOSURE = ("Call optimizer.zero_grad() inside the closure, before loss.backward(): step(closure) calls it "
               "several times, and each call must start from empty gradients.")
FIX_MISPLACED = "Call optimizer.zero_grad() before loss.backward() (or after optimizer.step()), never between them."
FIX_INSIDE = ("Call optimizer.zero_grad() once per optimizer step -- before the accumulation loop, or right after "
              "optimizer.step() -- not inside the loop over micro-batches.")
FIX_FOREIGN = ("Pass watch() the model the optimizer trains and that optimizer: torchscope.watch(model, optimizer) "
               "with optimizer = torch.optim.AdamW(model.parameters()) built after the model's last assignment.")
FIX_FEATURES = ("Watch what trains: torchscope.watch(head, optimizer), or a module that holds both "
                "(nn.Sequential(backbone, head)). A backbone frozen on purpose is best said with "
                "backbone.requires_grad_(False), which also spares backward() its gradients.")
FIX_UNHELD_PARAMETRIZED = (
    "Build the optimizer after the model's last change -- a layer assigned anew (model.fc = nn.Linear(...)), "
    "weight_norm / spectral_norm / register_parametrization -- or add these parameters to it: "
    "optimizer.add_param_group({'params': [...]}).")
FIX_UNHELD = ("If they should train, add them to the optimizer -- build it after the model's last change (a layer "
              "assigned anew, weight_norm / spectral_norm / register_parametrization applied), or "
              "optimizer.add_param_group({'params': [...]}); if they are frozen on purpose, call "
              "requires_grad_(False) on them so backward() stops computing their gradients.")
FIX_CROSSED = ("Detach what the other model's loss reads from this one (a GAN's discriminator step: D(fake.detach())), "
               "or call this optimizer's zero_grad() right before its own backward.")


def _foreign_steps(run: Run) -> list[int]:
    """Steps whose optimizer holds none of the model's trainable parameters (every one of them is
    ``not_trained``): it was built over other tensors, so its step() never changes the model."""
    n = trainable(run)
    if not n:
        return []
    # the parameters trainable at watch(), by index: every one of them untrained, not as many
    # (a backbone unfrozen mid-run outside the optimizer is that many untrained parameters,
    # while the optimizer steps the head: P5's "no optimizer updates", below)
    held = {i for i, p in enumerate(run.params) if p.get("requires_grad", True)} if run.params else None
    steps = [step for step, ev in run.step_events()
             for untrained in [{as_int(i, -1) for i in as_list(as_dict(ev.get("grads")).get("not_trained"))} - {-1}]
             if (held <= untrained if held is not None else len(untrained) >= n)]
    if steps:
        return steps
    # watch(model) and no optimizer of the model's: the loop's optimizer.step() calls were of
    # another's parameters, at every step (a GAN's discriminator stepping before the generator's
    # optimizer is first seen makes one such step)
    foreign = [step for step, ev in run.step_events() if _foreign_count(ev) >= 2]
    return foreign if foreign and len(foreign) == len(run.steps) else []


def _features_only(run: Run, steps: list[int]) -> bool:
    """Whether every forward of the model in ``steps`` ran under no_grad or inference_mode and
    its parameters kept their values (no ``frozen_moved`` names one): a frozen backbone feeding
    a head the optimizer trains, not a model the optimizer lost -- nor an EMA teacher watched in
    place of the student, whose weights follow it (QA 47c)."""
    events = dict(run.step_events())
    forwards = [as_dict(f) for step in steps for f in as_list(events.get(step, {}).get("forwards"))]
    return not moved_params(run) and bool(forwards) and all(map(grad_off, forwards))


def _foreign_count(ev: dict[str, Any]) -> int:
    """How many optimizer.step() calls of none of the model's parameters this step saw."""
    return max((as_int(e.get("count")) for e in notes(ev, "foreign_step")), default=0)


def _foreign(run: Run) -> list[Finding]:
    steps = _foreign_steps(run)
    by_events = any(_foreign_count(ev) >= 2 for _, ev in run.step_events())
    if len(steps) < 2 and not (steps and by_events):  # (a last step closed at the run's end has no step())
        return []
    named = [str(e.get("optimizer")) for _, ev in run.step_events() for e in notes(ev, "foreign_step")]
    opt = str(run.session.get("optimizer") or (named[0] if named else "The watched optimizer"))
    model = str(run.session.get("model") or "the model")
    message = (f"{opt} steps none of the {trainable(run)} trainable parameters of {model} "
               f"({describe_steps(steps, run.last_step)}): optimizer.step() never changes the model. The optimizer "
               "was built over other tensors -- another instance of the model: one created again after the "
               "optimizer was, or a copy watched in place of the model the optimizer trains (an EMA teacher, a "
               "target network).")
    src = next((str(ev["step_src"]) for step, ev in run.step_events() if step in steps and ev.get("step_src")), None)
    if _features_only(run, steps):
        message = (f"{opt} steps none of the {trainable(run)} trainable parameters of {model}, and every forward of "
                   f"{model} ran without autograd ({describe_steps(steps, run.last_step)}): the watched model is a "
                   "frozen feature extractor for parameters outside it (a linear probe, a head trained on its "
                   "features), so what torchscope shows of it -- its graph, its gradients -- is not what trains.")
        return _wrong_model(run, steps, src, message, features=True)
    return _wrong_model(run, steps, src, message, features=False)


def _wrong_model(run: Run, steps: list[int], src: str | None, message: str, features: bool) -> list[Finding]:
    """P5's finding of a watched model the optimizer does not train: a frozen feature extractor
    beside what trains (a warning to watch that), else a model the optimizer lost (an error)."""
    return [make("P5", "warning" if features else "error", message, FIX_FEATURES if features else FIX_FOREIGN, steps,
                 rank=run.rank, targets=[FindingTarget(step=steps[0], rank=run.rank)], src=src, view="gradients",
                 title="The watched model only computes features" if features
                 else "The optimizer steps none of the model's parameters")]


def _missing(run: Run) -> list[Finding]:
    hits: dict[int, list[int]] = {}
    piled: dict[int, int] = {}  # step -> backward passes of its closure summed into .grad
    before = False  # a gradient non-zero before a step's first backward
    foreign = set(_foreign_steps(run))  # their gradients pile up for another reason (_foreign)
    for step, ev in run.step_events():
        if step in foreign:
            continue
        if as_list(ev.get("backward_errors")) and len(as_list(ev.get("backward_errors"))) >= as_int(ev.get("micro_batches")):
            # every backward of the step raised (P10's freed graph, P8): none added onto the old
            # gradients, and the step ended there (a DCGAN's generator loss backpropagated
            # through the critic's freed graph, before the loop's next zero_grad(): QA 37a)
            continue
        if as_int(ev.get("micro_batches")) > 1 and as_int(ev.get("zero_grad")) > 0 and not _closure_summed(ev):
            # stale gradients at the first backward (zero_grad counts 0 there), cleared before a
            # later one: the step used fresh ones (a GAN's discriminator gets the generator
            # loss's gradients, then zero_grad() and its own backward)
            continue
        grads = as_dict(ev.get("grads"))
        # a parameter no optimizer holds keeps its gradient through optimizer.zero_grad(): that
        # is no missing zero_grad, it is never trained (_unheld)
        unheld = {as_int(i, -1) for i in as_list(grads.get("not_trained"))}
        stale = {as_int(i, -1) for i in as_list(grads.get("pre_nonzero"))}
        before |= bool(stale - unheld - {-1})
        if _closure_summed(ev) >= 2:
            # a closure's passes summed into .grad: each pass after the first added onto the
            # one before, from the first step on, when .grad was still empty before the step
            # (QA 52b: "since step 1" of an LBFGS closure without zero_grad(), whose step 0
            # summed 7 passes; pre_nonzero is read before the step's first pass only)
            stale |= {i for i, v in enumerate(as_list(grads.get("norm"))) if v is not None}
            piled[step] = _closure_summed(ev)
        for i in sorted(stale - unheld):
            hits.setdefault(i, []).append(step)
    hits.pop(-1, None)
    if not before:
        # a closure's passes piled up, .grad cleared before each step: zero_grad() is outside the
        # closure, not missing (_closure_piled)
        hits = {}
    steps = sorted({s for v in hits.values() for s in v})
    # The last step alone is a backward after the loop's last optimizer step, closed at the end --
    # unless the run died in that step: then it is the step that proved the gradients piled up
    # (an optimizer that checks, such as Opacus' DPOptimizer, raises right there).
    crashed = run.end.get("status") == "error"
    if not steps or (steps == [run.last_step] and not crashed):
        return []
    names = [run.param_name(i) for i in sorted(hits)]
    message = (f"Gradients were already non-zero before backward ({describe_steps(steps, run.last_step)}): "
               f"zero_grad() is missing, so each step adds onto the old gradients of {len(names)} parameter(s).")
    first = next((ev for step, ev in run.step_events() if step == steps[0]), {})
    grads0 = as_dict(first.get("grads"))
    stale = {as_int(i, -1) for i in as_list(grads0.get("pre_nonzero"))} | (
        {i for i, v in enumerate(as_list(grads0.get("norm"))) if v is not None} if steps[0] in piled else set())
    if steps[0] in piled:
        message += (f" Inside optimizer.step(closure) too: step {steps[0]} summed {piled[steps[0]]} backward passes of "
                    "its closure into .grad.")
    # got a gradient at that step, and had none before its backward: cleared
    fresh = [i for i, v in enumerate(as_list(grads0.get("norm"))) if v is not None and i not in stale]
    if fresh and len(names) < trainable(run):
        # the others were cleared: a zero_grad() runs, but not for these (QA 46a: a second
        # optimizer of the body never zeroed read "zero_grad() is missing" beside the head's)
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        message = (f"The gradients of {shown} were already non-zero before backward "
                   f"({describe_steps(steps, run.last_step)}) while the other parameters' were cleared: "
                   "zero_grad() is missing for the optimizer that holds these (the zero_grad() that runs, another "
                   "optimizer's, does not reach them), so each step adds onto their old gradients.")
    # (step 0's gradients are empty with or without a zero_grad(): not a call seen)
    cleared = [step for step, ev in run.step_events() if step > 0 and as_int(ev.get("zero_grad")) > 0
               and step not in steps]
    if cleared:
        # cleared on some steps, piled up on the others: a zero_grad() under a condition (QA 44b:
        # inside the loop's `if step % 5 == 0:` logging block) read as "missing"
        message = (f"The gradients were cleared before some steps' backward only (step{'s' if len(cleared) > 1 else ''} "
                   f"{list_steps(cleared)}) and were already non-zero before it on the other {len(steps)} "
                   f"({list_steps(steps)}): each of those adds onto the old gradients of {len(names)} parameter(s). "
                   "Is the zero_grad() call inside a condition (a logging or evaluation block)?")
    targets = [FindingTarget(step=hits[i][0], rank=run.rank, param=run.param_name(i), module=run.param_module(i))
               for i in sorted(hits)]
    zero_calls = [as_int(ev.get("zero_grad")) for _, ev in run.step_events()]
    # the backward that added onto old gradients: zero_grad() goes before it
    src = next((str(b) for step, ev in run.step_events() if step == steps[0]
                for b in as_list(ev.get("backward_src"))[:1] if b), None)
    src = src or next((str(ev["step_src"]) for _, ev in run.step_events() if ev.get("step_src")), None)
    closure = any(notes(ev, "closure") for _, ev in run.step_events())
    return [make("P5", "error", message, FIX_CLOSURE if closure else FIX_MISSING, steps, rank=run.rank, targets=targets,
                 modules=sorted({run.param_module(i) for i in hits}), params=names, src=src, view="gradients",
                 data={"zero_grad_calls": zero_calls})]


def _shown(names: list[str]) -> str:
    return and_list(names[:6] + ([f"{len(names) - 6} more"] if len(names) > 6 else []))


def _unheld(run: Run) -> list[Finding]:
    """Parameters that get gradients while no optimizer stepping holds them (``grads.not_trained``
    with a gradient at optimizer.step()): they never train, and optimizer.zero_grad() leaves their
    .grad to pile up.  weight_norm applied after the optimizer was built is the usual cause: its
    ``parametrizations.weight.original0/1`` are new tensors the optimizer never saw."""
    foreign = set(_foreign_steps(run))  # the optimizer holds none of them: _foreign
    got: dict[int, list[int]] = {}
    piled: set[int] = set()
    stale = 0  # the optimizer's parameters that are not the model's and get no gradient
    for step, ev in run.step_events():
        if step in foreign or as_list(ev.get("backward_errors")):
            continue
        stale = max([stale, *(as_int(e.get("count")) for e in notes(ev, "stale_params"))])
        grads = as_dict(ev.get("grads"))
        unheld = {as_int(i, -1) for i in as_list(grads.get("not_trained"))} - {-1}
        if not unheld:
            continue
        norms = as_list(grads.get("norm"))
        for i in sorted(unheld):
            v = norms[i] if i < len(norms) else None
            if v is not None and as_float(v) != 0.0:
                got.setdefault(i, []).append(step)
        piled |= unheld & {as_int(i, -1) for i in as_list(grads.get("pre_nonzero"))}
    # on 2+ steps (a one-step run: its only step): a backward(inputs=...) leaving a parameter out once is no pattern
    got = {i: s for i, s in got.items() if len(s) >= 2 or run.last_step == 0}
    if not got:
        return []
    index = sorted(got)
    steps = sorted({s for v in got.values() for s in v})
    names = [run.param_name(i) for i in index]
    parametrized = [n for n in names if ".parametrizations." in f".{n}"]
    # the steps of each: a group added later (optimizer.add_param_group at step 5) was left
    # out on steps 0-4 only, which "since step 0, every step" for all of them misread
    when: dict[str, list[str]] = {}
    for i in index:
        when.setdefault(describe_steps(got[i], run.last_step), []).append(run.param_name(i))
    if len(when) == 1:
        message = (f"{len(names)} parameter(s) get gradients but no optimizer updates them "
                   f"({describe_steps(steps, run.last_step)}): {_shown(names)} are in none of the stepping "
                   "optimizer's param groups, so they never train")
    else:
        parts = and_list([f"{_shown(ns)} ({w})" for w, ns in when.items()])
        message = (f"{len(names)} parameter(s) get gradients but no optimizer updates them: {parts} were in none "
                   "of the stepping optimizer's param groups on those steps, so they did not train then")
    message += (" -- and optimizer.zero_grad() does not clear them, so their .grad piles up step after step."
                if piled & set(index) else ".")
    if parametrized:
        message += (" They were made by a parametrization (weight_norm, spectral_norm, register_parametrization) "
                    "applied after the optimizer was built: it replaced the layer's weight with new parameters, "
                    "and the optimizer still steps the old weight, which the model no longer uses.")
    elif stale:
        message += (f" The optimizer steps {stale} tensor(s) that are not the model's parameters and get no gradient: "
                    "a layer assigned anew after the optimizer was built (`model.fc = nn.Linear(...)`) leaves it "
                    "stepping the old layer's parameters, and the new layer never trains.")
    severity: Severity = "error" if parametrized or stale else "warning"
    targets = [FindingTarget(step=got[i][0], rank=run.rank, param=run.param_name(i), module=run.param_module(i))
               for i in index]
    src = next((str(ev["step_src"]) for _, ev in run.step_events() if ev.get("step_src")), None)
    return [make("P5", severity, message, FIX_UNHELD_PARAMETRIZED if parametrized or stale else FIX_UNHELD, steps,
                 rank=run.rank, targets=targets, modules=sorted({run.param_module(i) for i in index}),
                 params=names, src=src, view="gradients", title="Parameters no optimizer updates")]


FIX_OUTSIDE = ("Clear every gradient the optimizer steps: optimizer.zero_grad() instead of model.zero_grad() "
               "(or zero those tensors' gradients too).")


def _outside(run: Run) -> list[Finding]:
    """Tensors the optimizer steps outside the model (``outside_params``) whose gradients were
    not zero before a step's first backward, while the model's were: ``model.zero_grad()``
    clears the model only, and their gradients pile up."""
    steps: list[int] = []
    shapes: list[object] = []
    count = 0
    for step, ev in run.step_events():
        if as_list(as_dict(ev.get("grads")).get("pre_nonzero")):
            continue  # the model's too: a missing zero_grad (that finding)
        for e in notes(ev, "outside_params"):
            steps.append(step)
            count = max(count, as_int(e.get("pre_nonzero")))
            shapes = shapes or as_list(e.get("shapes"))
    if len(steps) < 2:
        return []
    shown = ", ".join(str(tuple(as_list(sh))) for sh in shapes)
    message = (f"zero_grad() cleared the model's gradients but not those of {count} tensor(s) the optimizer steps "
               f"that are not the model's parameters (shape {shown}): their gradients pile up from step to step "
               f"({describe_steps(steps, run.last_step)}), so each update adds up every earlier step's gradient.")
    src = next((str(b) for step, ev in run.step_events() if step == steps[0]
                for b in as_list(ev.get("backward_src"))[:1] if b), None)
    return [make("P5", "error", message, FIX_OUTSIDE, steps, rank=run.rank, src=src, view="gradients",
                 targets=[FindingTarget(step=steps[0], rank=run.rank)], title="Gradients outside the model never cleared")]


def _misplaced(run: Run) -> list[Finding]:
    n = trainable(run)
    steps: list[int] = []
    for step, ev in run.step_events():
        if as_int(ev.get("micro_batches")) <= 0 or as_int(ev.get("zero_grad")) <= 0 or not n:
            continue
        if as_dict(ev.get("scaler")) or as_list(ev.get("backward_errors")):
            continue  # a skipped AMP step or a failed backward also leaves gradients empty
        if run.cut_before_model(step, ev):
            continue  # P1's cut before a leaf loss (or before the parameters), not zero_grad
        grads = as_dict(ev.get("grads"))
        none = {as_int(i, -1) for i in as_list(grads.get("none"))}
        norms = [as_float(v) for v in as_list(grads.get("norm"))]
        # A loss of exactly 0 (a fitted batch, satisfied margins) has all-zero gradients for real,
        # and so does a loss through round(), sign() or a comparison (P9).  Zeroed gradients come
        # from zero_grad(set_to_none=False) only: a loop whose gradients were None before its
        # backward clears them to None, so zeros at step() are what the backward computed.
        loss_zero = as_float(ev.get("loss")) == 0.0
        zeroes = ev.get("zero_grad_set_to_none") is False
        all_zero = zeroes and len(norms) >= n and all(v is None or v == 0.0 for v in norms) and not loss_zero
        if len(none) >= n or all_zero:
            steps.append(step)
    if len(steps) < 2:  # one empty step is an accident of the loop's edge; every step is the pattern
        return []
    if sum(_backward_after_step(ev) for s, ev in run.step_events() if s in steps) * 2 > len(steps):
        return [_step_before_backward(run, steps)]
    message = (f"Every gradient was empty at optimizer.step() although backward() ran "
               f"({describe_steps(steps, run.last_step)}): zero_grad() is called between backward() and step().")
    # the zero_grad()'s own line, where the capture saw .grad set to None after the backward
    # (it pointed at optimizer.step(), the line after, QA 46a), else the step's
    src = cleared_at(run, steps) or next((str(ev["step_src"]) for _, ev in run.step_events() if ev.get("step_src")), None)
    return [make("P5", "error", message, FIX_MISPLACED, steps, rank=run.rank,
                 targets=[FindingTarget(step=steps[0], rank=run.rank)], src=src, view="gradients")]


FIX_STEP_FIRST = ("Call loss.backward() before optimizer.step(): optimizer.zero_grad(); loss = criterion(model(x), y); "
                  "loss.backward(); optimizer.step().")


def _backward_after_step(ev: dict[str, Any]) -> bool:
    """Whether every backward of the step went through the previous step's forward
    (``late_backward``) and none of its own forwards: ``optimizer.step(); loss.backward()``."""
    late = as_list(ev.get("late_backward"))
    return bool(late) and len(late) >= as_int(ev.get("micro_batches")) and not any(
        as_dict(f).get("backward") for f in as_list(ev.get("forwards")))


def _step_before_backward(run: Run, steps: list[int]) -> Finding:
    """optimizer.step() called before loss.backward(): the step found the gradients zero_grad()
    cleared, and the backward after it filled them for the next zero_grad() to clear -- read as
    a zero_grad() between backward() and step() at the correctly placed zero_grad (QA 48a)."""
    message = (f"optimizer.step() is called before loss.backward() ({describe_steps(steps, run.last_step)}): each "
               "backward() ran after the step of its batch, through that batch's forward, and the next zero_grad() "
               "cleared what it computed -- every optimizer.step() found no gradient, and the model never trains.")
    src = next((str(ev["step_src"]) for _, ev in run.step_events() if ev.get("step_src")), None)
    return make("P5", "error", message, FIX_STEP_FIRST, steps, rank=run.rank, src=src, view="gradients",
                targets=[FindingTarget(step=steps[0], rank=run.rank)], title="optimizer.step() before backward()")


def _inside(run: Run) -> list[Finding]:
    """zero_grad() inside the loop over micro-batches: of a step's backward passes, all run from
    the same line, only those after the last reset reached optimizer.step().  Passes run inside
    step() (an LBFGS closure), other optimizers' losses (a GAN's) and passes from different lines
    (an adversarial example's input-gradient pass, then the real one) are not that."""
    if run.session.get("per_sample_grads"):
        return []  # Opacus clears .grad between physical batches; its per-sample sums accumulate
    hits: list[tuple[int, int, int]] = []  # step, its passes, the passes step() used
    stepped = 0  # steps with a backward pass
    for step, ev in run.step_events():
        stepped += as_int(ev.get("micro_batches")) > 0
        events = [as_dict(e) for e in as_list(ev.get("events"))]
        if any(e.get("what") in ("closure", "other_step", "foreign_step", "autograd_grad", "grads_assigned")
               for e in events):
            continue  # (grads_assigned: the loop set .grad itself after its passes -- PCGrad's merged
            # gradient, built from each task's pass it saved before clearing: QA 46d)
        passes = as_int(ev.get("micro_batches")) - len(as_list(ev.get("backward_errors")))
        used = as_int(ev.get("accumulated"), passes)
        srcs = {str(x) for x in as_list(ev.get("backward_src"))}
        if (passes >= 2 and 1 <= used < passes and as_int(ev.get("zero_grad")) >= 2 and len(srcs) == 1
                and not run.cut_before_model(step, ev)):  # (no pass reached a parameter: .grad stayed None)
            hits.append((step, passes, used))
    if len(hits) < 2 and not (hits and hits[0][0] == run.last_step == 0):
        return []
    if len(hits) * 2 < stepped:
        # the loop's pattern is on every step; on a few, it is a step cut short -- a Ctrl-C
        # (a notebook's Stop) between backward() and step(), the next cell's zero_grad()
        return []
    steps = [h[0] for h in hits]
    step, passes, used = hits[0]
    ev = next(ev for s, ev in run.step_events() if s == step)
    src = str(as_list(ev.get("backward_src"))[0])
    # the zero_grad() itself where the capture saw it clear the gradients between two passes
    # (it pointed at the backward() line: the capture had no line for zero_grad)
    cleared = next((str(e["src"]) for e in notes(ev, "grads_cleared") if 0 < as_int(e.get("micro")) < passes
                    and e.get("src")), None)
    lost = passes - used
    message = (f"zero_grad() ran between the backward() calls of one optimizer step "
               f"({describe_steps(steps, run.last_step)}): of step {step}'s {passes} backward passes at {src}, "
               f"optimizer.step() used the last {used} only -- the gradients of the other {lost} were cleared. "
               "zero_grad() is inside the accumulation loop.")
    # a second backward from the same line after a reset could be a helper called twice on purpose:
    # an error where more than one pass per step was thrown away
    severity: Severity = "error" if all(p - u >= 2 for _, p, u in hits) else "warning"
    return [make("P5", severity, message, FIX_INSIDE, steps, rank=run.rank,
                 targets=[FindingTarget(step=step, rank=run.rank)], src=cleared or src, view="gradients",
                 data={"passes": [h[1] for h in hits], "used": [h[2] for h in hits]},
                 title="zero_grad() inside the accumulation loop")]


def _closure_summed(ev: dict[str, Any]) -> int:
    """How many backward passes of a closure optimizer.step() called several times (LBFGS) were
    summed into .grad in this step; 0 where none piled up (a zero_grad() inside the closure
    resets it between passes)."""
    passes = max((as_int(e.get("passes")) for e in notes(ev, "closure")), default=0)
    summed = as_int(ev.get("accumulated"))
    # a closure that resets the gradients itself (zero_grad() inside it: a reset seen
    # between its passes) sums only its own micro-batches (QA 37a: an error on a correct
    # LBFGS closure accumulating 4 micro-batches, "16 passes piled up")
    return summed if passes >= 2 and summed >= 2 and as_int(ev.get("zero_grad")) < 2 else 0


def _closure_piled(run: Run) -> list[Finding]:
    """zero_grad() outside the closure of an optimizer that calls it several times per step
    (LBFGS): the gradients of its passes add up, and each line search reads their sum.  (One
    pass inside step() -- Lightning's last micro-batch of an accumulation -- is no such loop.)"""
    hits: list[tuple[int, int, int]] = []  # step, closure passes, passes summed into .grad
    for step, ev in run.step_events():
        summed = _closure_summed(ev)
        if summed:
            hits.append((step, max(as_int(e.get("passes")) for e in notes(ev, "closure")), summed))
    if not hits:
        return []
    steps = [h[0] for h in hits]
    step, passes, summed = hits[0]
    ev = next(ev for s, ev in run.step_events() if s == step)
    src = next((str(b) for b in as_list(ev.get("backward_src")) if b), None)
    message = (f"optimizer.step(closure) ran {passes} backward passes in its closure and their gradients piled up "
               f"({describe_steps(steps, run.last_step)}): step {step} summed {summed} backward passes into .grad, "
               "so each evaluation after the first read the sum of all before it -- zero_grad() is outside the closure.")
    return [make("P5", "error", message, FIX_CLOSURE, steps, rank=run.rank,
                 targets=[FindingTarget(step=step, rank=run.rank)], src=src, view="gradients",
                 data={"passes": [h[1] for h in hits], "accumulated": [h[2] for h in hits]},
                 title="zero_grad() outside the closure")]


def _crossed(run: Run) -> list[Finding]:
    """Another optimizer stepped between backward passes that all went into the watched
    parameters' .grad: the passes before it were that optimizer's loss's, and this step used
    them too (a GAN whose discriminator loss reads the generator's output undetached)."""
    hits: list[tuple[int, str, str, str]] = []  # step, the other optimizer, its loss's backward line, ours
    for step, ev in run.step_events():
        passes, acc = as_int(ev.get("micro_batches")), as_int(ev.get("accumulated"))
        srcs = [str(x) for x in as_list(ev.get("backward_src"))]
        for e in map(as_dict, as_list(ev.get("events"))):
            m = as_int(e.get("micro"))
            if e.get("what") == "other_step" and acc >= 2 and passes - acc < m < passes:
                hits.append((step, str(e.get("optimizer", "another optimizer")),
                             srcs[m - 1] if m - 1 < len(srcs) else "", srcs[-1] if srcs else ""))
                break
    if not hits:
        return []
    steps = [h[0] for h in hits]
    step, other, theirs, ours = hits[0]
    at = f" at {theirs}" if theirs else ""
    ev = next(ev for s, ev in run.step_events() if s == step)
    got = [i for i, v in enumerate(as_list(as_dict(ev.get("grads")).get("norm"))) if v is not None]
    names = [run.param_name(i) for i in got]
    message = (f"The watched optimizer's step() used gradients from a backward{at}, made before an optimizer of "
               f"other parameters ({other}) stepped ({describe_steps(steps, run.last_step)}): that backward was "
               "the other optimizer's loss's, yet it also went into these parameters' .grad, and zero_grad() did "
               f"not clear it before their own backward{f' at {ours}' if ours else ''}.")
    targets = [FindingTarget(step=step, rank=run.rank, param=run.param_name(i), module=run.param_module(i)) for i in got]
    return [make("P5", "error", message, FIX_CROSSED, steps, rank=run.rank,
                 targets=targets or [FindingTarget(step=step, rank=run.rank)], params=names,
                 modules=sorted({run.param_module(i) for i in got}), src=theirs or None, view="gradients",
                 title="Gradients of another optimizer's loss")]


def _untrainable(run: Run) -> list[Finding]:
    """A watched model none of whose parameters requires grad, while an optimizer steps on 2+
    steps and no backward reaches the model: the wrong model watched (QA 47c: "no problems
    found").  Its weights moving by hand (``frozen_moved``) make it a copy that follows the
    trained model -- an EMA teacher watched in place of the student: an error; still, a frozen
    feature extractor beside the trained head: the warning of a linear probe."""
    if trainable(run) or not run.params:
        return []
    steps = [step for step, ev in run.step_events() if ev.get("step_src") and not as_int(ev.get("micro_batches"))]
    if len(steps) < 2:
        return []
    events = dict(run.step_events())
    moved = sorted(moved_params(run) or ())
    opt = str(run.session.get("optimizer") or "The watched optimizer")
    model = str(run.session.get("model") or "the model")
    when = describe_steps(steps, run.last_step)
    src = next((str(events[step]["step_src"]) for step in steps), None)
    if moved:
        message = (f"{opt} steps none of {model}'s parameters, none of which requires grad, and no backward reaches "
                   f"{model} ({when}); yet its weights change from step to step ({', '.join(run.param_name(i) for i in moved[:3])}"
                   f"{' ...' if len(moved) > 3 else ''} moved by step 10): the watched model is a copy that follows the "
                   "trained one by hand -- an EMA teacher, a target network -- not the model the optimizer trains, so "
                   "torchscope records nothing of the training.")
        return _wrong_model(run, steps, src, message, features=False)
    message = (f"{opt} steps none of {model}'s parameters, none of which requires grad, and no backward reaches "
               f"{model} ({when}): the watched model is a frozen feature extractor for parameters outside it (a linear "
               "probe, a head trained on its features, a distillation teacher), so torchscope records nothing of what "
               "trains.")
    return _wrong_model(run, steps, src, message, features=True)


def check(run: Run, settings: Settings) -> list[Finding]:
    missing = _missing(run)
    # no zero_grad() at all piles a closure's passes up too: said once, by _missing (its fix
    # then says "inside the closure")
    return (_foreign(run) + _untrainable(run) + missing + _unheld(run) + _outside(run) + _misplaced(run) + _inside(run)
            + ([] if missing else _closure_piled(run)) + _crossed(run))
