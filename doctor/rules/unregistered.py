"""P1's other face: gradients that flow into nn.Parameters the model does not hold and no
optimizer steps -- a submodule kept in a plain Python list or dict instead of nn.ModuleList /
nn.ModuleDict is not registered, so ``model.parameters()`` and the optimizer miss it: it never
trains, and without a zero_grad() of its own its ``.grad`` only grows."""

from __future__ import annotations

from typing import Any

from torchscope.schema import Finding, FindingTarget

from ..finding import describe_steps, make
from ..run import Run, as_dict, as_int, as_list, notes
from ..settings import Settings

FIX = ("Hold submodules in nn.ModuleList / nn.ModuleDict (and loose parameters in nn.ParameterList, or as "
       "attributes), then build the optimizer from model.parameters(). A model run only to make targets "
       "(a frozen teacher) goes under torch.no_grad() or requires_grad_(False).")

FIX_COPY = ("Run that model (a copy, a teacher) without autograd: compute its outputs under torch.no_grad() (a DQN's "
            "`with torch.no_grad(): next_q = target_net(next_state).max(1).values`), or call "
            "requires_grad_(False) on it once. If it is a submodule kept in a plain list or dict instead, hold it in "
            "nn.ModuleList / nn.ModuleDict and build the optimizer from model.parameters().")


FIX_HELD = ("Make it a parameter: self.{attr} = nn.Parameter(...) (a learnable token, a scale); then "
            "model.parameters() holds it, the optimizer built from them steps it, zero_grad() clears it, and it "
            "moves with .to() and is saved in state_dict(). A constant goes in register_buffer() without requires_grad.")


def _held(run: Run) -> list[str]:
    """The module attributes ("path.attr") holding plain tensors that require grad which the
    backward reached: NodeRecord.held_as on captured graphs, the light steps' events."""
    names = {str(n["held_as"]) for _, graph in run.all_graphs() for n in map(as_dict, as_list(graph.get("nodes")))
             if n.get("unregistered") and n.get("held_as")}
    names |= {str(h) for ev in run.steps for e in notes(ev, "unregistered_params") for h in as_list(e.get("held_as"))}
    return sorted(names)


def _unregistered(graph: dict[str, Any]) -> tuple[list[int], list[str], bool, str]:
    """The graph's AccumulateGrad nodes marked unregistered, the modules of the recorded ops that
    used them, whether none of those was recorded (their ops ran outside the watched model's
    forward: a second model -- a teacher, a target network -- not a submodule of it), and the
    user's line of the first recorded op that used them ('' when none is known)."""
    nodes = [as_dict(n) for n in as_list(graph.get("nodes"))]
    marked = {as_int(n.get("id"), -1) for n in nodes if n.get("unregistered")}
    marked.discard(-1)
    if not marked:
        return [], [], False, ""
    by_id = {as_int(n.get("id"), -1): n for n in nodes}
    user_ids = [as_int(e[0], -1) for e in as_list(graph.get("edges"))
                if isinstance(e, list) and len(e) >= 2 and as_int(e[1], -1) in marked]
    ops = {as_int(o.get("id"), -1): o for o in map(as_dict, as_list(graph.get("ops")))}

    def outside_model(node: dict[str, Any]) -> bool:
        # made by an op the loop ran outside the watched model's forward (a BYOL target
        # network called beside the model: read as the model's root, QA 50a), or by none
        # recorded on a graph with ops (called before the model's forward, where the
        # recording of the step begins: QA 50c)
        op = as_int(node.get("op"), -1)
        return "outside_model" in as_list(ops.get(op, {}).get("flags")) or (op < 0 and bool(ops))

    users = [None if outside_model(n := by_id.get(i, {})) else n.get("module") for i in user_ids]
    known = sorted({str(m) for m in users if m is not None})
    src = next((str(ops[op].get("src")) for i in user_ids if (op := as_int(by_id.get(i, {}).get("op"), -1)) in ops
                and ops[op].get("src")), "")
    return sorted(marked), known, bool(users) and not known, src


def _copied_module(run: Run, count: int) -> str | None:
    """The model's outermost submodules with exactly ``count`` parameters (the usual source of a
    target encoder: ``copy.deepcopy(model.online)``), as "'online'" or "'stem' or 'encoder'"
    (the count alone cannot tell which), or None."""
    sizes: dict[str, int] = {}
    for i in range(len(run.params)):
        parts = run.param_name(i).split(".")[:-1]
        for k in range(1, len(parts) + 1):
            path = ".".join(parts[:k])
            sizes[path] = sizes.get(path, 0) + 1
    found = [p for p, n in sizes.items() if n == count]
    outer = [p for p in found if not any(p.startswith(q + ".") for q in found)]
    return " or ".join(f"'{p}'" for p in outer[:3]) if outer else None


