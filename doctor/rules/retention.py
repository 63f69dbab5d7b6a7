"""P7 (autograd graphs of old steps kept alive) and P13 (module hooks hoarding activations or gradients).

Both are memory that grows step after step; P13's bytes are attributed to hooks by the
capture, so P7 judges the memory growth that the hooks do not explain.
"""

from __future__ import annotations

from torchscope.schema import Finding, FindingTarget

from ..finding import and_list, contiguous_runs, describe_steps, fmt_bytes, make
from ..run import Run, as_dict, as_int, as_list, notes
from ..settings import Settings
from ..source import keeping_line, running_sum

FIX_P7 = ("Don't keep tensors that carry a graph across steps: accumulate `loss.item()` (not `loss`), store "
          "`out.detach()`, detach recurrent state between batches, and drop retain_graph=True unless needed.")
FIX_COPY = ("Update copies of the weights without autograd: inside `with torch.no_grad():` (e.g. "
            "`with torch.no_grad(): ema_p.lerp_(p, 1 - decay)`), or from `p.detach()`.")
FIX_P13 = ("Keep only what you need from the hook: a summary (`output.mean().item()`), a `.cpu()` copy, or the "
           "latest value instead of appending every call -- `output.detach()` drops the graph but shares the "
           "output's storage, so appending it still holds every batch's activations -- and remove the hook "
           "(`handle.remove()`) when done.")
FIX_CHANGED = ("Keep a copy in the hook -- `output.detach().clone()` (`.detach()` alone shares the storage, and the "
               "in-place op writes into it) -- or compute what you need inside the hook; or make the later op out of "
               "place (`nn.ReLU(inplace=False)`, `x = x + y` instead of `x += y`).")


def _growing(values: list[tuple[int, int]], min_delta: int, need: int) -> list[int]:
    """Steps of the longest streak where the value rose by >= min_delta each step (streak of >= need rises)."""
    rising = [s for (_, a), (s, b) in zip(values, values[1:], strict=False) if b - a >= min_delta and b > 0]
    best = max(contiguous_runs(rising), key=len, default=[])
    return best if len(best) >= need else []


