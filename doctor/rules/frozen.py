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


FIX_TIED = ("If only one of the two modules should stay fixed, untie them before freezing -- "
            "{alias} = nn.Parameter({name}.detach().clone()) -- or keep them tied and train both. "
            "If the shared weight is meant to stay fixed in both, nothing to fix.")


def _own_shapes(run: Run, path: str) -> dict[str, list[int]]:
    """The shapes of the parameters a Linear or an Embedding at ``path`` owns, by name, read from
    its ``extra_repr`` (``in_features=32, out_features=64, bias=True``; ``64, 32``); {} for any
    other module, whose parameters' shapes the session does not tell."""
    info = next((m for m in as_list(run.session.get("modules")) if isinstance(m, dict) and m.get("path") == path), {})
    kind, text = str(info.get("type", "")), str(info.get("extra_repr", ""))
    if kind == "Linear":
        fields = dict(part.strip().partition("=")[::2] for part in text.split(","))
        if fields.get("in_features", "").isdigit() and fields.get("out_features", "").isdigit():
            out, inp = int(fields["out_features"]), int(fields["in_features"])
            return {"weight": [out, inp], **({"bias": [out]} if fields.get("bias") == "True" else {})}
    if kind == "Embedding":
        head = [part.strip() for part in text.split(",")[:2]]
        if len(head) == 2 and all(h.isdigit() for h in head):
            return {"weight": [int(head[0]), int(head[1])]}
    return {}


def _tied_frozen(run: Run) -> list[Finding]:
    """A frozen parameter (``requires_grad=False`` at watch()) that a second module holds too:
    weight tying (``decoder.weight = encoder.weight``) makes one Parameter of both, and
    ``named_parameters()`` names it once, under the module that registered it first -- the
    other module's ``ModuleInfo.n_params`` counts it all the same.  Freezing it through one
    module (``model.decoder.weight.requires_grad_(False)`` meant for the output layer) freezes
    the other's (QA 52b F3: no finding).  Told where the session pins the shared parameter down:
    the holder is a Linear or an Embedding (its shapes read from its ``extra_repr``) and exactly
    one frozen parameter of another module has the missing one's shape; and only where the
    freeze is local -- one of the two modules holds a parameter that trains, or most of the
    model's parameters train (a frozen base model under LoRA, its tied embedding frozen with
    the rest, is no news).  A note: freezing a tied embedding may be meant."""
    params = run.params
    frozen = [i for i, p in enumerate(params) if p.get("requires_grad") is False]
    if not frozen or len(frozen) == len(params):
        return []
    listed: dict[str, set[str]] = {}
    for i in range(len(params)):
        listed.setdefault(run.param_module(i), set()).add(run.param_name(i).rpartition(".")[2])
    trains = {run.param_module(i) for i, p in enumerate(params) if p.get("requires_grad", True)}
    mostly = 2 * len(frozen) < len(params)
    found: list[tuple[int, str, str]] = []  # (frozen parameter, the other module holding it, its name there)
    for m in as_list(run.session.get("modules")):
        if not isinstance(m, dict):
            continue
        path = str(m.get("path", ""))
        held = listed.get(path, set())
        n = m.get("n_params")
        if not isinstance(n, int) or n <= len(held):
            continue
        for name, shape in _own_shapes(run, path).items():
            if name in held:
                continue
            same = [i for i in frozen if params[i].get("shape") == shape and run.param_module(i) != path]
            if len(same) == 1 and (mostly or path in trains or run.param_module(same[0]) in trains):
                found.append((same[0], path, f"{path}.{name}" if path else name))
    if not found:
        return []
    steps = [step for step, _ in run.step_events()] or [0]
    parts = []
    for i, other, alias in found:
        owner = run.param_module(i)
        kinds = f"{owner!r} ({run.module_type(owner) or 'module'}) and {other!r} ({run.module_type(other) or 'module'})"
        parts.append(f"{run.param_name(i)} is frozen (requires_grad=False) and is also {alias}: {kinds} share this one "
                     f"Parameter (weight tying, {alias} = {run.param_name(i)})")
    message = ("; ".join(parts) + ". Freezing it through either module freezes it in both, so neither trains it: "
               "if the requires_grad_(False) was meant for one of them (the output layer), it froze the other (the "
               "embedding) too.")
    names = [run.param_name(i) for i, _, _ in found]
    modules = sorted({run.param_module(i) for i, _, _ in found} | {other for _, other, _ in found})
    fix = FIX_TIED.format(alias=found[0][2], name=run.param_name(found[0][0]))
    return [make("P17", "info", message, fix, steps, rank=run.rank, modules=modules, params=names,
                 targets=[FindingTarget(step=steps[0], rank=run.rank, param=run.param_name(i), module=run.param_module(i))
                          for i, _, _ in found] + [FindingTarget(step=steps[0], rank=run.rank, module=other)
                                                   for _, other, _ in found],
                 view="gradients", title="Frozen parameter shared by two modules")]


def check(run: Run, settings: Settings) -> list[Finding]:
    return _tied_frozen(run) + _attribute(run)


def _attribute(run: Run) -> list[Finding]:
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
