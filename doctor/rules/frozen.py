"""P17: ``module.requires_grad = False`` (an attribute, not ``requires_grad_(False)``) froze nothing.

``nn.Module`` has no ``requires_grad`` flag of its own: assigning one sets a plain Python
attribute and leaves every parameter's flag as it was, so the "frozen" layer still gets
gradients and the optimizer still updates it.  The capture records the attribute where a
module has one (``ModuleInfo.requires_grad_attr``); the parameters' flags are in the header and
their gradients in the steps.
"""

from __future__ import annotations

from torchscope.schema import Finding, FindingTarget

from ..finding import and_list, describe_steps, make
from ..run import Run, as_dict, as_list, notes
from ..settings import Settings

FIX = ("Freeze with the method: module.requires_grad_(False) (with the underscore), or set p.requires_grad = False "
       "for each p in module.parameters(); build the optimizer over the parameters that still require grad "
       "(filter(lambda p: p.requires_grad, model.parameters())).")


def _under(module: str, path: str) -> bool:
    return not path or module == path or module.startswith(path + ".")


def _meant(run: Run) -> list[str]:
    """The modules given ``requires_grad = False``: before watch() (the session event's
    modules), or after it (a step's ``requires_grad_attr`` note, read every 10 steps)."""
    meant = {str(m.get("path", "")) for m in as_list(run.session.get("modules"))
             if isinstance(m, dict) and m.get("requires_grad_attr") is False}
    for _, ev in run.step_events():
        for note in notes(ev, "requires_grad_attr"):
            meant.update(str(p) for p in as_list(note.get("off")))
    return sorted(meant)


def check(run: Run, settings: Settings) -> list[Finding]:
    meant = _meant(run)
    if not meant:
        return []
    # keep the outermost: `model.encoder.requires_grad = False` and its layers' the same
    meant = [p for p in meant if not any(q != p and _under(p, q) for q in meant)]
    told: list[tuple[str, list[int], list[int]]] = []  # (module, its parameters, the steps they got gradients)
    for path in meant:
        idx = [i for i, p in enumerate(run.params)
               if p.get("requires_grad", True) and _under(run.param_module(i), path)]
        if not idx:
            continue
        steps: list[int] = []
        for step, ev in run.step_events():
            norms = as_list(as_dict(ev.get("grads")).get("norm"))
            if any(i < len(norms) and norms[i] is not None for i in idx):
                steps.append(step)
        if steps:  # (off the loss path as well: nothing trains them, nothing to tell)
            told.append((path, idx, steps))
    if not told:
        return []
    # several modules (a loop's `for layer in ...: layer.requires_grad = False`) are one finding
    # naming each (QA 51b: a warning per module, for one line of code)
    names = [run.param_name(i) for _, idx, _ in told for i in idx]
    steps = sorted({s for _, _, st in told for s in st})
    shown = and_list(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    labels = ["model" + "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in path.split(".") if part)
              for path, _, _ in told]
    types = sorted({run.module_type(path) or "module" for path, _, _ in told})
    on = (f"a plain attribute on the {types[0]}" if len(told) == 1 else
          f"plain attributes on these {len(told)} {' and '.join(types) if len(types) <= 2 else ''} modules")
    got = f"; they got gradients {describe_steps(steps, run.last_step)}"
    message = (f"{and_list([f'{label}.requires_grad = False' for label in labels])} set {' '.join(on.split())}: "
               f"{'its' if len(told) == 1 else 'their'} parameters {shown} still require grad{got}, and an "
               "optimizer given them updates them.")
    return [make("P17", "warning", message, FIX, steps, rank=run.rank,
                 modules=[path for path, _, _ in told], params=names,
                 targets=[FindingTarget(step=st[0], rank=run.rank, module=path) for path, _, st in told],
                 view="gradients")]
