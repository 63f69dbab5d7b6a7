"""P11: a module in the wrong mode: training with eval() (or parts left in eval), evaluating with train()."""

from __future__ import annotations

from typing import Any

from torchscope.schema import Finding, FindingTarget

from ..finding import describe_steps, make
from ..run import Run, as_dict, as_int, as_list
from ..settings import Settings

# Only these behave differently in train and eval mode; elsewhere the mode changes nothing.
_MODE_SENSITIVE = ("Dropout", "BatchNorm", "InstanceNorm", "SyncBatchNorm", "AlphaDropout", "LazyBatchNorm")

FIX_TRAIN = ("Call model.train() at the start of every training epoch/step (after each evaluation). Batch-norm "
             "statistics frozen on purpose (fine-tuning with small batches) are fine: freeze its affine parameters "
             "too (requires_grad_(False)) and this is not reported.")
FIX_EVAL = "Call model.eval() before evaluating (and model.train() afterwards), inside torch.no_grad()."


def _sensitive(run: Run, modules: list[str]) -> list[str]:
    known = {str(as_dict(m).get("path")) for m in as_list(run.session.get("modules"))}
    return [m for m in modules if m not in known or run.module_type(m).startswith(_MODE_SENSITIVE)]


def _has_sensitive(run: Run) -> bool:
    mods = [as_dict(m) for m in as_list(run.session.get("modules"))]
    return not mods or any(str(m.get("type", "")).startswith(_MODE_SENSITIVE) for m in mods)


def _frozen(ev: dict[str, Any], own: list[int]) -> bool:
    """Whether a module with the parameters ``own`` trains none of them at this step (frozen:
    no gradient, and not a trainable parameter whose gradient is missing).  A frozen module put
    in eval() while the rest trains is fine-tuning's deliberate freeze, not a forgotten mode."""
    grads = as_dict(ev.get("grads"))
    norms, missing = as_list(grads.get("norm")), {as_int(i, -1) for i in as_list(grads.get("none"))}
    return bool(own) and all(i < len(norms) and norms[i] is None and i not in missing for i in own)


def _named(mods: list[str]) -> str:
    return ", ".join(repr(m) for m in mods[:4]) + (f" and {len(mods) - 4} more" if len(mods) > 4 else "")


def _effects(run: Run, mods: list[str]) -> str:
    """What eval mode changes in ``mods``: dropout off, batch-norm statistics frozen (both for
    the whole model or modules of unknown type)."""
    types = [run.module_type(m) for m in mods]
    known = "" not in mods and all(types)
    dropout = not known or any("Dropout" in t for t in types)
    norm = not known or any("Norm" in t for t in types)
    parts = (["dropout is off"] if dropout else []) + (["batch-norm statistics are frozen"] if norm else [])
    return " and ".join(parts) or "dropout is off and batch-norm statistics are frozen"


def check(run: Run, settings: Settings) -> list[Finding]:
    if not _has_sensitive(run):
        return []  # no dropout/batch-norm: train and eval compute the same thing
    train_in_eval: dict[str, list[int]] = {}  # module ("" = whole model) -> steps
    owned: dict[str, list[int]] = {}  # module -> indices of its own parameters
    for i in range(len(run.params)):
        owned.setdefault(run.param_module(i), []).append(i)
    eval_in_train: dict[str, list[int]] = {}
    srcs: list[str] = []
    for step, ev in run.forward_events():
        forwards = [as_dict(f) for f in as_list(ev.get("forwards"))]
        if not forwards and ev.get("training") is False and as_int(ev.get("micro_batches")) > 0:
            train_in_eval.setdefault("", []).append(step)
        for f in forwards:
            trained = f.get("backward") is True
            evaluating = f.get("grad_mode") is False or f.get("inference_mode") is True
            if trained and f.get("training") is False:
                train_in_eval.setdefault("", []).append(step)
                srcs.append(str(f.get("src", "")))
            elif trained:
                for m in _sensitive(run, [str(x) for x in as_list(f.get("eval_modules"))]):
                    if not _frozen(ev, owned.get(m, [])):
                        train_in_eval.setdefault(m, []).append(step)
            if evaluating:
                for m in _sensitive(run, [str(x) for x in as_list(f.get("train_modules"))]):
                    eval_in_train.setdefault(m, []).append(step)
                    srcs.append(str(f.get("src", "")))
    findings: list[Finding] = []
    src = next((s for s in srcs if s), None)
    if train_in_eval:
        steps = sorted({s for v in train_in_eval.values() for s in v})
        mods = sorted(train_in_eval)
        who = "the model is" if "" in mods else f"{_named(mods)} {'is' if len(mods) == 1 else 'are'}"
        if "" in mods:  # the whole model: what it changes is in its dropout and batch-norm modules
            inside = [str(as_dict(m).get("path")) for m in as_list(run.session.get("modules"))
                      if str(as_dict(m).get("type", "")).startswith(_MODE_SENSITIVE)]
            effects = f"{_effects(run, inside)} (in {_named(inside)})" if inside else _effects(run, mods)
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
        message = (f"Evaluating with {_named(mods)} in train mode "
                   f"({describe_steps(steps, run.last_step)}): dropout randomises and batch-norm updates its "
                   "statistics during evaluation.")
        findings.append(make("P11", "warning", message, FIX_EVAL, steps, rank=run.rank,
                             targets=[FindingTarget(step=steps[0], rank=run.rank, module=m) for m in mods],
                             modules=mods, src=src, data={"mode": "train", "steps_by_module": eval_in_train}))
    return findings