def _keeps_growing(counts: list[int]) -> bool:
    """Old graphs pile up: the most alive in the run's last third exceeds the most in its first,
    its first boundary left out (no earlier step has a graph to keep yet) and its final one (a
    trailing backward closed at the end).  A loop variable holding the latest loss until the
    next iteration rebinds it keeps one graph alive, of a steady size -- ``loss = train_step()``:
    0, 11, 11, 11... nodes; a WGAN-GP's generator loss: 0, 20, 0, 20... -- which is no leak."""
    body = counts[1:-1] if len(counts) > 3 else counts[1:]
    k = max(1, len(body) // 3)
    return max(body[-k:]) > max(body[:k]) or _rising(body, 8)


def _steady_once_kept(counts: list[int]) -> bool:
    """Whether the counts, from the first boundary with a graph alive on, do not grow: a graph
    a loop variable holds until the next iteration rebinds it, kept from a later step on -- a
    GAN's container watched whole keeps its generator loss's graph from its second step on (its
    direct calls seen at the first): 0, 0, 13, 13, 13... (QA 48b: "+6 per step" over 6 steps)."""
    first = next((i for i, n in enumerate(counts) if n > 0), len(counts))
    return first < len(counts) - 1 and not _keeps_growing([0, *counts[first:]])


def _rising(counts: list[int], need: int) -> bool:
    """``need`` rises in a row: a graph piled up over an epoch and let go at its end (``total_loss
    += loss``, reset to 0. every epoch) peaks as high in the last third as in the first."""
    streak = 0
    for a, b in zip(counts, counts[1:], strict=False):
        streak = streak + 1 if b > a else 0
        if streak >= need:
            return True
    return False


# what the capture saw the latest kept graph hang from (a step event's graphs_kept)
_KEPT = {
    "loss": "the loss that backward() was called on stays referenced after its step (`total += loss` or "
            "`history.append(loss)` keeps every step's graph; `loss.item()` does not).",
    # (or a tensor computed from it: a validation loss `vl` held until the next evaluation, QA 42a)
    "output": "the model's output, or a tensor computed from it (a metric, a validation loss), stays referenced "
              "after its step (kept in a list, or in a variable the next forward does not replace), and with "
              "it the graph that made it.",
    "state": "an output of the model is fed into the next step's forward without `.detach()` (a recurrent "
             "hidden state carried across batches): each step's graph holds every earlier one, and each "
             "backward goes through all of them.",
    "": "something keeps a tensor with a grad_fn across steps.",
}


def _kept(run: Run) -> dict[str, object]:
    """The latest step event's ``graphs_kept``: what the old graph hangs from, and its line;
    with the line that took a kept loss in, from whichever step the capture saw it at (it
    looks for it over a few steps only)."""
    kept: dict[str, object] = {}
    held_in: dict[object, str] = {}  # of -> the container found holding such tensors
    for _, ev in reversed(list(run.step_events())):
        this = as_dict(ev.get("graphs_kept"))
        kept = kept or this
        if kept and this.get("of") == kept.get("of") and this.get("held_at"):
            return {**kept, "held_at": this["held_at"]}
        if this.get("held_in"):
            held_in.setdefault(this.get("of"), str(this["held_in"]))
    of = kept.get("of")
    return {**kept, "held_in": held_in[of]} if of in ("loss", "output") and of in held_in else kept


def _hook_bytes(ev: dict[str, object]) -> int:
    return sum(as_int(v) for v in as_dict(ev.get("hooks")).values())


def _kept_by(held_in: str, default: str) -> str:
    """The code name of what the capture found holding them: ``'preds' (a list)`` -> ``preds``,
    ``'.outputs' (a list)`` -> ``self.outputs``, ``'tracker.losses' (a list)`` -> ``tracker.losses``;
    ``default`` for one it could not name (QA 46a:
    the example named ``all_probs`` for a list called ``all_preds``)."""
    if not held_in.startswith("'"):
        return default
    name = held_in[1:].split("'", 1)[0]
    return f"self{name}" if name.startswith(".") else name or default


def check_graphs_alive(run: Run, settings: Settings) -> list[Finding]:
    alive = [(s, as_int(ev.get("graphs_alive"))) for s, ev in run.step_events() if "graphs_alive" in ev]
    alive_steps = [s for s, n in alive if n > 0]
    grows = len(alive_steps) >= settings.min_steps and _keeps_growing([n for _, n in alive])
    # Memory growth the hooks don't account for (P13 reports theirs), with what the kept
    # graphs hold saved for backward (not in `live`).
    # (less the optimizer's state: LBFGS's history grows by two parameter-sized tensors a step up to
    # its history_size, beside the one graph ``loss = opt.step(closure)`` holds -- QA 48e)
    live = [(s, as_int(mem.get("live")) + as_int(mem.get("kept")) - _hook_bytes(ev) - as_int(mem.get("optimizer")))
            for s, ev in run.step_events() if "live" in (mem := as_dict(ev.get("memory")))]
    mem_steps = _growing(live, settings.memory_growth_bytes, settings.growth_steps)
    known = bool(alive)  # the capture counts old nodes; without it, memory growth is the only clue
    if not grows and not (mem_steps and (not known or any(n > 0 for _, n in alive))):
        # Memory growth with no old graph alive is some other hoard (caches, lists of numbers).
        return []
    held = _held(run, settings) if grows and not mem_steps else None
    if held is not None:
        return [_held_finding(run, held, alive)]
    if grows and not mem_steps and _steady_once_kept([n for _, n in alive]):
        return []
    steps = alive_steps if grows else mem_steps
    per_step = (live[-1][1] - live[0][1]) / max(1, live[-1][0] - live[0][0]) if len(live) >= 2 else 0.0
    # both columns: what kept graphs hold is ``kept``, not ``live`` (the storages of the step's state)
    growth = f", memory (live + kept) +{fmt_bytes(per_step)} per step" if per_step > 0 else ""
    kept = _kept(run)
    # the line that keeps a loss (`total += loss`) where the capture saw it; for a named container
    # (`history.append(loss)`: no torch call, never recorded) the script's line that fills it, when
    # the script is still there to read; else the backward's (or the forward's) line that made it
    made = str(kept.get("src") or "")
    fills = (keeping_line(run, _kept_by(str(kept["held_in"]), ""), made)
             if made and not kept.get("held_at") and str(kept.get("held_in") or "").startswith("'") else None)
    filled = f", filled at {fills}" if fills else ""
    if known:
        # at the most alive (the run's end may have let them go: an epoch's accumulator reset)
        top_step, top = max(alive, key=lambda a: a[1])
        span = top_step - alive[0][0]
        nodes_per_step = (top - alive[0][1]) / span if span > 0 and top > alive[0][1] else 0.0
        nodes = f", +{nodes_per_step:.0f} per step" if nodes_per_step >= 0.5 else ""
        why = _KEPT.get(str(kept.get("of")), _KEPT[""])
        if kept.get("held_in") and kept.get("of") == "output":  # a named list of the user's keeping them
            why = (f"the model's outputs, or tensors computed from them, stay referenced after their step, held by "
                   f"{kept['held_in']}{filled}: each keeps its step's graph "
                   f"(as `{_kept_by(str(kept['held_in']), 'all_probs')}.append(out)` or `.append(torch.sigmoid(out))` "
                   "would); keep "
                   "`.detach()` of them there instead (or `.item()`, `.cpu()` of the detached tensor).")
        elif kept.get("held_in"):  # the container the garbage collector found holding them
            holder = str(kept["held_in"])
            example = (f"{_kept_by(holder, 'best')} = loss" if holder.endswith("(a variable)") or holder.endswith("(an attribute)")
                       else f"{_kept_by(holder, 'history')}[key] = loss" if holder.endswith("(a dict)")
                       else f"{_kept_by(holder, 'history')}.append(loss)")
            why = (f"the losses that backward() was called on stay referenced after their step, held by "
                   f"{holder}{filled}: each keeps its step's graph (as `{example}` would); keep "
                   "`loss.item()` or `loss.detach()` there instead.")
        if kept.get("held_in") and not filled and made:
            # (QA 51b: the source shown read as the holder's line)
            why += (f" The line that puts them there is not recorded (no torch call), so the source shown, {made}, is "
                    f"{'the forward that made them' if kept.get('of') == 'output' else 'the backward() called on them'}.")
        message = (f"Autograd graphs of earlier steps are still alive (up to {top} nodes, at step {top_step}{nodes}"
                   f"{growth}, {describe_steps(steps, run.last_step)}): {why}")
    else:
        message = (f"Live memory at step boundaries grows every step (+{fmt_bytes(per_step)} per step, "
                   f"{describe_steps(steps, run.last_step)}): something keeps tensors (often their graphs) across steps.")
    src = str(kept.get("held_at") or fills or made) or None
    return [make("P7", "warning", message, FIX_P7, steps, rank=run.rank, src=src,
                 targets=[FindingTarget(step=steps[0], rank=run.rank)], view="memory",
                 data={"graphs_alive": [n for _, n in alive], "live": [b for _, b in live],
                       "steps": [s for s, _ in live], "growth_per_step": per_step,
                       **({"nodes_per_step": nodes_per_step} if known else {})})]


FIX_HELD = ("Nothing piles up in the loop. If the step was stopped by an error or an interrupt in a notebook, the "
            "last error's traceback keeps that step's frame (its `loss`, outputs) alive until the next error or a "
            "kernel restart; otherwise `del` the variable or container that outlived its step.")


def _held(run: Run, settings: Settings) -> tuple[int, int] | None:
    """(the kept graph's step, the run's last boundary with graphs alive) when the latest graph
    alive at the run's end is an old step's: no graph of the last ``growth_steps`` steps was
    kept, so nothing piles up -- the alive count can only fall.  One graph held from a step cut
    short by an error or the notebook's Stop (IPython keeps the last traceback, and with it that
    step's frame and loss) looks like growth against the run's start, but does not grow."""
    last = [(s, as_dict(ev.get("graphs_kept"))) for s, ev in run.step_events() if as_int(ev.get("graphs_alive")) > 0]
    if not last or "step" not in last[-1][1]:
        return None  # no record of which step's graph is kept: judged by the counts alone
    step, kept = last[-1][0], as_int(last[-1][1].get("step"), -1)
    return (kept, step) if 0 <= kept < step - settings.growth_steps else None


def _evaluation_at(run: Run, step: int, src: str) -> int | None:
    """The step an evaluation belongs to (``Run.step_of_forward``) when the forwards at ``src``
    of ``step`` (the kept output's) all built a graph that no backward used -- an evaluation (or
    an inference) run with autograd on; None otherwise."""
    forwards = next((as_list(ev.get("forwards")) for s, ev in run.step_events() if s == step), [])
    at = [f for f in forwards if isinstance(f, dict) and f.get("src") == src]
    if not at or not all(f.get("built_graph") is True and f.get("backward") is False for f in at):
        return None
    return Run.step_of_forward(step, forwards, at[0])


def _held_finding(run: Run, held: tuple[int, int], alive: list[tuple[int, int]]) -> Finding:
    kept, last = held
    steps = [s for s, n in alive if n > 0 and s > kept]
    now = next((n for s, n in reversed(alive) if s == last), 0)
    info = next((k for _, ev in run.step_events() if as_int((k := as_dict(ev.get("graphs_kept"))).get("step"), -1) == kept), {})
    src = str(info.get("held_at") or info.get("src") or "") or None
    head = (f"An autograd graph of an earlier step is still alive ({now} nodes at step {last}, the latest of "
            f"step {kept}), but no later step's graph was kept in the {last - kept - 1} steps since: it is held, "
            "not piling up (the count does not grow): ")
    fix = FIX_HELD
    made = str(info.get("src") or "")
    evaluated = _evaluation_at(run, kept, made) if info.get("of") == "output" and made else None
    if evaluated is not None:
        # an evaluation's graph (no backward used it), held by what the loop kept of it: a running
        # validation loss -- not a training loop's `loss` (QA 51b named "a module-level `loss`")
        total = running_sum(run, made)
        holder = (f"`{total}`, summed at {made} from losses that carry their graphs, still holds it" if total else
                  "a variable still holds its output or a tensor computed from it (a validation loss summed "
                  "without `.item()`, an output kept for a metric)")
        message = (f"{head}the evaluation forward at {made} ({'after ' if evaluated < kept else ''}step {evaluated}) ran with autograd on and built a graph that "
                   f"no backward() used, and {holder} until the next evaluation replaces it.")
        fix = (f"Sum plain numbers: `{total} += criterion(...).item()` (start it at 0.0), " if total else
               "Keep plain numbers of an evaluation: `.item()` of a loss, `.detach()` of an output, ") + \
              "and run the evaluation under `with torch.no_grad():` so that it builds no graph at all."
    else:
        message = (f"{head}a variable still holds that step's loss or output (a module-level `loss` of a first "
                   "training loop, before a second one), or a step cut short by an error or an interrupt left its "
                   "graph in the exception's traceback, which IPython and Jupyter keep.")
    return make("P7", "info", message, fix, steps or [last], rank=run.rank, src=src,
                targets=[FindingTarget(step=(steps or [last])[0], rank=run.rank)], view="memory",
                data={"graphs_alive": [n for _, n in alive], "kept_step": kept, "nodes_per_step": 0.0},
                title="Graph of an earlier step held")


def check_weight_copies(run: Run, settings: Settings) -> list[Finding]:
    """A copy of the weights (an EMA, a target network) updated in place from a parameter while
    autograd records (``graph_copy`` events, one per line of the user's that does it)."""
    lines: dict[str, tuple[list[int], list[str], str]] = {}
    for step, ev in run.step_events():
        for e in notes(ev, "graph_copy"):
            steps, params, op = lines.setdefault(str(e.get("src") or ""), ([], [], str(e.get("op") or "")))
            steps.append(step)
            params.append(str(e.get("param") or ""))
    findings: list[Finding] = []
    for src, (seen, params, op) in lines.items():
        where = f"`{op}` at {src}" if src else f"`{op}`"
        # (said once a line) the copy carries its graph from then on, each update making it longer
        steps = list(range(seen[0], max(run.last_step, seen[-1]) + 1))
        what = (f"Copies of the parameters ({params[0]!r} and the others that call updates at once) are updated "
                "from them" if op.startswith("_foreach") else f"A copy of parameter {params[0]!r} is updated from it")
        message = (f"{what} while autograd records ({where}, outside "
                   "torch.no_grad()): the copy -- an EMA or a target network -- now carries a graph back to the "
                   "model's parameters, and every update makes it longer: memory and time grow step after step, "
                   "and a loss computed from the copy backpropagates into the model.")
        findings.append(make("P7", "error", message, FIX_COPY, steps, rank=run.rank, src=src or None,
                             params=params, targets=[FindingTarget(step=steps[0], rank=run.rank, param=params[0])],
                             view="memory", title="Copy of the weights updated with autograd on"))
    return findings


def check_hooks(run: Run, settings: Settings) -> list[Finding]:
    per_module: dict[str, list[tuple[int, int]]] = {}
    for step, ev in run.step_events():
        for module, held in as_dict(ev.get("hooks")).items():
            per_module.setdefault(str(module), []).append((step, as_int(held)))
    # the latest groups of modules whose hooks share one container, and each hook's line
    shared: dict[str, list[str]] = {}
    src: dict[str, str] = {}
    for _, ev in run.step_events():
        for group in as_list(ev.get("hooks_shared")):
            members = [str(m) for m in as_list(group)]
            if members:
                shared[members[0]] = members
        src.update({str(k): str(v) for k, v in as_dict(ev.get("hooks_src")).items()})
    findings: list[Finding] = _hooks_read_changed(run, src)
    for module, series in per_module.items():
        grow = _growing(series, 1, settings.growth_steps)
        big = [s for s, b in series if b >= settings.hook_bytes]
        steps = grow or big
        if not steps:
            continue
        last = series[-1][1]
        modules = shared.get(module, [module])
        names = [repr(m) if m else "the root module" for m in modules]
        where = and_list(names)
        held = "" if len(modules) == 1 else " (in one container their hooks share)"
        how = "grow every step" if grow else "stay large"
        message = (f"Hooks on {where} keep {fmt_bytes(last)} of tensors (activations or gradients) alive{held} and {how} "
                   f"({describe_steps(steps, run.last_step)}).")
        findings.append(make("P13", "warning", message, FIX_P13, steps, rank=run.rank,
                             targets=[FindingTarget(step=steps[0], rank=run.rank, module=m) for m in modules],
                             modules=modules, view="memory", src=src.get(module) or None,
                             data={"bytes": [b for _, b in series], "steps": [s for s, _ in series]}))
    return findings


def _hooks_read_changed(run: Run, src: dict[str, str]) -> list[Finding]:
    """Hooks that keep a module output an in-place op changed after the module's forward
    (``events[{what: "hook_kept_changed"}]``): what they read later is not what the module output."""
    steps: dict[str, list[int]] = {}
    for step, ev in run.step_events():
        for note in notes(ev, "hook_kept_changed"):
            for module in as_list(note.get("modules")):
                steps.setdefault(str(module), []).append(step)
    findings: list[Finding] = []
    for module, at in steps.items():
        name = repr(module) if module else "the root module"
        kind = run.module_type(module)
        message = (f"A forward hook on {name}{f' ({kind})' if kind else ''} keeps the module's output, and an in-place "
                   f"op later in the forward changed it ({describe_steps(at, run.last_step)}): what the hook kept is "
                   "not what the module output (an `nn.ReLU(inplace=True)` or `x += ...` after it writes into the "
                   "same storage).")
        findings.append(make("P13", "warning", message, FIX_CHANGED, at, rank=run.rank, modules=[module],
                             targets=[FindingTarget(step=at[0], rank=run.rank, module=module)], src=src.get(module) or None,
                             title="Module hook reads values changed in place"))
    return findings