def _same_structure(run: Run, steps: list[int]) -> list[int]:
    """``steps`` and the steps whose graph had the structure of one of them (default mode
    captures one step per structure: the same graph reaches the same parameters)."""
    # ... and the optimizer's param groups as many (a parameter added with add_param_group
    # from then on is stepped: QA 46b, "it never trains" on every later step)
    def key(ev: dict[str, Any]) -> tuple[Any, int]:
        return ev.get("graph_signature"), len(as_list(ev.get("lr")))

    sigs = {key(ev) for s, ev in run.step_events() if s in steps and ev.get("graph_signature") not in (None, "")}
    return sorted(set(steps) | {s for s, ev in run.step_events() if key(ev) in sigs})


def _counted(run: Run) -> tuple[list[int], int]:
    """Light mode's steps from the first with ``events[{what: "unregistered_params", count}]`` on
    (it writes no graph: the capture counts such parameters in its own walk of the backward's
    graph, and tells them when they change: the steps between use them too -- "at step 0" read
    as the only step of a list used on every one, QA 50c), and the largest count."""
    told, most = [], 0
    for ev in run.steps:
        n = max((as_int(e.get("count")) for e in notes(ev, "unregistered_params")), default=0)
        if n > 0:
            told.append(as_int(ev.get("step")))
            most = max(most, n)
    return (list(range(told[0], run.last_step + 1)) if told else []), most


def check(run: Run, settings: Settings) -> list[Finding]:
    hits: list[tuple[int, int, list[int], list[str], bool, str]] = []  # step, micro, node ids, modules, outside, src
    for step, graph in run.all_graphs():
        nodes, modules, outside, src = _unregistered(graph)
        if nodes:
            hits.append((step, as_int(graph.get("micro")), nodes, modules, outside, src))
    if hits:
        step, _, nodes, modules, outside, src = hits[0]
        # the uncaptured steps of a captured structure too (QA 37a: "at step 0" in default
        # mode for a target network run with autograd on every step, "every step" in full)
        steps = _same_structure(run, sorted({h[0] for h in hits}))
        count = len(nodes)
    else:
        steps, count = _counted(run)
        if not steps:
            return []
        step, nodes, modules, outside, src = steps[0], [], [], False, ""
    model = str(run.session.get("model") or "the model")
    held = _held(run)
    if held and count == len(held):  # every one is a module's plain tensor: told by its name
        shown = ", ".join(f"'{h}'" for h in held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        message = (f"{shown} of {model} {'is a tensor' if len(held) == 1 else 'are tensors'} with requires_grad=True, "
                   f"not {'an nn.Parameter' if len(held) == 1 else 'nn.Parameters'}: model.parameters() and the optimizer "
                   f"miss {'it' if len(held) == 1 else 'them'} -- never trained, and the .grad keeps growing "
                   f"({describe_steps(steps, run.last_step)}).")
        fix = FIX_HELD.replace("{attr}", held[0].rpartition(".")[2])
        targets = [FindingTarget(step=step, rank=run.rank, node=n) for n in nodes] or [FindingTarget(step=step, rank=run.rank)]
        return [make("P1", "warning", message, fix, steps, rank=run.rank, targets=targets,
                     modules=[m for m in modules if m], title="Parameters outside the model", src=src or None)]
    used = [m if m else "(root)" for m in modules]
    copied = _copied_module(run, count) if outside else None
    # as many as the model has reads as a copy of it -- unless a captured graph shows the ops
    # using them inside the model's forward: a plain list of layers as many (QA 50c)
    copy = outside or (count == len(run.params) and not modules)
    # a copy of the model is used by its own ops, which ran in no watched module: "(root)" says nothing
    in_ops = f", used by ops of {', '.join(used[:3])}" if used and not (copy and used == ["(root)"]) else ""
    head = (f"Gradients flow into {count} nn.Parameter tensor{'s' if count != 1 else ''} that "
            f"{'are' if count != 1 else 'is'} not {model}'s and that no optimizer steps "
            f"({describe_steps(steps, run.last_step)}{in_ops})")
    fix = FIX
    if copy:
        # as many as the model has: a copy of it (a DQN's target network, a teacher made with
        # copy.deepcopy) run with autograd on, more often than a forgotten ModuleList
        what = (f"as many as {model} has -- a copy of the model (a target network or a teacher made with copy.deepcopy)"
                if count == len(run.params) else
                f"used outside {model}'s forward, as many as its submodule {copied} has -- a copy of it (a BYOL or "
                "MoCo target encoder, a teacher made with copy.deepcopy)" if copied else
                f"used outside {model}'s forward -- a second model (a teacher, a target network)")
        message = (f"{head}: {what} run with autograd on: its outputs build a graph into its weights "
                   "and fill their .grad, which nothing uses. (A submodule kept in a plain Python list or dict "
                   "looks the same: not registered, never trained.)")
        fix = FIX_COPY
    else:
        message = (f"{head}: a submodule kept in a plain Python list or dict is not registered, so "
                   "model.parameters() and the optimizer miss it -- it never trains, and its .grad keeps growing.")
    targets = [FindingTarget(step=step, rank=run.rank, node=n) for n in nodes] or [FindingTarget(step=step, rank=run.rank)]
    return [make("P1", "warning", message, fix, steps, rank=run.rank, targets=targets,
                 modules=[m for m in modules if m], title="Parameters outside the model", src=src or None)]
