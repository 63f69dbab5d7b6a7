"""P11: a module in the wrong mode: training with eval() (or parts left in eval), evaluating with train().

Batch-norm modules kept in eval while the rest trains, from the first step on every step, are
fine-tuning's frozen statistics (norm_eval): an info, not a warning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchscope.schema import Finding, FindingTarget

from ..finding import describe_steps, make
from ..run import Run, as_dict, as_int, as_list, grad_off, moved_params, notes, trainable
from ..settings import Settings
from .dry_run import lazy_dry_run
from .loss_cut import no_grad_fn_forwards
from .unused_graph import train_mode_evaluations

# Only these behave differently in train and eval mode; elsewhere the mode changes nothing.
_MODE_SENSITIVE = ("Dropout", "BatchNorm", "InstanceNorm", "SyncBatchNorm", "AlphaDropout", "LazyBatchNorm")

FIX_TRAIN = ("Call model.train() at the start of every training epoch/step (after each evaluation) -- with its "
             "parentheses: `model.train` alone does nothing. Batch-norm "
             "statistics frozen on purpose (fine-tuning with small batches) are fine: put only the batch-norm "
             "modules in eval() right after model.train() on every step (norm_eval), or freeze their affine "
             "parameters too (requires_grad_(False)), and this is no warning.")
FIX_EVAL = "Call model.eval() before evaluating (and model.train() afterwards), inside torch.no_grad()."
FIX_NORM_EVAL = ("Nothing to fix if intended (fine-tuning with small batches, where batch statistics are noisy). "
                 "If not, stop putting these modules in eval() after model.train().")

# Normalisation modules with running statistics: in eval mode they normalise with running_mean/running_var.
_RUNNING_STATS = ("BatchNorm", "SyncBatchNorm", "LazyBatchNorm", "InstanceNorm", "LazyInstanceNorm")


# Recurrent layers and attention drop out by an argument of their own: sensitive where the
# capture says that dropout acts (``mode_inert: False``, said since the forty-second session; an
# older file does not say, and they are left out as before)
_OWN_DROPOUT = frozenset({"RNN", "LSTM", "GRU", "MultiheadAttention"})


def _sensitive_modules(run: Run) -> list[str]:
    """The modules whose train/eval mode changes what they compute: dropout and batch-norm types,
    less those the capture found inert (``mode_inert``: a dropout with p=0), and RNNs and
    attention whose own dropout acts."""
    return [str(m.get("path")) for m in map(as_dict, as_list(run.session.get("modules")))
            if (str(m.get("type", "")).startswith(_MODE_SENSITIVE) and m.get("mode_inert") is not True)
            or (m.get("type") in _OWN_DROPOUT and m.get("mode_inert") is False)]


def _sensitive(run: Run, modules: list[str]) -> list[str]:
    known = {str(as_dict(m).get("path")) for m in as_list(run.session.get("modules"))}
    sensitive = set(_sensitive_modules(run))
    return [m for m in modules if m not in known or m in sensitive]


def _has_sensitive(run: Run) -> bool:
    return not as_list(run.session.get("modules")) or bool(_sensitive_modules(run))


def _enclosing(owned: dict[str, list[int]], path: str) -> list[int]:
    """The parameters of the module holding ``path``, one without parameters of its own (a
    Dropout): all frozen, it is part of a frozen feature network put in eval on purpose (an
    LPIPS-style perceptual loss's, QA 45a); the root's, for a child of the root."""
    if not path:
        return []
    parent = path.rsplit(".", 1)[0] if "." in path else ""
    return [i for m, idx in owned.items() if parent == "" or m == parent or m.startswith(parent + ".") for i in idx]


def _frozen(ev: dict[str, Any], own: list[int]) -> bool:
    """Whether a module with the parameters ``own`` trains none of them at this step (frozen:
    no gradient, and not a trainable parameter whose gradient is missing).  A frozen module put
    in eval() while the rest trains is fine-tuning's deliberate freeze, not a forgotten mode."""
    grads = as_dict(ev.get("grads"))
    norms, missing = as_list(grads.get("norm")), {as_int(i, -1) for i in as_list(grads.get("none"))}
    return bool(own) and all(i < len(norms) and norms[i] is None and i not in missing for i in own)


FIX_TARGET = ("Nothing to fix for a consistency target or a teacher meant to act as in training. If that forward "
              "should compute what a later forward of the same batch computes (features cached, GradCache's first "
              "pass), run it in eval mode or replay the random state, so its dropout masks are the same.")


def _target_sites(run: Run) -> set[Any]:
    """Call sites of forwards without autograd in train mode that run on more than half of the
    training steps (of at least four): part of each step, not an evaluation -- a consistency
    target (UDA, the Pi-model, VAT's clean prediction), a mean teacher's -- kept in train mode on
    purpose (its dropout and batch-norm noise are the method; QA 45a: "Evaluating with ... in
    train mode").  An evaluation runs every N steps or at the end."""
    steps: dict[Any, set[int]] = {}
    n = run.training_steps
    for step, ev in run.step_events():
        for f in map(as_dict, as_list(ev.get("forwards"))):
            if _without_autograd(f) and f.get("training") is not False:
                steps.setdefault(f.get("src"), set()).add(step)
    return {src for src, at in steps.items() if src and n >= 4 and 2 * len(at) > n}


def _without_autograd(f: dict[str, Any]) -> bool:
    """Whether the forward ran without autograd: under no_grad or inference_mode, but not inside
    a reentrant ``torch.utils.checkpoint`` a backward went through (whose no_grad forward the
    backward runs again with autograd: training, not an evaluation; one under an outer no_grad,
    never reached, is an evaluation)."""
    return grad_off(f) and not (f.get("checkpoint") is True and f.get("backward") is True)


def _trains(f: dict[str, Any]) -> bool:
    """Whether a backward that trains ran through the forward's graph: not only a
    ``torch.autograd.grad`` of the input (an adversarial attack run in eval mode, QA 45a)."""
    return f.get("backward") is True and f.get("input_grad") is not True


def _cleared_before_step(ev: dict[str, Any], f: dict[str, Any]) -> bool:
    """Whether the gradients of the forward's backward were reset before the step's
    ``optimizer.step()``: its pass is one of those before the last reset (``micro_batches`` less
    ``accumulated``) -- a Grad-CAM saliency pass in eval mode mid-training, then
    ``model.zero_grad()`` (QA 48a: "Training while the model is in eval mode")."""
    kept = ev.get("accumulated")
    if not isinstance(kept, int):
        return False
    return as_int(f.get("micro"), -1) < as_int(ev.get("micro_batches")) - kept


def _eval_all_along(run: Run, before: int) -> set[str]:
    """The modules in eval mode in every trained forward, in training mode, of the steps before
    ``before`` (none when there is no such forward)."""
    common: set[str] | None = None
    for step, ev in run.step_events():
        if step >= before:
            break
        for f in (as_dict(x) for x in as_list(ev.get("forwards"))):
            if _trains(f) and f.get("training") is True:
                mods = {str(m) for m in as_list(f.get("eval_modules"))}
                common = mods if common is None else common & mods
    return common or set()


def _named(run: Run, mods: list[str]) -> str:
    """'1' (BatchNorm2d), 'head.drop' (Dropout) and 3 more: a Sequential's bare index says
    nothing without its type (QA 37a)."""
    def one(m: str) -> str:
        kind = run.module_type(m)
        return f"{m!r} ({kind})" if kind else repr(m)
    return ", ".join(one(m) for m in mods[:4]) + (f" and {len(mods) - 4} more" if len(mods) > 4 else "")


def _effects(run: Run, mods: list[str]) -> str:
    """What eval mode changes in ``mods``: dropout off, batch-norm statistics frozen (both for
    the whole model or modules of unknown type)."""
    types = [run.module_type(m) for m in mods]
    known = "" not in mods and all(types)
    dropout = not known or any("Dropout" in t or t in _OWN_DROPOUT for t in types)
    norm = not known or any("Norm" in t for t in types)
    parts = (["dropout is off"] if dropout else []) + (["batch-norm statistics are frozen"] if norm else [])
    return " and ".join(parts) or "dropout is off and batch-norm statistics are frozen"


def _trained_steps(run: Run) -> list[int]:
    """Steps with a forward in train mode that a backward ran through."""
    return [step for step, ev in run.step_events()
            if any(_trains(as_dict(f)) and as_dict(f).get("training") is not False
                   for f in as_list(ev.get("forwards")))]


def _norm_eval(run: Run, settings: Settings, train_in_eval: dict[str, list[int]]) -> bool:
    """Whether the modules in eval mode while training are deliberately frozen batch-norm
    statistics: the root trains, only normalisation modules with running statistics are in eval,
    over at least ``min_steps`` steps (a shorter run cannot tell), either on every training step
    from the first -- set by the loop, not left over from an evaluation: fine-tuning's
    ``model.train(); model.apply(freeze_bn)``, mmdetection's ``norm_eval=True`` -- or from some
    step to the end inside quantization-aware training's fused conv-bn modules
    (``torch.ao.nn.intrinsic.qat.freeze_bn_stats`` late in training, as its tutorial does)."""
    if not train_in_eval or "" in train_in_eval:
        return False
    if not all(run.module_type(m).startswith(_RUNNING_STATS) for m in train_in_eval):
        return False
    trained = _trained_steps(run)
    for module, steps in train_in_eval.items():
        frozen = sorted(set(steps))
        if len(frozen) < settings.min_steps:
            return False
        if frozen != trained and not (_in_fused_qat(run, module) and frozen == trained[len(trained) - len(frozen):]):
            return False
    return True


def _in_fused_qat(run: Run, module: str) -> bool:
    """Whether ``module`` is the batch norm of a QAT conv-bn module (``ConvBn2d``, ``ConvBnReLU2d``...)."""
    parent, _, name = module.rpartition(".")
    return name == "bn" and run.module_type(parent).startswith("ConvBn")


def _norm_eval_finding(run: Run, train_in_eval: dict[str, list[int]], owned: dict[str, list[int]]) -> Finding:
    mods = sorted(train_in_eval)
    steps = sorted({s for v in train_in_eval.values() for s in v})
    affine = "while their weight and bias train" if any(owned.get(m) for m in mods) else "while the model trains"
    message = (f"Batch-norm statistics frozen (norm_eval): {_named(run, mods)} in eval mode on every training step "
               f"({describe_steps(steps, run.last_step)}) {affine}, normalising with running_mean/running_var "
               "instead of each batch's statistics: deliberate in fine-tuning with small batches, and late in "
               "quantization-aware training (freeze_bn_stats).")
    finding = make("P11", "info", message, FIX_NORM_EVAL, steps, rank=run.rank,
                   targets=[FindingTarget(step=steps[0], rank=run.rank, module=m) for m in mods],
                   modules=mods, data={"mode": "eval", "steps_by_module": train_in_eval})
    finding["title"] = "Batch-norm statistics frozen (norm_eval)"
    return finding


FIX_DROPOUT = ("Pass the module's mode: F.dropout(x, p, training=self.training) -- or use an nn.Dropout module, "
               "which follows model.train() and model.eval(). (Monte Carlo dropout on purpose: pass training=True "
               "explicitly, and this is no finding.)")


def _functional_dropout(run: Run) -> list[Finding]:
    """``F.dropout(x, p)`` called in a forward with ``training`` at its default (True) while the
    model evaluates (``eval_dropout`` notes: the capture's probe of each call site's first
    eval-mode forward)."""
    lines: dict[str, tuple[list[int], str, str]] = {}
    for step, ev in run.step_events():
        forwards = [as_dict(f) for f in as_list(ev.get("forwards"))]
        for e in notes(ev, "eval_dropout"):
            i = as_int(e.get("forward"), -1)
            at = run.step_of_forward(step, forwards, forwards[i]) if 0 <= i < len(forwards) else step
            steps, _, _ = lines.setdefault(str(e.get("src") or ""), ([], str(e.get("module") or ""), str(e.get("fn") or "dropout")))
            steps.append(at)
    findings: list[Finding] = []
    for src, (steps, module, fn) in lines.items():
        where = f"{module!r}" if module else "the model's forward"
        message = (f"F.{fn}() in {where}{f' ({src})' if src else ''} runs with training=True, its default, while the "
                   f"model is in eval mode (its first evaluation: {describe_steps(steps, run.last_step)}): model.eval() does not reach a "
                   "dropout function, so evaluation and inference still drop activations at random -- noisy, and "
                   "worse than the trained model.")
        findings.append(make("P11", "warning", message, FIX_DROPOUT, steps, rank=run.rank, src=src or None,
                             targets=[FindingTarget(step=steps[0], rank=run.rank, module=module)],
                             modules=[module], data={"mode": "eval", "function": fn},
                             title="Dropout function left on in eval mode"))
    return findings


FIX_FROZEN_NORM = ("If the frozen layers are meant to compute what they were trained to, put their batch-norm "
                   "modules in eval() after every model.train() (for m in backbone.modules(): if isinstance(m, "
                   "nn.modules.batchnorm._BatchNorm): m.eval()); if adapting their statistics to the new data is "
                   "intended, nothing to fix.")


_DROPOUTS = ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout")
FIX_FIXED_DROPOUT = ("For a teacher, keep it in eval mode: model.train() puts every submodule back in train mode, so "
                     "call teacher.eval() after each model.train(), or override train() in the model that holds it "
                     "(def train(self, mode=True): super().train(mode); self.teacher.eval(); return self). For a "
                     "frozen backbone whose dropout is meant to regularise the fine-tuning, nothing to fix.")


def _train_mode_throughout(run: Run, modules: set[str],
                           keep: Callable[[dict[str, Any], str], bool] | None = None) -> tuple[list[int], set[str]]:
    """The training steps, and those of ``modules`` in train mode on every one of them (in no
    training forward's ``eval_modules``, the model not in eval); ``keep`` (a step's event, a
    module) drops more on each step."""
    steps: list[int] = []
    active = set(modules)
    for step, ev in run.step_events():
        trained = [f for f in map(as_dict, as_list(ev.get("forwards"))) if _trains(f)]
        if not trained or not active:
            continue
        steps.append(step)
        for f in trained:
            active -= set(map(str, as_list(f.get("eval_modules")))) if f.get("training") is not False else active
        if keep is not None:
            active = {m for m in active if keep(ev, m)}
    return steps, active


def _fixed_frozen(run: Run) -> set[int] | None:
    """The parameters that require no grad, kept their values from step 0 to steps 10 and 20
    (the capture's ``frozen_moved``: a fixed network's, not a momentum copy's) and got no
    gradient on any step (not unfrozen later; QA 47d); None when the run never said (shorter
    than 11 steps, or a file before the forty-seventh session)."""
    moved = moved_params(run)
    if moved is None:
        return None
    graded = {i for _, ev in run.step_events() for i, n in enumerate(as_list(as_dict(ev.get("grads")).get("norm")))
              if n is not None}
    return {i for i, p in enumerate(run.params) if p.get("requires_grad") is False and i not in moved and i not in graded}


def _fixed_owner(run: Run, path: str, fixed: set[int]) -> str:
    """The network a dropout at ``path`` belongs to when it is a frozen, fixed one of the model's
    own: a direct submodule of the model whose parameters are all frozen and fixed, and at least
    half as large as what trains (a teacher, a backbone) -- not a frozen embedding table inside
    a fine-tuned encoder, whose dropout regularises the layers after it ("" for none)."""
    owner = path.split(".", 1)[0]
    if owner == path:
        return ""
    own = [i for i in range(len(run.params)) if run.param_module(i).startswith(owner + ".") or run.param_module(i) == owner]
    trained = sum(as_int(p.get("numel")) for p in run.params if p.get("requires_grad", True))
    if not own or not all(i in fixed for i in own) or 2 * sum(as_int(run.params[i].get("numel")) for i in own) < trained:
        return ""
    return owner


def _frozen_dropout(run: Run, settings: Settings, fixed: set[int] | None) -> list[Finding]:
    """Dropout modules in train mode on every training step inside a network whose parameters
    are frozen and did not change: a distillation teacher that ``model.train()`` put back in
    train mode (QA 47b: only the batch-norm info, "nothing to fix there"), whose soft targets are
    then noisy.  An info: a frozen backbone (or embedding table) under fine-tuning is the same to
    the capture, and its dropout regularises what follows (QA 47d: a warning there read as a
    false alarm).  A momentum copy's changing weights (a mean teacher) are not fixed, and not
    told."""
    if not fixed:
        return []
    modules = list(map(as_dict, as_list(run.session.get("modules"))))
    drops = {str(m.get("path")): owner for m in modules
             if str(m.get("type", "")) in _DROPOUTS and m.get("mode_inert") is not True
             and (owner := _fixed_owner(run, str(m.get("path")), fixed))}
    norms = [str(m.get("path")) for m in modules if str(m.get("type", "")).startswith(_RUNNING_STATS)
             and any(str(m.get("path")).startswith(o + ".") for o in set(drops.values()))]
    steps, active = _train_mode_throughout(run, set(drops) | set(norms))
    mods = sorted(active & set(drops), key=list(drops).index)
    if not mods or len(steps) < settings.min_steps:
        return []
    owners = sorted({drops[m] for m in mods})
    nets = ", ".join(f"{o!r}" for o in owners)
    moving = [m for m in norms if m in active and any(m.startswith(o + ".") for o in owners)]
    message = (f"{_named(run, mods)} {'runs' if len(mods) == 1 else 'run'} in train mode on every training step "
               f"({describe_steps(steps, run.last_step)}) inside {nets}, whose parameters are frozen and did not change "
               "through step 20 -- a fixed network: a distillation teacher, a pretrained backbone. Dropout drops its "
               f"activations at random, so what {nets} computes is noisy on every step"
               + (f", and {_named(run, moving)} normalise{'s' if len(moving) == 1 else ''} with each batch's "
                  "statistics, moving running_mean and running_var" if moving else "")
               + ": a distillation teacher's soft targets should not be; a frozen backbone's noise under fine-tuning "
               "regularises the layers after it, and can be meant.")
    return [make("P11", "info", message, FIX_FIXED_DROPOUT, steps, rank=run.rank,
                 targets=[FindingTarget(step=steps[0], rank=run.rank, module=m) for m in mods[:20]], modules=mods,
                 title="Dropout on in a frozen network", data={"mode": "train", "networks": owners})]


def _frozen_norms_updating(run: Run, settings: Settings, owned: dict[str, list[int]],
                           fixed: set[int] | None = None, noisy: list[Finding] | None = None) -> list[Finding]:
    """Batch-norm modules whose affine parameters train on no step while they run in train mode
    on every training step (of at least ``min_steps``): the rest of the model trains, and their
    running statistics keep moving with its batches -- a backbone frozen with
    requires_grad_(False) whose features still change, and which evaluates with the fine-tuning
    batches' statistics (QA 37a: no finding).  An info: torchvision's feature-extraction tutorial
    does this, and adapting the statistics can be meant."""
    norms = [str(m.get("path")) for m in map(as_dict, as_list(run.session.get("modules")))
             if str(m.get("type", "")).startswith(_RUNNING_STATS) and m.get("mode_inert") is not True
             and owned.get(str(m.get("path")))]
    steps, updating = _train_mode_throughout(run, set(norms), lambda ev, m: _frozen(ev, owned[m]))
    # (the batch-norm of a network already told for its dropout is said there)
    told = [str(o) for f in noisy or [] for o in as_list(as_dict(f.get("data")).get("networks"))]
    mods = sorted((m for m in updating if not any(m.startswith(o + ".") for o in told)), key=norms.index)
    if not mods or len(steps) < settings.min_steps:
        return []
    one = len(mods) == 1
    kept = fixed is not None and all(i in fixed for m in mods for i in owned[m])
    message = (f"{_named(run, mods)} {'trains' if one else 'train'} none of {'its' if one else 'their'} parameters "
               f"(requires_grad_(False)) but {'runs' if one else 'run'} in train mode on every training "
               f"step ({describe_steps(steps, run.last_step)}): running_mean and running_var keep moving with each "
               "batch, so the frozen layers' outputs still change, and evaluation normalises with the statistics of "
               "the fine-tuning batches." + (
                   " Their weights never change: a fixed network (a pretrained backbone, a distillation teacher), "
                   "not a momentum copy." if kept else
                   " (A momentum copy of the trained layers -- MoCo's key encoder, BYOL's target network, a mean "
                   "teacher -- is meant to: nothing to fix there.)"))
    return [make("P11", "info", message, FIX_FROZEN_NORM, steps, rank=run.rank,
                 targets=[FindingTarget(step=steps[0], rank=run.rank, module=m) for m in mods[:20]], modules=mods,
                 title="Batch-norm statistics updating in frozen layers", data={"mode": "train"})]


def check(run: Run, settings: Settings) -> list[Finding]:
    found = _functional_dropout(run)
    if not _has_sensitive(run):
        return found  # no dropout/batch-norm module: train and eval compute the same thing
    train_in_eval: dict[str, list[int]] = {}  # module ("" = whole model) -> steps
    owned: dict[str, list[int]] = {}  # module -> indices of its own parameters
    for i in range(len(run.params)):
        owned.setdefault(run.param_module(i), []).append(i)
    eval_in_train: dict[str, list[int]] = {}
    srcs: list[str] = []
    # evaluations left in train mode without no_grad (P6 tells the graph): every module whose
    # mode matters, less those the forward found in eval
    evaluations = train_mode_evaluations(run)
    sensitive = _sensitive_modules(run)
    # the dry run that made a lazy model's parameters (PyTorch's way to build one): its output
    # is thrown away, so its train mode evaluated nothing
    dry = lazy_dry_run(run)
    targets = _target_sites(run)
    target_in_train: dict[str, list[int]] = {}  # those of a call site run every step: a target's
    target_srcs: list[str] = []
    for step, ev in run.forward_events():
        forwards = [as_dict(f) for f in as_list(ev.get("forwards"))]
        if not forwards and ev.get("training") is False and as_int(ev.get("micro_batches")) > 0:
            train_in_eval.setdefault("", []).append(step)
        # the training forward run under no_grad by mistake (its loss had no grad_fn: P1), no evaluation
        cut = set(no_grad_fn_forwards(ev))
        for i, f in enumerate(forwards):
            if f is dry:
                continue
            trained = _trains(f) and not _cleared_before_step(ev, f)
            evaluating = _without_autograd(f)
            if trained and f.get("training") is False:
                train_in_eval.setdefault("", []).append(step)
                srcs.append(str(f.get("src", "")))
            elif trained:
                for m in _sensitive(run, [str(x) for x in as_list(f.get("eval_modules"))]):
                    if not _frozen(ev, owned.get(m) or _enclosing(owned, m)):
                        train_in_eval.setdefault(m, []).append(step)
            # (not of a model put in eval() with some of its dropout modules back in train(): on
            # purpose, Monte Carlo dropout's stochastic passes; nor batch norms recomputing their
            # statistics as a cumulative average, swa_utils.update_bn's -- QA 48a)
            if evaluating and i not in cut and f.get("training") is not False \
                    and f.get("bn_recalibration") is not True:  # told with the step it ran after, as P6 tells it
                target = f.get("src") in targets
                into = target_in_train if target else eval_in_train
                for m in _sensitive(run, [str(x) for x in as_list(f.get("train_modules"))]):
                    # (a target is its own step's; an evaluation is told with the step it ran after)
                    into.setdefault(m, []).append(step if target else run.step_of_forward(step, forwards, f))
                    (target_srcs if target else srcs).append(str(f.get("src", "")))
            elif not trained and f.get("training") is not False and f.get("src") in evaluations:
                left = set(map(str, as_list(f.get("eval_modules"))))
                for m in sensitive:
                    if m not in left:
                        eval_in_train.setdefault(m, []).append(run.step_of_forward(step, forwards, f))
                srcs.append(str(f.get("src", "")))
    findings: list[Finding] = []
    src = next((s for s in srcs if s), None)
    if _norm_eval(run, settings, train_in_eval):
        findings.append(_norm_eval_finding(run, train_in_eval, owned))
    elif train_in_eval and trainable(run):
        # (a model with no parameter to train -- frozen whole, the optimizer over its input: prompt
        # tuning, style transfer, an adversarial patch -- is meant to run in eval mode; QA 47d)
        steps = sorted({s for v in train_in_eval.values() for s in v})
        mods = sorted(train_in_eval)
        who = "the model is" if "" in mods else f"{_named(run, mods)} {'is' if len(mods) == 1 else 'are'}"
        if "" in mods:  # the whole model: what it changes is in its dropout and batch-norm modules
            inside = _sensitive_modules(run)
            # less those in eval mode on every trained step before (batch-norm frozen on purpose:
            # QA 36a, "forgot train()" named them beside the dropout that did change)
            frozen = _eval_all_along(run, steps[0])
            if set(inside) - frozen:
                inside = [m for m in inside if m not in frozen]
            effects = f"{_effects(run, inside)} (in {_named(run, inside)})" if inside else _effects(run, mods)
        else:
            effects = _effects(run, mods)
        message = (f"Training while {who} in eval mode ({describe_steps(steps, run.last_step)}): "
                   f"{effects}, so the model trains differently than intended.")
        findings.append(make("P11", "warning", message, FIX_TRAIN, steps, rank=run.rank,
                             targets=[FindingTarget(step=steps[0], rank=run.rank, module=m) for m in mods],
                             modules=mods, src=src, data={"mode": "eval", "steps_by_module": train_in_eval}))
    if eval_in_train:
        steps = sorted({s for v in eval_in_train.values() for s in v})
        mods = sorted(eval_in_train)
        message = (f"Evaluating with {_named(run, mods)} in train mode "
                   f"({describe_steps(steps, run.last_step)}): dropout randomises and batch-norm updates its "
                   "statistics during evaluation.")
        findings.append(make("P11", "warning", message, FIX_EVAL, steps, rank=run.rank,
                             targets=[FindingTarget(step=steps[0], rank=run.rank, module=m) for m in mods],
                             modules=mods, src=src, data={"mode": "train", "steps_by_module": eval_in_train}))
    if target_in_train:
        steps = sorted({s for v in target_in_train.values() for s in v})
        mods = sorted(target_in_train)
        message = (f"A forward without autograd runs with {_named(run, mods)} in train mode on every step "
                   f"({describe_steps(steps, run.last_step)}): dropout randomises and batch-norm updates its "
                   "statistics in it -- by design for a consistency target (UDA, the Π-model, VAT's clean "
                   "prediction, a mean teacher), not an evaluation.")
        findings.append(make("P11", "info", message, FIX_TARGET, steps, rank=run.rank,
                             targets=[FindingTarget(step=steps[0], rank=run.rank, module=m) for m in mods],
                             modules=mods, src=next((s for s in target_srcs if s), None),
                             title="Train mode in a no_grad forward of every step",
                             data={"mode": "train", "steps_by_module": target_in_train}))
    fixed = _fixed_frozen(run)
    noisy = _frozen_dropout(run, settings, fixed)
    return findings + found + noisy + _frozen_norms_updating(run, settings, owned, fixed, noisy)
