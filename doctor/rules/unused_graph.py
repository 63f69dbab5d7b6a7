"""P6: a forward built an autograd graph (and held its saved tensors) that no backward consumed."""

from __future__ import annotations

import math
from typing import Any

from torchscope.schema import Finding, FindingTarget

from ..finding import Severity, describe_steps, fmt_bytes, make
from ..run import Run, as_dict, as_float, as_int, as_list, leaf_loss
from ..settings import Settings
from .dry_run import lazy_dry_run
from .loss_cut import no_grad_fn_forwards
from .paths import cut_steps

FIX = ("Wrap evaluation/inference in `with torch.no_grad():` (or torch.inference_mode()) and call model.eval(); "
       "then no graph is built and no activations are kept.")
FIX_TRAINING = ("Run that forward under `with torch.no_grad():` -- no graph is built and no activations are kept. "
                "Leave the module in train mode if it should act as in training (BatchNorm, dropout): no_grad "
                "changes autograd only. If it is an evaluation, call model.eval() as well.")


def _late(run: Run) -> set[tuple[int, int]]:
    """(step, micro) of the forwards whose graph a backward of the next step used (a GAN's
    generator output, made before the critic's step ended the step): used, not unused."""
    # (the run's last step: told by the end event, QA 48b -- "Batches skipped before backward")
    return {(as_int(p[0]), as_int(p[1])) for ev in (*(ev for _, ev in run.step_events()), run.end)
            for p in as_list(ev.get("late_backward")) if isinstance(p, list) and len(p) == 2}


def _trained_srcs(run: Run, late: set[tuple[int, int]]) -> set[Any]:
    """The call sites whose forwards training used: a training-mode forward from one of them
    that no backward used is a batch the loop skipped (a non-finite loss, a caught error)."""
    return {f.get("src") for step, ev in run.step_events() for f in map(as_dict, as_list(ev.get("forwards")))
            if (f.get("backward") is True or (step, as_int(f.get("micro"))) in late) and f.get("src")}


def train_mode_evaluations(run: Run) -> dict[str, list[int]]:
    """Call site -> steps (each told with the step it ran after) of training-mode forwards that
    look like an evaluation left in train mode without no_grad: a graph built and no backward
    used it, from a call site of their own that ran on at most half of the run's steps (every
    N steps, or once at the end) -- not a GAN's generator pass or a target computed every step."""
    late = _late(run)
    trained = _trained_srcs(run, late)
    dry = lazy_dry_run(run)  # a lazy model's dry run: a call site of its own, once, and no evaluation
    at: dict[str, list[int]] = {}
    for step, ev in run.forward_events():
        forwards = [as_dict(f) for f in as_list(ev.get("forwards"))]
        for f in forwards:
            src = f.get("src")
            if (f is not dry and f.get("training") is not False and f.get("built_graph") is True and f.get("backward") is False
                    and (step, as_int(f.get("micro"))) not in late and isinstance(src, str) and src and src not in trained):
                at.setdefault(src, []).append(run.step_of_forward(step, forwards, f))
    n = run.training_steps
    return {src: steps for src, steps in at.items() if n >= 4 and 2 * len(set(steps)) <= n}


def check(run: Run, settings: Settings) -> list[Finding]:
    steps: list[int] = []
    count = 0
    held = 0
    srcs: list[str] = []
    in_eval = False
    late = _late(run)
    trained = _trained_srcs(run, late)
    evaluations = train_mode_evaluations(run)
    as_evaluation = False  # some unused training-mode forwards look like evaluations
    skipped: list[int] = []  # the steps of the skipped batches
    checked: list[float] = []  # and their losses, where the loop checked them
    broken = cut_steps(run)
    # the dry run that made a lazy model's parameters: its graph (one built without no_grad,
    # as PyTorch's docs do) is thrown away on purpose, before training starts
    dry = lazy_dry_run(run)
    for step, ev in run.forward_events():
        forwards = [as_dict(f) for f in as_list(ev.get("forwards"))]
        cut = set(no_grad_fn_forwards(ev))  # the loss was cut from its graph: the backward failed (P1/P9)
        # the training forward's graph was cut off from the loss (P1; P9 for an integer cast
        # between it and the loss, a weight penalty still giving the loss a graph): no evaluation
        # ... or its backward raised (P8/P10: a REINFORCE loop's second backward through its kept
        # log-probabilities -- its forwards are that backward's, no batches skipped; QA 44b)
        if leaf_loss(ev) or step in broken or as_list(ev.get("backward_errors")):
            cut |= {i for i, f in enumerate(forwards) if f.get("training") is not False}
        unused = [f for i, f in enumerate(forwards) if f.get("built_graph") is True and f.get("backward") is False
                  and (step, as_int(f.get("micro"))) not in late and i not in cut and f is not dry]
        skips = [f for f in unused if f.get("training") is not False and f.get("src") in trained]
        skipped += [step] * len(skips)
        checked += [v for f in skips if (v := as_float(f.get("loss"))) is not None]
        unused = [f for f in unused if f not in skips]
        n = len(unused) if forwards else as_int(ev.get("no_backward_forwards"))
        if n <= 0:
            continue
        for f in unused or [{}] * n:  # an evaluation is told with the step it ran after
            told_after = f.get("training") is False or f.get("src") in evaluations
            steps.append(run.step_of_forward(step, forwards, f) if told_after else step)
        count += n
        # one forward's: evaluations one after another free each graph with the output the next
        # one replaces, so their sum is more than was ever held at once
        held = max(held, *(as_int(f.get("saved_bytes")) for f in unused), 0)
        srcs += [str(f["src"]) for f in unused if f.get("src")]
        in_eval = in_eval or any(f.get("training") is False for f in unused)
        as_evaluation = as_evaluation or any(f.get("src") in evaluations for f in unused)
    if not steps:
        return _skipped(run, skipped, checked)
    steps = sorted(set(steps))
    passes = "forward pass" if count == 1 else "forward passes"
    what = f"{passes} in eval mode (an evaluation)" if in_eval else passes
    each = "" if count == 1 else " each"
    held_txt = f", holding up to {fmt_bytes(held)} of saved activations{each}" if held else ""
    severity: Severity = "warning"
    fix, title = FIX, None
    if count == 1 and not in_eval:
        # once, in training mode: as likely a batch the loop skipped before backward (a
        # non-finite loss) as a forward for metrics -- said, not warned about
        severity, title = "info", "Graph built but never used"
        message = (f"1 forward pass built an autograd graph that no backward() used "
                   f"({describe_steps(steps, run.last_step)}){held_txt}. A batch skipped before backward (a "
                   "non-finite loss) does this and is harmless; an evaluation or a forward for metrics wants "
                   "torch.no_grad().")
    elif not in_eval and as_evaluation:
        # in training mode, from a call site of its own that runs every N steps: an evaluation
        # left in train mode (P11 tells the mode)
        message = (f"{count} {passes} in training mode from a call site of their own built an autograd graph that "
                   f"no backward() used ({describe_steps(steps, run.last_step)}){held_txt}: evaluations without "
                   "torch.no_grad() (and without model.eval()).")
    elif not in_eval:
        # in training mode, from a call site of its own: an output used only without its
        # gradient -- a GAN's fake batch for the critic's step (``G(z).detach()``), a target or
        # teacher network, metrics.  Wasted work, freed with the output: said, not warned about,
        # and no model.eval(), which would change how a training generator's BatchNorm acts
        severity, fix, title = "info", FIX_TRAINING, "Graph built but never used"
        message = (f"{count} forward passes in training mode built an autograd graph that no backward() used "
                   f"({describe_steps(steps, run.last_step)}){held_txt}: their outputs were used without "
                   "gradients (detached, or for metrics); torch.no_grad() around them saves building it.")
    else:
        message = (f"{count} {what} built an autograd graph that no backward() used "
                   f"({describe_steps(steps, run.last_step)}){held_txt}: torch.no_grad() is missing.")
    return [make("P6", severity, message, fix, steps, rank=run.rank,
                 targets=[FindingTarget(step=steps[0], rank=run.rank, module="")], modules=[""],
                 src=srcs[0] if srcs else None, view="memory", title=title,
                 data={"forwards": count, "saved_bytes": held, "src": sorted(set(srcs))})]


def _skipped(run: Run, steps: list[int], losses: list[float]) -> list[Finding]:
    """Training forwards from the loop's own call site that no backward used, and nothing else:
    batches skipped before backward.  Harmless (the graph is freed with the loss); said once,
    with the losses the loop checked before skipping them (``losses``), where recorded."""
    if not steps:
        return []
    skipped = len(steps)
    bad = sum(1 for v in losses if not math.isfinite(v))
    if losses:
        why = (f"{bad} of them with a NaN/Inf loss (P4)" if bad else
               f"their losses, as the loop checked them, were finite ({', '.join(f'{v:.4g}' for v in losses[:4])})")
        said = f"The graph is freed with the loss; {why}."
    else:  # a loop that did not check its loss with isfinite/isnan/isinf (a caught error)
        said = "The graph is freed with the loss; what a skipped batch's loss was is not recorded."
    n = sum(1 for _ in run.step_events())
    if not losses and n >= 4 and 4 * len(set(steps)) > n:
        # on many steps, unchecked: as likely an output a backward used only detached -- a
        # backbone frozen by ``.detach()`` for a warm-up, a teacher trained every few steps
        # (QA 44e: "skipped" read as a fault) -- whose backward the capture does not see
        return [make("P6", "info", (
            f"{skipped} training forward passes from the loop's own call site built an autograd graph that no "
            f"backward() used ({describe_steps(sorted(set(steps)), run.last_step)}): batches skipped before "
            "backward (unlabeled ones, a guard), or outputs used only without their gradient (detached: a backbone "
            "frozen by `.detach()`, a teacher network trained every few steps). The graph is freed with the output."),
            FIX_UNUSED, steps, rank=run.rank, view="memory", data={"forwards": skipped},
            title="Graph built but never used")]
    message = (f"{skipped} training forward pass{'' if skipped == 1 else 'es'} from the loop's own call site "
               f"built an autograd graph that no backward() used ({describe_steps(sorted(set(steps)), run.last_step)}): "
               "batches the loop skipped before backward (a guard such as `if not torch.isfinite(loss): "
               f"continue`, a caught error, a notebook cell stopped or failed mid-step). {said}")
    return [make("P6", "info", message, FIX_SKIPPED, steps, rank=run.rank, view="memory", data={"forwards": skipped},
                 title="Batches skipped before backward")]


FIX_SKIPPED = ("Nothing to change for the graph. Find out why those batches were skipped: print the loss and the "
               "batch at those steps; a loss that is NaN or Inf comes from log/div of zero or overflow (use "
               "BCEWithLogitsLoss / log_softmax rather than log(sigmoid(x)) / log(softmax(x)), add an eps, clamp) "
               "or from bad input data (P4).")
FIX_UNUSED = ("Where the output is used only without its gradient on those steps, run that forward under "
              "`torch.no_grad()` there (`with torch.set_grad_enabled(train_backbone):`): no graph is built. "
              "Batches skipped on purpose need no change.")
