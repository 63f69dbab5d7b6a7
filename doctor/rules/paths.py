"""P1 (a parameter's path to the loss is cut) and P9 (a non-differentiable op on the loss path).

Both walk the op dataflow of a captured step: P1 forward from the ops that read the
parameter to the first op where gradient cannot pass, P9 backward from the loss to the first
op that cannot be differentiated.  (A backward() on a loss without grad_fn: loss_cut.py.)
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from torchscope.schema import Finding, FindingTarget

from .. import graph as g
from ..finding import Severity, describe_steps, list_steps, make
from ..run import Run, as_dict, as_int, as_list, capture_hint, cleared_at, errors, leaf_loss, notes, trainable
from ..settings import Settings

_CUT_FIX = ("Keep the path differentiable: don't call .detach()/.data/.item()/.numpy()/.tolist() on tensors the "
            "loss depends on, nor copy them with torch.tensor(t) or x.new_tensor(t) (t is a tensor already: use "
            "it, or t.to(dtype)), and don't run the training forward under torch.no_grad(); if the parameter is "
            "meant to stay fixed, set requires_grad_(False).")
# A forward op run with grad mode off inside a forward that had it on: a no_grad block, or
# reentrant activation checkpointing, which runs its function under no_grad and gives it
# gradients only through inputs that require grad (frozen embeddings feeding it: none do).
_DISCRETE_FIX = ("A discrete choice (argmax, one_hot, round, a comparison) has no gradient. To keep it in the forward "
                 "and train what comes before it, pass the gradient straight through: hard = F.one_hot(y.argmax(-1), K)"
                 ".float(); z = hard - y.detach() + y (or F.gumbel_softmax(logits, tau, hard=True)); for a rounding "
                 "quantiser, x + (x.round() - x).detach(). Or train on the soft values (a softmax) instead.")
_SAMPLE_FIX = ("Draw it with dist.rsample() (the reparameterized sample: mu + sigma * eps, eps ~ N(0, 1), "
               "differentiable in mu and sigma) instead of dist.sample(), which runs under torch.no_grad(); written "
               "by hand, z = mu + std * torch.randn_like(std) outside no_grad. A discrete distribution (Categorical, "
               "Bernoulli) has no rsample(): train through log_prob(sample) times a reward (REINFORCE) or a relaxed "
               "sample (RelaxedOneHotCategorical, F.gumbel_softmax).")
_NO_GRAD_FIX = ("Run these layers with grad enabled: remove the torch.no_grad() around them; under "
                "torch.utils.checkpoint(..., use_reentrant=True) an input of the checkpointed function must require "
                "grad -- pass use_reentrant=False (transformers: model.enable_input_require_grads()). If they are "
                "meant to stay fixed, leave them out of the optimizer or set requires_grad_(False).")


def _forward_ops(graph: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for op in g.ops(graph) if op.get("phase", "forward") == "forward"]


def copied_params(run: Run, graph: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Parameters whose place the forward's ops in their module gave to tensors of their shapes
    that are not them (a norm's weight and bias share one), each with the first such op: copies
    that carry no gradient (``functional_call(model, {k: v.detach() ...})``, ``p.data``) or new
    leaves (``v.detach().requires_grad_()``: each backward fills the copy's ``.grad``)."""
    shapes: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for i, p in enumerate(run.params):
        shapes.setdefault((run.param_module(i), tuple(as_int(d) for d in as_list(p.get("shape")))), []).append(run.param_name(i))
    tensors = {as_int(t.get("id"), -1): t for t in as_list(graph.get("tensors")) if isinstance(t, dict)}
    copies: dict[str, dict[str, Any]] = {}
    for op in _forward_ops(graph):
        if "outside_model" in g.flags(op):
            continue
        for tid in as_list(op.get("inputs")):
            t = tensors.get(as_int(tid, -1), {})
            if t and "param" not in t and (not t.get("requires_grad") or t.get("is_leaf") is True):
                for name in shapes.get((str(op.get("module", "")), tuple(as_int(d) for d in as_list(t.get("shape")))), []):
                    copies.setdefault(name, op)
    return copies


_COPIES_FIX = ("Hand the forward the parameters themselves: for torch.func.functional_call, "
               "dict(model.named_parameters()) (not {k: v.detach() ...}); in a forward of your own, the parameter, "
               "not its .data or a copy.")


# the dispatcher's own detach: a copy constructor's (torch.tensor(t), t.new_tensor(t)) where no
# marker of the function mode names the call
_DETACHES = frozenset({"aten::detach", "aten::detach_"})
# the function mode's markers of a cut the user wrote: .detach(), .data, torch.tensor(t)
_USER_CUTS = frozenset({"breaks_graph", "new_leaf"})


def _is_cut(op: dict[str, Any], detach: bool = True) -> bool:
    return ((op.get("grad_mode") is False and not _compiled(op)) or op.get("inference_mode") is True
            or bool(g.flags(op) & g.BREAK_FLAGS) or (detach and op.get("name") in _DETACHES))


def _compiled(op: dict[str, Any]) -> bool:
    """An op of a torch.compile'd forward (FX's generated code, ``<eval_with_key>.3:12``): AOTAutograd
    runs it with grad mode off inside an autograd.Function whose output carries a grad_fn all
    the same -- no cut."""
    return str(op.get("src", "")).startswith("<eval_with_key>")


def break_op(graph: dict[str, Any], param: str) -> tuple[dict[str, Any], bool]:
    """(op, used): the first op after which `param`'s dataflow carries no gradient; used=False if never read."""
    fwd = _forward_ops(graph)
    ids = g.param_tensor_ids(graph, param)
    readers = [op for op in fwd if ids & {as_int(t, -1) for t in as_list(op.get("inputs"))}]
    if not readers:
        return {}, False
    # a forward run under no_grad as well (an RL rollout choosing actions, a TD target, an
    # evaluation) is no path the gradient could have taken: where the training forward's
    # path breaks is the cut (a .detach() on the critic's value), not that block
    graded = [op for op in readers if op.get("grad_mode") is not False and op.get("inference_mode") is not True]
    flow = g.downstream(fwd, graded or readers)
    # the function mode's marker of the user's call (it follows the detach it made) first
    cut = [op for op in flow if _is_cut(op, detach=False)] or [op for op in flow if _is_cut(op)]
    if cut:
        # a check read back to Python (torch.distributions' argument validation, ``mu == mu``
        # and ``scale > 0`` through _is_all_true and .item(); a metric under no_grad) cuts
        # nothing on the way to the loss (QA 53a: Normal(...).sample() named aten::eq)
        cut = _off_the_loss_path(graph, fwd, cut) or cut
    if cut and cut[0].get("grad_mode") is False and _cut_later(graph, fwd, cut[0]):
        # An autograd.Function runs its forward with grad mode off -- a custom one, or the
        # BackwardHookFunction a full backward hook (Opacus, captum) wraps a module's output in --
        # and its output carries a grad_fn all the same: the explicit cut the user made after it
        # (a recorded .detach(), .data) is where the path really breaks.  (After a real no_grad
        # block such a cut must go too: it is named first, the block on the next run.)
        cut = [op for op in g.downstream(fwd, [cut[0]]) if op.get("grad_mode") is not False
               and g.flags(op) & _USER_CUTS] or cut
    if len(cut) > 1:
        # a detached coefficient of a tensor that carries a gradient (an advantage times the
        # log-probabilities, a target) is meant; a cut whose readers get no gradient from
        # anything else (mse_loss(v.detach(), target): the whole term) is where it is lost
        coefficient = _coefficients(graph, fwd)
        cut = [op for op in cut if as_int(op.get("id"), -1) not in coefficient] or cut
    # With no flagged op, the path ends where the dataflow stops: point at its last op.
    if cut and cut[0].get("grad_mode") is False:
        # a no_grad block that draws a sample (torch.distributions' .sample() runs under
        # no_grad): the draw is the cut, not the block's first op (an expand of its arguments)
        return _drawn_in(fwd, cut[0]) or cut[0], True
    return (cut[0] if cut else flow[-1]), True


# a random draw: torch.distributions' .sample() makes one under no_grad (Normal, LogNormal: normal;
# Gamma, Beta, Dirichlet: _standard_gamma, _sample_dirichlet; Categorical: multinomial ...)
_DRAWS = frozenset(f"aten::{n}" for n in (
    "normal", "bernoulli", "multinomial", "poisson", "binomial", "_standard_gamma", "_sample_dirichlet",
    "exponential", "uniform", "geometric", "cauchy", "log_normal", "random", "randint_like", "randn_like",
    "rand_like"))
# ops that take a value back to Python (``.item()``, ``if t:``)
_READ_BACK = frozenset({"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero"})


def _drawn_in(fwd: list[dict[str, Any]], op: dict[str, Any]) -> dict[str, Any] | None:
    """The first random draw of the no_grad ops on ``op``'s line run with it (the stretch of
    grad-mode-off ops around it), or None."""
    at = next((i for i, o in enumerate(fwd) if o is op), -1)
    if at < 0:
        return None

    def inside(o: dict[str, Any]) -> bool:
        return o.get("grad_mode") is False and o.get("src") == op.get("src")

    lo = at
    while lo > 0 and inside(fwd[lo - 1]):
        lo -= 1
    hi = at
    while hi + 1 < len(fwd) and inside(fwd[hi + 1]):
        hi += 1
    return next((o for o in fwd[lo:hi + 1] if str(o.get("name", "")).rstrip("_") in _DRAWS), None)


def _off_the_loss_path(graph: dict[str, Any], fwd: list[dict[str, Any]], cut: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``cut`` less the ops whose results only go back to Python (every op they feed, and on,
    ends in a read-back: ``.item()``, ``bool(t)``) and never reach the loss: a check, not the
    path.  A cut the user wrote (``.detach()``, ``.item()`` on the path) stays.  One pass over
    the ops, last to first (they are in execution order)."""
    loss = as_int(g.loss_op(graph).get("id"), -1)
    if loss < 0:
        return cut
    readers = g.consumers(fwd)
    read_back: dict[int, bool] = {}
    for op in reversed(fwd):
        oid = as_int(op.get("id"), -1)
        if oid == loss:
            read_back[oid] = False
        elif op.get("name") in _READ_BACK:
            read_back[oid] = True
        else:
            users = [as_int(r.get("id"), -1) for t in as_list(op.get("outputs")) for r in readers.get(as_int(t, -1), [])
                     if as_int(r.get("id"), -1) > oid]
            read_back[oid] = bool(users) and all(read_back.get(u, False) for u in users)
    return [op for op in cut if g.flags(op) & _USER_CUTS or not read_back.get(as_int(op.get("id"), -1), False)]


def _coefficients(graph: dict[str, Any], fwd: list[dict[str, Any]]) -> set[int]:
    """The ops whose every output is read only beside a tensor that requires grad: a detached
    factor of a term that still carries a gradient."""
    grads = {as_int(t.get("id"), -1) for t in as_list(graph.get("tensors"))
             if isinstance(t, dict) and t.get("requires_grad")}
    readers = g.consumers(fwd)
    out: set[int] = set()
    for op in fwd:
        outs = [as_int(t, -1) for t in as_list(op.get("outputs"))]
        uses = [r for t in outs for r in readers.get(t, [])]
        if uses and all(any(as_int(t, -1) in grads and as_int(t, -1) not in outs for t in as_list(r.get("inputs")))
                        for r in uses):
            out.add(as_int(op.get("id"), -1))
    # the function mode's marker of a .detach() the user wrote (no outputs) goes with the
    # dispatcher's detach right after it, of the same input
    for marker, nxt in zip(fwd, fwd[1:], strict=False):
        if g.flags(marker) & _USER_CUTS and nxt.get("name") in _DETACHES and nxt.get("inputs") == marker.get("inputs") \
                and as_int(nxt.get("id"), -1) in out:
            out.add(as_int(marker.get("id"), -1))
    return out


def _cut_later(graph: dict[str, Any], fwd: list[dict[str, Any]], op: dict[str, Any]) -> bool:
    """Whether every path from ``op`` to the loss goes through an explicit cut (``.detach()``):
    the loss is downstream of ``op``, and no longer is once the detaches are left out.  A
    ``.item()`` taken off to the side of a no_grad block's output cuts nothing on its path."""
    loss = as_int(g.loss_op(graph).get("id"), -1)
    if loss < 0 or loss not in {as_int(o.get("id"), -1) for o in g.downstream(fwd, [op])}:
        return False
    uncut = [o for o in fwd if o.get("name") not in _DETACHES and not g.flags(o) & _USER_CUTS]
    return loss not in {as_int(o.get("id"), -1) for o in g.downstream(uncut, [op])}


def _none_steps(run: Run) -> tuple[dict[int, list[int]], dict[int, int]]:
    """(param index -> steps on which its .grad was None at optimizer.step(), param index ->
    how many steps with a backward it did get a gradient on)."""
    n_trainable = trainable(run)
    failed = {e.step for e in errors(run)}
    out: dict[int, list[int]] = {}
    got: dict[int, int] = {}
    for step, ev in run.step_events():
        if as_int(ev.get("micro_batches"), 1) == 0 or step in failed:
            continue  # no backward ran (or it raised): P8/P10 explain it, not a cut path
        grads = as_dict(ev.get("grads"))
        for i, v in enumerate(as_list(grads.get("norm"))):
            if v is not None:
                got[i] = got.get(i, 0) + 1
        # a parameter no optimizer updates (a backbone run under no_grad) needs no gradient
        none = sorted({as_int(i, -1) for i in as_list(grads.get("none"))}
                      - {as_int(i, -1) for i in as_list(grads.get("not_trained"))} - {-1})
        if not none:
            continue
        if n_trainable and len(none) >= n_trainable and as_int(ev.get("zero_grad")) > 0 and not run.cut_before_model(step, ev):
            continue  # every grad cleared after backward: misplaced zero_grad (P5)
        for i in none:
            out.setdefault(i, []).append(step)
    return out, got


def _same_structure(run: Run, index: int, steps: list[int]) -> bool:
    """Whether every step on which parameter ``index`` got no gradient built a graph of a
    structure (``graph_signature``) that other steps built while it got one."""
    without = set(steps)
    sigs: dict[int, str] = {}
    with_grad: set[str] = set()
    for step, ev in run.step_events():
        sig = ev.get("graph_signature")
        if not isinstance(sig, str) or not sig:
            continue
        sigs[step] = sig
        norms = as_list(as_dict(ev.get("grads")).get("norm"))
        if step not in without and index < len(norms) and norms[index] is not None:
            with_grad.add(sig)
    return bool(with_grad) and all(sigs.get(step) in with_grad for step in without)


def _stood_in(run: Run, index: int, steps: list[int], graded: dict[int, set[int]]) -> bool:
    """Whether, on every step on which parameter ``index`` got no gradient, the same parameter
    of another member of a ``ModuleList`` (``experts.2.0.weight`` -> ``experts.5.0.weight``)
    got one (``graded``: step -> the parameters with a gradient): a router picked another
    expert, a layer drop kept another layer.  What light mode, with no graph to read, can tell
    of a path chosen per step (QA 47b: a warning on every mixture-of-experts run); a cut in the
    loop takes the siblings' gradients with it."""
    if _lost_for_good(run, steps):
        return False  # lost for good (a member cut from some step on, a collapsed router): no choice per step (QA 48c)
    return any(all(not graded.get(step, set()).isdisjoint(same) for step in steps)
               for _, same in run.list_siblings(index))


def _lost_for_good(run: Run, steps: list[int]) -> bool:
    """Whether the steps a parameter got no gradient on are every step from one on to the run's
    last, three at least."""
    return len(steps) > 2 and steps == list(range(steps[0], run.last_step + 1))


def _gone_since(run: Run, steps: list[int]) -> int | None:
    """The step from which a parameter got no gradient on any step to the run's end, when that
    lasts three steps and more than twice its longest gap before (an expert the router stopped
    picking, not one it picks now and then), else None."""
    if not steps or steps[-1] != run.last_step:
        return None
    start = len(steps) - 1
    while start > 0 and steps[start - 1] == steps[start] - 1:
        start -= 1
    tail = len(steps) - start
    longest, run_len = 0, 0
    for k in range(start):
        run_len = run_len + 1 if k and steps[k - 1] == steps[k] - 1 else 1
        longest = max(longest, run_len)
    return steps[start] if tail >= 3 and tail > 2 * longest else None


def _split_for_good(run: Run, groups: dict[_GroupKey, list[int]],
                    steps_of: dict[int, list[int]]) -> list[tuple[_GroupKey, list[int], dict[int, list[int]]]]:
    """Each group, its parameters lost for good told apart (by the step they were lost at, and
    with their steps since then) from those missing on some steps: an expert the router no
    longer picks beside ones it picks now and then (QA 48c: one info for both)."""
    out: list[tuple[_GroupKey, list[int], dict[int, list[int]]]] = []
    for key, indices in groups.items():
        since: dict[int, list[int]] = {}
        rest = []
        for i in indices:
            at = _gone_since(run, steps_of[i])
            if at is None:
                rest.append(i)
            else:
                since.setdefault(at, []).append(i)
        if rest:
            out.append((key, rest, steps_of))
        for at, gone in since.items():
            out.append((key, gone, {i: list(range(at, run.last_step + 1)) for i in gone}))
    return out


def graded_steps(run: Run) -> dict[int, set[int]]:
    """Step -> the parameters whose gradient norm was recorded (not None) at optimizer.step()."""
    return {step: {i for i, v in enumerate(as_list(as_dict(ev.get("grads")).get("norm"))) if v is not None}
            for step, ev in run.step_events()}


def _graph_near(run: Run, steps: list[int]) -> tuple[int, dict[str, Any]]:
    """A captured graph of one of ``steps`` (where the parameter got no gradient), or none: a
    graph of another step, where it may well have got one, would name a break that is not
    there (a mixture-of-experts expert idle at step 1 'breaking' at the loss of step 0)."""
    for step in steps:
        # a graph with ops: a step the capture could not record op by op (its first, when the
        # loop calls the model's submodules directly) holds none, and would say "never used"
        graphs = [graph for graph in run.graphs_of(step) if _forward_ops(graph)]
        if graphs:
            return step, graphs[0]
    return -1, {}


_GroupKey = tuple[str, int, bool, bool]
_CLEARED = "cleared after backward"  # the group of parameters whose AccumulateGrad ran (_cut_groups)
_UNREACHED = "not in the graph"  # light mode: the walked graph holds no AccumulateGrad of theirs
_FUNCTION_NONE = "None from "  # + the custom autograd.Function's node: its backward returned None for them


def _custom_function(name: str) -> bool:
    """A grad_fn of a Python ``autograd.Function``: ``<ClassName>Backward``, where PyTorch's own
    end in a digit (``AddmmBackward0``); torch.compile's region and a full backward hook's
    wrapper pass every gradient on."""
    return name.endswith("Backward") and name not in ("CompiledFunctionBackward", "BackwardHookFunctionBackward")


def _none_from_function(graph: dict[str, Any], param: str) -> str:
    """The custom Function node whose backward returned None for ``param``, or "": the backward
    ran the parameter's AccumulateGrad (so the engine reached it), only such nodes lead to it,
    and yet its .grad was None at step() (QA 42a: a Swish whose backward returned ``gx, None``
    for its learnable beta read as a no_grad block at its forward's first op)."""
    acc = g.accumulate_node(graph, param)
    if "order" not in acc:
        return ""
    me = as_int(acc.get("id"), -1)
    names = {as_int(n.get("id"), -1): str(n.get("name", "")) for n in as_list(graph.get("nodes")) if isinstance(n, dict)}
    into = {names.get(a, "") for a, kids in g.node_children(graph).items() if me in kids}
    return next(iter(into)) if len(into) == 1 and all(map(_custom_function, into)) else ""


def _cut_groups(run: Run) -> tuple[dict[_GroupKey, list[int]], dict[_GroupKey, tuple[int, dict[str, Any]]],
                                   dict[int, list[int]], dict[int, int]]:
    """The parameters whose .grad was None at optimizer.step(), grouped by where their path to
    the loss breaks: (break op label, op id, used, whether it got a gradient on other steps) ->
    param indices; each group's (graph step, break op); ``_none_steps``'s two maps."""
    groups: dict[_GroupKey, list[int]] = {}
    steps_of, got = _none_steps(run)
    where: dict[_GroupKey, tuple[int, dict[str, Any]]] = {}
    walked, through = _walked(run)
    for index, steps in steps_of.items():
        gstep, graph = _graph_near(run, steps)
        op, used = break_op(graph, run.param_name(index)) if graph else ({}, True)
        if not used and graph.get("complete") is False:
            used = True  # ops were shed: the parameter may be read in those not recorded
        sometimes = got.get(index, 0) > 0
        reached = [index not in walked[s] for s in steps if s in walked] if not graph else []
        if reached and all(reached):
            # light mode: the backward's graph held its AccumulateGrad on the steps it walked --
            # reached through a custom Function only, that Function's backward returned None
            fns = {through.get(s, {}).get(index, "") for s in steps if s in walked}
            fn = fns.pop() if len(fns) == 1 else ""
            key = (_FUNCTION_NONE + fn, -1, used, sometimes) if _custom_function(fn) else (_CLEARED, -1, used, sometimes)
        elif reached:
            key = (_UNREACHED, -1, used, sometimes)  # not in the graph: unused, or cut
        elif graph and (fn := _none_from_function(graph, run.param_name(index))):
            key = (_FUNCTION_NONE + fn, -1, used, sometimes)
        elif op and not _is_cut(op) and not _stops_gradient(op) and "order" in g.accumulate_node(graph, run.param_name(index)):
            # nothing cuts its dataflow and the backward ran its AccumulateGrad: it got a gradient,
            # cleared before optimizer.step() (``p.grad = None``) -- no cut, no dead end.  (One
            # reached only through a custom Function that returned None for it: the branch above.)
            key = (_CLEARED, -1, used, sometimes)
        elif op and op.get("grad_mode") is False:
            # one no_grad block cuts every parameter in it, each at its own first op: one
            # finding per block (its source line), shown at its earliest op
            key = (f"no_grad {op.get('src', '')}", -1, used, sometimes)
            if key in where and as_int(where[key][1].get("id"), -1) <= as_int(op.get("id"), -1):
                gstep, op = where[key]
        elif op and op.get("src"):
            # the same cut on one line -- ``torch.tensor([o.tolist() for o in outs])`` cuts each
            # head at its own op -- is one finding, shown at its earliest op (QA 46a: three)
            key = (f"{g.op_label(op, run)} {op['src']}", -1, used, sometimes)
            if key in where and as_int(where[key][1].get("id"), -1) <= as_int(op.get("id"), -1):
                gstep, op = where[key]
        else:
            key = (g.op_label(op, run) if op else "", as_int(op.get("id"), -1) if op else -1, used, sometimes)
        groups.setdefault(key, []).append(index)
        where[key] = (gstep, op)
    return groups, where, steps_of, got


def _walked(run: Run) -> tuple[dict[int, set[int]], dict[int, dict[int, str]]]:
    """Light mode's steps whose backward graph it walked (the first, a changed structure): step
    -> the trainable parameters that graph does not reach (``events[{what: "unreached"}]``);
    and step -> the reached ones it reaches through one custom Function only -> its name."""
    out: dict[int, set[int]] = {}
    through: dict[int, dict[int, str]] = {}
    for step, ev in run.step_events():
        for e in notes(ev, "unreached"):
            out[step] = out.get(step, set()) | {as_int(i, -1) for i in as_list(e.get("params"))}
            for pair in as_list(e.get("through")):
                if isinstance(pair, list) and len(pair) == 2:
                    through.setdefault(step, {})[as_int(pair[0], -1)] = str(pair[1])
    return out, through


def unreached_by_step(run: Run) -> dict[int, set[int]]:
    """Step -> the trainable parameters its backward did not reach, wherever a graph of the same
    structure (``graph_signature``) tells: a captured graph's AccumulateGrad nodes, light mode's
    walked steps.  A multi-task loop's heads take turns: the idle one's backward graph has no
    node of it, on every step of that structure, captured or not.  Only steps of one structure:
    a step whose backward passes differ (a critic's loss, then the policy's: "sig1+sig2") has
    its first pass's graph captured, which tells nothing of the others."""
    by_sig: dict[str, set[int]] = {}
    sig_of = {step: sig for step, ev in run.step_events() if "+" not in (sig := str(ev.get("graph_signature") or ""))}
    names = {run.param_name(i): i for i in range(len(run.params))}
    trainable_ids = {i for i, p in enumerate(run.params) if p.get("requires_grad", True)}
    for step, graph in run.all_graphs():
        sig = sig_of.get(step, "")
        if sig and sig not in by_sig and as_int(graph.get("micro")) == 0 and as_list(graph.get("nodes")):
            reached = {names[str(n.get("param"))] for n in as_list(graph.get("nodes"))
                       if isinstance(n, dict) and str(n.get("param")) in names}
            by_sig[sig] = trainable_ids - reached
    for step, unreached in _walked(run)[0].items():
        by_sig.setdefault(sig_of.get(step, ""), unreached)
    by_sig.pop("", None)
    return {step: by_sig[sig] for step, sig in sig_of.items() if sig in by_sig}


def _unreached_steps(run: Run) -> tuple[list[int], list[str], str]:
    """The steps on which no backward reached the model at all while its optimizer stepped, the
    lines of their forwards, and how those forwards lost the graph: ``micro_batches`` 0, every
    trainable parameter the optimizer holds without ``.grad`` at ``optimizer.step()``, and a
    training forward that built a graph no backward used, from a line whose forwards no
    backward ever used (a batch skipped now and then is P6's) -- "unused" -- or, with none
    such, one that built no graph at all: run under ``no_grad`` ("no_grad"), or whose output
    was rebuilt from Python values (``torch.tensor([o.tolist() ...])``: "no_graph").  A GAN's
    generator loss made from ``D(fake.detach())``: ``_none_steps`` leaves such steps out (no
    backward, no cut path to walk), and P6 told an unused graph, to be put under ``no_grad``
    -- which keeps the generator from ever learning (QA 44b).  The loss still had a graph
    through a parameter outside the model (a learned temperature, a bias added to its output)
    when its backward ran without an error: "no problems found" (QA 46a)."""
    n = trainable(run)
    failed = {e.step for e in errors(run)}
    trained = {f.get("src") for _, ev in run.step_events() for f in map(as_dict, as_list(ev.get("forwards")))
               if f.get("backward") is True}
    steps: list[int] = []
    srcs: list[str] = []
    kinds: list[str] = []
    for step, ev in run.step_events():
        if as_int(ev.get("micro_batches"), 1) != 0 or step in failed or not ev.get("step_src") or not n:
            continue
        grads = as_dict(ev.get("grads"))
        none = {as_int(i, -1) for i in as_list(grads.get("none"))} - {as_int(i, -1) for i in as_list(grads.get("not_trained"))}
        if len(none - {-1}) < n:
            continue
        fwds = [f for f in map(as_dict, as_list(ev.get("forwards")))
                if f.get("training") is not False and f.get("src") and f.get("src") not in trained]
        unused = [str(f["src"]) for f in fwds if f.get("built_graph") is True and f.get("backward") is False]
        # (the last first: a training forward after a logging one in the same no_grad block, QA 46a)
        cut = [] if unused else [(str(f["src"]), "no_grad" if f.get("grad_mode") is False or f.get("inference_mode") else "no_graph")
                                 for f in reversed(fwds) if f.get("built_graph") is False]
        if unused or cut:
            steps.append(step)
            srcs += unused or [src for src, _ in cut]
            kinds += ["unused"] * len(unused) or [kind for _, kind in cut]
    # on most steps: a loop that steps without a backward now and then is something else
    if len(steps) < 2 or 2 * len(steps) < len(run.steps):
        return [], [], ""
    if kinds[0] != "unused" and any(step > steps[-1] and as_int(ev.get("micro_batches")) > 0
                                    for step, ev in run.step_events()):
        # a backbone run under no_grad for a warm-up, then fine-tuned: it trains (QA 46d)
        return [], [], ""
    first = [src for src, kind in zip(srcs, kinds, strict=True) if kind == kinds[0]]
    return steps, list(dict.fromkeys(first)), kinds[0]


_FORWARD_NO_GRAD_FIX = ("Run the training forward outside torch.no_grad() / torch.inference_mode(): keep only "
                        "evaluation or logging forwards in that block.")
_UNREACHED_FIX = ("Compute the loss that trains this model from its output with the graph intact -- no .detach(), "
                  ".data or .item() on the way: a GAN's generator loss is criterion(D(fake), real_labels), and "
                  "fake.detach() belongs only in the discriminator's loss.")


def _unreached_model(run: Run) -> list[Finding]:
    steps, srcs, kind = _unreached_steps(run)
    if not steps:
        return []
    model = str(run.session.get("model") or "the model")
    message = (f"No backward() reached {model}: none of its {trainable(run)} trainable parameters had a gradient at "
               f"optimizer.step() ({describe_steps(steps, run.last_step)}), though ")
    fix = _UNREACHED_FIX
    if kind == "unused":
        message += (f"its forward at {srcs[0]} built an autograd graph -- no backward() used it. The loss was computed "
                    "from a detached copy of its output (.detach(), .data, .item()), so optimizer.step() skips every "
                    "parameter and the model never trains.")
    else:
        at = ", ".join(srcs[:2])
        message += (f"its forward at {at} ran under torch.no_grad() (or inference_mode): it built no autograd graph"
                    if kind == "no_grad" else
                    f"its forward at {at} returned an output with no autograd graph: the model rebuilt it from Python "
                    "values or cut it inside (torch.tensor(x.tolist()), .item(), numpy, .detach())")
        message += (". The loss still had a graph through parameters outside the model, so backward() raised no "
                    "error, but optimizer.step() skips every parameter of the model and it never trains.")
        fix = (_FORWARD_NO_GRAD_FIX if kind == "no_grad" else
               "Keep the model's output a tensor of its graph: combine its parts with torch ops (torch.stack, torch.cat, "
               "mean) rather than Python lists, .tolist(), .item() or numpy.")
    return [make("P1", "error", message, fix, steps, rank=run.rank,
                 targets=[FindingTarget(step=steps[0], rank=run.rank, module="")], modules=[""],
                 params=[run.param_name(i) for i, p in enumerate(run.params) if p.get("requires_grad", True)],
                 src=srcs[0], view="gradients", title="No backward reaches the model")]


def cut_steps(run: Run) -> set[int]:
    """The steps on which a parameter got no gradient because its path to the loss breaks at a
    cut (a detach, a no_grad block, a non-differentiable op): a forward whose output the loss
    reaches only through the cut goes unused by the backward (P6 leaves it to P1/P9), and those
    on which no backward reached the model (``_unreached_steps``)."""
    groups, where, steps_of, _ = _cut_groups(run)
    out: set[int] = set(_unreached_steps(run)[0])
    for key, indices in groups.items():
        op = where[key][1]
        if op and (_is_cut(op) or _stops_gradient(op)):
            out.update(s for i in indices for s in steps_of[i])
    return out


def _op_key(op: dict[str, Any]) -> tuple[str, str, str]:
    return str(op.get("name", "")), str(op.get("module", "")), str(op.get("src", ""))


def check_cut_paths(run: Run, settings: Settings) -> list[Finding]:
    """P1: trainable parameters whose .grad is still None at optimizer.step()."""
    groups, where, all_steps, got = _cut_groups(run)
    told = set(_non_differentiable(run))  # a non-differentiable op P9 names: told there, with these parameters
    graded = graded_steps(run)
    findings: list[Finding] = []
    for key, indices, steps_of in _split_for_good(run, groups, all_steps):
        gstep, op = where[key]
        if op and _stops_gradient(op) and _op_key(op) in told:
            continue
        names = [run.param_name(i) for i in indices]
        steps = sorted({s for i in indices for s in steps_of[i]})
        severity, message, fix = _cut_text(run, key, names, steps, op,
                                           [len(steps_of[i]) for i in indices], [got.get(i, 0) for i in indices],
                                           all(_same_structure(run, i, steps_of[i]) for i in indices),
                                           higher_order_step(run, gstep),
                                           all(_stood_in(run, i, steps_of[i], graded) for i in indices))
        targets: list[FindingTarget] = [FindingTarget(step=steps[0], rank=run.rank, param=n, module=run.param_module(i))
                                        for n, i in zip(names, indices, strict=True)]
        if op:
            targets.insert(0, FindingTarget(**g.target_of_op(gstep, run.rank, op)))  # type: ignore[typeddict-item]
        src = str(op.get("src", "")) if op else None
        if key[0] == _CLEARED:
            # the line that set .grad to None (or zeroed it) after the backward, where the capture
            # saw it; the forward's line told nothing (QA 46d)
            src = cleared_at(run, steps) or src
        findings.append(make("P1", severity, message, fix, steps, rank=run.rank, targets=targets,
                             modules=sorted({run.param_module(i) for i in indices}), params=names,
                             src=src,
                             data={"break_op": g.op_label(op, run) if op else "", "graph_step": gstep},
                             title="Gradient cleared before optimizer.step()" if key[0] == _CLEARED else None))
    return findings + _unreached_model(run)


def higher_order_step(run: Run, step: int) -> bool:
    """Whether a graph of ``step`` holds nodes a create_graph=True backward made: its loss is
    made of gradients."""
    return any(n.get("higher_order") for graph in run.graphs_of(step) for n in as_list(graph.get("nodes"))
               if isinstance(n, dict))


_GRADIENT_LOSS_FIX = ("Nothing to fix: the optimizer skips a parameter whose .grad is None, and the bias trains "
                      "wherever another loss uses the output itself; if none does, it can be dropped (bias=False).")
_UNUSED_FIX = ("Call the layer in forward() if the model is meant to use it (a layer defined in __init__ and "
               "forgotten, or a branch that never runs); otherwise remove it: its parameters never change (the "
               "optimizer skips a parameter whose .grad is None) and only weigh on memory and checkpoints.")
_DEAD_END_FIX = ("Add the missing term to the loss (an auxiliary head's loss forgotten: loss = main_loss + "
                 "aux_weight * aux_loss); if that output is only for monitoring, compute it under torch.no_grad() "
                 "or leave its layer out of the optimizer.")
_CLEARED_FIX = ("If they are frozen on purpose, call requires_grad_(False) on them (or leave them out of the "
                "optimizer): backward() then stops computing gradients that are thrown away. If they should train, "
                "clear gradients before loss.backward() or after optimizer.step(), never between them.")
_CLEARERS = "p.grad = None, or a zero_grad() placed after backward()"
_WARMUP_FIX = ("Nothing to fix if freezing them for the first steps is meant; otherwise clear gradients before "
               "loss.backward() or after optimizer.step(), never between them.")
_FUNCTION_NONE_FIX = ("Return a gradient from the Function's backward() for every input of its forward() that requires "
                      "grad, in the forward's order (None only for those that need none; "
                      "ctx.needs_input_grad[i] says which); torch.autograd.gradcheck checks it against finite differences.")
_VARYING = ("a path that changes from step to step (layer drop, early exit, a mixture-of-experts expert no "
            "token was routed to)")
_GONE_FIX = ("If a router stopped choosing it, balance the experts' load (an auxiliary load-balancing loss, router "
             "noise, a capacity factor); if the branch is switched off on purpose (a warm-up head), take its parameters "
             "out of the optimizer; if the loop cuts it from that step on (a .detach()), remove the cut.")
_VARYING_FIX = ("Nothing to fix if the model picks its path per step: the optimizer skips a parameter whose .grad "
                "is None (no update, momentum or weight decay for it that step). If these layers should run on "
                "every step, check the condition that skips them; a rarely routed expert may want a "
                "load-balancing loss.")


def _copied_in(run: Run, steps: list[int], names: list[str]) -> str | None:
    """The line of the forward that read copies of ``names`` in their place on a captured graph
    of ``steps`` (``copied_params``), or None."""
    for step in steps:
        for graph in run.graphs_of(step):
            copies = copied_params(run, graph)
            op = next((copies[n] for n in names if n in copies), None)
            if op is not None:
                return str(op.get("src") or "") or None
    return None


def _cut_text(run: Run, key: tuple[str, int, bool, bool], names: list[str], steps: list[int],
              op: dict[str, Any], missed: list[int], got: list[int], same_structure: bool,
              through_gradients: bool = False, stood_in: bool = False) -> tuple[Severity, str, str]:
    """Severity, message and fix of one P1 group.  A parameter that got a gradient on other
    steps is not cut for good: left out of the forward on some steps it is a path chosen per
    step (info); with no captured graph of such a step, that or a cut (warning)."""
    label, _, used, sometimes = key
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    when = describe_steps(steps, run.last_step)
    if label.startswith(_FUNCTION_NONE):
        fn = label[len(_FUNCTION_NONE):]
        head = f"{shown} never received a gradient ({when})" if not sometimes else f"{shown} got no gradient ({when})"
        return ("error", f"{head}: the backward reached {'its' if len(names) == 1 else 'their'} AccumulateGrad only "
                f"through {fn}, a custom autograd.Function, and its backward() returned None for "
                f"{_them(names)} -- so the optimizer skips {_them(names)}.", _FUNCTION_NONE_FIX)
    if label == _CLEARED and sometimes and steps == list(range(steps[-1] + 1)) and steps[-1] < run.last_step:
        # cleared on the first steps only, trained on every one since: a warm-up freeze (DINO's
        # cancel_gradients_last_layer sets p.grad = None in its first epoch) -- meant (QA 44d)
        return ("info", f"{shown} had no gradient at optimizer.step() on the first {len(steps)} steps ({when}) "
                f"although the backward reached {_them(names)}, and {'has' if len(names) == 1 else 'have'} trained on "
                f"every step since: .grad was cleared between backward() and step() ({_CLEARERS}) for a while -- a "
                "warm-up freeze of these layers, as DINO's cancel_gradients_last_layer does.", _WARMUP_FIX)
    if label == _CLEARED:
        return ("warning", f"{shown} had no gradient at optimizer.step() ({when}) although the backward reached "
                f"{_them(names)}: the backward's graph holds {'its' if len(names) == 1 else 'their'} AccumulateGrad, "
                f"and nothing cuts the path to the loss -- .grad was cleared between backward() and step() "
                f"({_CLEARERS}), so the optimizer skips {_them(names)}.", _CLEARED_FIX)
    fix = _NO_GRAD_FIX if op and op.get("grad_mode") is False else _CUT_FIX
    if sometimes:
        lo, hi, total = min(missed), max(missed), max(m + n for m, n in zip(missed, got, strict=True))
        each = f"{lo}" if lo == hi else f"{lo}-{hi}"
        at = list_steps(steps)
        for_good = len(steps) > 2 and steps == list(range(steps[0], run.last_step + 1)) and lo == hi == len(steps)
        if for_good:
            # lost for good from some step on (a layer detached mid-run): said as such (QA 37d:
            # "on 106 of 226 steps each (steps 120, 121, ...) and one on the others")
            head = f"{shown} got no gradient since step {steps[0]}, every step, after getting one before"
            cleared = {str(n) for s_, ev in run.step_events() if s_ in set(steps)
                       for e in notes(ev, "grads_cleared") for n in as_list(e.get("params"))}
            if set(names) <= cleared:
                # the loop set them to None after the backward (a layer frozen by p.grad = None
                # mid-run: QA 48e read it as "stopped using them for good")
                return ("warning", f"{head}: .grad was cleared between backward() and step() on those steps "
                        f"({_CLEARERS}), so the optimizer skips {_them(names)}.", _CLEARED_FIX)
            if not used or not op:
                # no path chosen per step: one the forward stopped taking (QA 48c: an expert the
                # router no longer picks, "nothing to fix"), or, with no graph, a cut
                return ("warning", f"{head}: the forward stopped using {_them(names)} for good -- a mixture-of-experts "
                        "expert no token is routed to any more (the router collapsed onto the others), a branch switched "
                        f"off{'' if not used else ', or a path to the loss cut from that step on'}.", _GONE_FIX)
        else:
            head = (f"{shown} got no gradient on {each} of {total} steps{' each' if len(names) > 1 else ''} "
                    f"(step{'s' if len(steps) > 1 else ''} {at}) and one on the others")
        if not used:
            return "info", f"{head}: the forward did not use {_them(names)} on those steps -- {_VARYING}.", _VARYING_FIX
        if not op and same_structure:
            # a cut changes which nodes the loss reaches, so the structure; another module of the
            # same shape in its place (the expert a router picked) leaves the structure as it was
            return ("info", f"{head}: on those steps the autograd graph had the same structure as on the others, "
                    f"with other parameters in their place -- {_VARYING}.", _VARYING_FIX)
        if not op and stood_in:
            return ("info", f"{head}: on each of those steps the same layer of another module of "
                    f"{'its' if len(names) == 1 else 'their'} list got one in {'its' if len(names) == 1 else 'their'} "
                    f"place -- {_VARYING}.", _VARYING_FIX)
        if not op:
            return ("warning", f"{head}: {_VARYING}, or a path to the loss cut on those steps only; a captured "
                    f"graph of such a step tells which {capture_hint(run, 'steps whose graph structure is new')}.",
                    fix)
    else:
        head = f"{shown} never received a gradient ({when})"
    if not used:
        copied = _copied_in(run, steps, names)
        if copied is not None:
            # functional_call(model, {k: v.detach().requires_grad_() ...}): read as a zero_grad()
            # between backward() and step() (QA 50a, a MAML loop whose model never trained)
            its = "its" if len(names) == 1 else "their"
            return ("error", f"{head}: the forward at {copied} computed with copies of {_them(names)} in {its} "
                    f"place -- tensors of {its} shape{'' if len(names) == 1 else 's'} that are not the parameters, "
                    "new leaves made with .detach().requires_grad_() (or .detach(), .data) for "
                    "torch.func.functional_call -- so each backward() filled the copies' .grad and the optimizer "
                    f"skips {_them(names)}.", _COPIES_FIX)
        return "error", f"{head}: the forward never used {_them(names)}.", _UNUSED_FIX
    if op and not _is_cut(op) and through_gradients and all(n.rsplit(".", 1)[-1] == "bias" for n in names):
        # a loss made of input gradients (create_graph=True: an R1 penalty, a Hamiltonian's dH/dx)
        # has no term in a bias that only shifts the output differentiated (QA 45a: an error)
        return ("info", f"{head}: the loss there is made of gradients (a create_graph=True pass: a gradient "
                f"penalty, a Hamiltonian's dH/dx), and {'this bias only shifts' if len(names) == 1 else 'these biases only shift'} "
                "the output that was differentiated -- a constant offset drops out of a gradient, so by design the "
                "loss does not depend on it.", _GRADIENT_LOSS_FIX)
    if op and not _is_cut(op):  # nothing cuts the dataflow: it ends, unused by the loss
        return ("error", f"{head}: what {'it computes' if len(names) == 1 else 'they compute'} ends at "
                f"{g.op_label(op, run)}, whose result the loss never uses "
                "(an output computed and then left out of the loss).", _DEAD_END_FIX)
    if op:
        # (both causes of grad mode off inside a training forward, which the op alone cannot tell
        # apart: QA 36a's reentrant checkpoint read as a no_grad block the user never wrote)
        why = ("it ran under torch.no_grad(), or in torch.utils.checkpoint(use_reentrant=True) with no input that "
               "requires grad" if op.get("grad_mode") is False else "gradient cannot flow through it")
        if op.get("grad_mode") is False and str(op.get("name", "")).rstrip("_") in _DRAWS:
            # a sample drawn under no_grad: torch.distributions' .sample() (QA 53a)
            why = ("a random sample drawn under torch.no_grad() -- as a torch.distributions .sample() draws it -- "
                   "carries no gradient back to the distribution's parameters")
            fix = _SAMPLE_FIX
        if op.get("grad_mode") is not False and _stops_gradient(op):
            # a discrete choice (Gumbel's one_hot(argmax) without its straight-through trick, a
            # rounding quantiser): the fix is an estimator, not a call left out (QA 46a)
            fix = _DISCRETE_FIX
        return ("error", f"{head}: {'its path' if len(names) == 1 else 'their paths'} to the loss break"
                f"{'s' if len(names) == 1 else ''} at {g.op_label(op, run)} ({why}).", fix)
    if label == _UNREACHED:  # light mode: its walk of the graph knows this much
        return ("error", f"{head}: the backward's graph does not reach {_them(names)} -- the forward never uses "
                f"{_them(names)}, or the path to the loss is cut; a captured graph tells which (mode='default' "
                "captures the first step).", fix)
    if all(leaf_loss(ev) for s, ev in run.step_events() if s in steps):
        # every backward ran on a leaf: no parameter can get a gradient, the cut is known (not where)
        return ("error", f"{head}: each backward() ran on a loss without a graph -- computed under torch.no_grad(), "
                "through a non-differentiable op (argmax, round, .item(), numpy), or made anew from a number "
                "(torch.tensor(loss.item())), then given requires_grad=True by hand -- so the path to the loss is "
                f"cut; a captured graph tells where {capture_hint(run)}.", fix)
    # no captured graph of such a step (mode='light'): .grad was None at step(), which an unused
    # parameter, a cut path and a gradient cleared after backward all leave -- none is known
    return ("warning", f"{shown} had no gradient at optimizer.step() ({when}): the forward never uses {_them(names)}, "
            f"the path to the loss is cut, or .grad was cleared between backward() and step() ({_CLEARERS}); a "
            f"captured graph tells which {capture_hint(run)}.", fix)


def _them(names: list[str]) -> str:
    return "it" if len(names) == 1 else "them"


# Ops that read integer or boolean tensors as positions, masks or class targets, not as
# values: an argmax or a comparison feeding one of them routes or selects (mixture-of-experts
# routing, masking, pseudo-labels), and that it passes no gradient is by design.  ``mul`` is
# here for ``x * (x > 0)``, a mask.
_SELECTORS = frozenset(f"aten::{n}" for n in (
    "index", "index_put", "_index_put_impl", "index_select", "index_add", "index_copy", "index_fill", "gather",
    "scatter", "scatter_add", "scatter_reduce", "masked_fill", "masked_scatter", "masked_select", "where",
    "embedding", "embedding_bag", "_embedding_bag", "take", "take_along_dim", "nll_loss", "nll_loss_forward",
    "nll_loss2d_forward", "cross_entropy_loss", "mul", "nonzero", "argwhere",
))  # fmt: skip


class _Facts(NamedTuple):
    """Tensor id -> whether its dtype is a floating (or complex) one, -> whether it requires grad
    (or is written from one that does), the ids of bool tensors and of one-element ones, from
    the graph's table."""

    floating: dict[int, bool]
    grads: dict[int, bool]
    bools: set[int]
    scalars: set[int]


def _tensor_facts(graph: dict[str, Any]) -> _Facts:
    floating: dict[int, bool] = {}
    grads: dict[int, bool] = {}
    bools: set[int] = set()
    scalars: set[int] = set()
    for t in as_list(graph.get("tensors")):
        if isinstance(t, dict):
            tid = as_int(t.get("id"), -1)
            if isinstance(t.get("dtype"), str):
                floating[tid] = t["dtype"].startswith(("float", "bfloat", "complex"))
                if t["dtype"] == "bool":
                    bools.add(tid)
            if isinstance(t.get("requires_grad"), bool):
                grads[tid] = t["requires_grad"]
            if isinstance(t.get("shape"), list) and math.prod(as_int(n, 0) for n in t["shape"]) == 1:
                scalars.add(tid)
    return _Facts(floating, grads, bools, scalars)


def _carrying(ops: list[dict[str, Any]], grads: dict[int, bool]) -> dict[int, bool]:
    """``grads`` with every tensor an op wrote from one that requires grad marked as requiring it
    too: the table holds a tensor's metadata as first seen, and an in-place op (``y[sel] = f(x)``
    into a ``zeros_like``) makes a tensor created without grad require it."""
    out = dict(grads)
    for op in ops:
        if op.get("grad_mode") is False or "non_differentiable" in g.flags(op):
            continue
        if any(out.get(as_int(t, -1), False) for t in as_list(op.get("inputs"))):
            out.update((as_int(t, -1), True) for t in as_list(op.get("outputs")))
    return out


# Ops that take one operand as a factor of the other: a constant there weighs what carries the
# gradient (REINFORCE's ``log_prob(a) * reward``, a per-token weight, a mask's count)
_FACTORS = frozenset(("aten::mul", "aten::div"))
# Selectors that look values up by integer positions: from a table nothing trains
# (``bins[logits.argmax(-1)]``) they make a constant of the positions' -- unless what was looked
# up is data that a layer then maps (a mixture of experts' ``x[token_ids]``: _LAYERS)
_LOOKUPS = frozenset(f"aten::{n}" for n in ("index", "index_select", "gather", "take", "take_along_dim"))
# Ops that map their data input by trained weights: looked-up data going through one is routing
_LAYERS = frozenset(f"aten::{n}" for n in (
    "addmm", "mm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "convolution", "_convolution",
    "conv1d", "conv2d", "conv3d", "einsum",
))  # fmt: skip


def _feeds_as_value(path: list[dict[str, Any]], start: dict[str, Any], on_path: set[int], facts: _Facts) -> bool:
    """Whether the result of ``start`` reaches the loss as a value the loss should learn through.

    A step function's (``round``, ``sign``: floating, with a grad_fn of zero) does once an op
    outside a selector turns it, or what was computed from it, into floating point.  A
    non-differentiable op's result (an argmax, a comparison, a sample) is a constant: it does
    when an op combines it, or a constant computed from it, with something that carries a
    gradient other than as a factor or a selector -- ``ce + (pred.argmax(-1) != y).float().mean()``,
    ``mse_loss((h > 0).float(), y) + ...``, ``argmax(...) + x``.  As a factor (REINFORCE's
    ``-(dist.log_prob(a) * reward)`` with ``reward = (a == 1).float()``, a mask) or a selector
    (an index, routing, class targets) it weighs or picks what carries the gradient, by design.
    A tensor of unknown dtype counts as floating, one of unknown grad as carrying one (a file
    without a tensor table)."""
    floating, grads, bools, scalars = facts
    derived = {as_int(t, -1) for t in as_list(start.get("outputs"))}
    looked_up: set[int] = set()  # constants a lookup made from a table nothing trains
    picked: set[int] = set()  # constants a selector made from the positions alone (a one-hot), and what follows
    last = max(on_path, default=-1)  # the loss's own op
    first = as_int(start.get("id"), -1)
    step_function = str(start.get("name", "")).rstrip("_") in _STEP_FUNCTIONS
    for op in path:
        oid = as_int(op.get("id"), -1)
        ins = [as_int(t, -1) for t in as_list(op.get("inputs"))]
        if oid <= first or oid not in on_path or not derived.intersection(ins):
            continue
        name = str(op.get("name", "")).rstrip("_")
        outs = [as_int(t, -1) for t in as_list(op.get("outputs"))]
        if step_function:
            if name in _SELECTORS:
                continue
            if any(floating.get(t, True) for t in outs):
                return True
            derived.update(outs)
            continue
        carries = any(grads.get(t, True) for t in ins if t not in derived)
        if not carries:
            mine = derived.intersection(ins)
            if mine <= looked_up:
                # the positions' constants cast, reshaped or masked (a one-hot's .float(), an
                # einsum's broadcast product): what a layer applying them to data routes by
                looked_up.update(outs)
            if mine & picked:
                picked.update(outs)
        if name in _FACTORS:
            if not carries:
                derived.update(outs)  # a constant scaled by a constant
            continue  # else a weight of what carries the gradient
        if name in _LOOKUPS and not carries and not bools.intersection(derived.intersection(ins)):
            derived.update(outs)  # a table looked up at the positions: as constant as they are
            looked_up.update(outs)
            continue
        if name in _SELECTORS:
            if not carries:
                # nothing it picks from carries a gradient: ``F.one_hot(logits.argmax(1))``
                # scatters ones into zeros at the positions -- as constant as they are (QA 44b:
                # a Dice loss on it trained nothing, unseen); a layer applying it to data routes
                derived.update(outs)
                looked_up.update(outs)
                picked.update(outs)
            continue  # else it picks, masks or routes: its values are the other operand's, not the constant's
        if name in _LAYERS and carries and derived.intersection(ins) <= looked_up:
            continue  # data looked up by the positions, through a layer: routing
        if not carries:
            derived.update(outs)  # computed from constants alone: a constant too
            continue
        if name in _COMPARES and any(grads.get(t) is True for t in ins if t not in derived):
            # a loss function pulling what carries the gradient towards the constant: a target
            # (QA 44e: Double DQN's ``r + γ·Q_target(s').gather(1, Q(s').argmax(1))`` was an error)
            continue
        mine = derived.intersection(ins)
        if mine <= picked and not (oid == last and name in _ADDS and mine <= scalars):
            # a one-hot of the positions met what carries the gradient: a target (KL, MSE, a soft
            # Dice against hard pseudo-labels, a Dice denominator's count), by design -- unless
            # it is a whole constant term of the loss, added to it by the loss's last op (a Dice
            # loss on the hard predictions, QA 44b; QA 44e: the denominator's sum was told so)
            continue
        return True
    return False


_ADDS = frozenset(("aten::add", "aten::sub", "aten::rsub"))
# Loss functions that compare an input with a target: a constant met there by what carries the
# gradient is the target (a TD target, a pseudo-label), whichever operand it is
_COMPARES = frozenset(f"aten::{n}" for n in (
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
    "kl_div", "soft_margin_loss", "poisson_nll_loss", "cosine_similarity", "cosine_embedding_loss",
))  # fmt: skip

# Differentiable in autograd's sense (a grad_fn, float outputs) but with a gradient of zero
# everywhere: a loss through one of them trains nothing before it, without an error
_STEP_FUNCTIONS = frozenset(f"aten::{n}" for n in ("round", "sign", "sgn", "floor", "ceil", "trunc", "fix"))


P9_FIX = ("Use a differentiable surrogate on the loss path (softmax/sigmoid probabilities instead of argmax or "
          "thresholds, float math instead of integer casts); compute accuracy-like metrics outside the loss.")


# Draws from a distribution: a loss that depends on a sample (an RL rollout's next observation
# or its critic's target, made from the sampled action) is not differentiated through it by
# design -- the score function (log_prob) or rsample() carries that gradient.  Where nothing does,
# the parameters before the sample get no gradient: P1 says so.
_SAMPLERS = frozenset(f"aten::{n}" for n in ("multinomial", "bernoulli", "poisson", "binomial", "random", "randint_like"))


def _stops_gradient(op: dict[str, Any]) -> bool:
    name = str(op.get("name", "")).rstrip("_")
    return ("non_differentiable" in g.flags(op) and name not in _SAMPLERS) or name in _STEP_FUNCTIONS


def _reads_a_gradient(op: dict[str, Any], facts: _Facts) -> bool:
    """Whether an input of ``op`` carries a gradient (unknown: as if it did)."""
    return any(facts.grads.get(as_int(t, -1), True) for t in as_list(op.get("inputs")))


def _non_differentiable(run: Run) -> dict[tuple[str, str, str], tuple[list[int], dict[str, Any], int]]:
    """(op name, module, src) -> (the steps, the first op, its step) of each op that cannot be
    differentiated and feeds the loss, the first such op of each captured step's loss path."""
    hits: dict[tuple[str, str, str], tuple[list[int], dict[str, Any], int]] = {}
    for step, graph in run.all_graphs():
        fwd = _forward_ops(graph)
        loss = g.loss_op(graph)
        if not loss:
            continue
        path = g.upstream(fwd, loss, passes=g.passes_gradient)  # an op no gradient reaches cannot stop one
        on_path = {as_int(op.get("id"), -1) for op in path}
        known = _tensor_facts(graph)
        facts = known._replace(grads=_carrying(fwd, known.grads))
        for op in path:
            # (one whose inputs carry no gradient stops none: a target rounded inline,
            # ``mse_loss(out, torch.round(y))``, QA 48a: an error)
            if op.get("grad_mode") is not False and _stops_gradient(op) and _reads_a_gradient(op, facts) \
                    and _feeds_as_value(path, op, on_path, facts):
                key = _op_key(op)
                steps, first, fstep = hits.get(key, ([], op, step))
                hits[key] = ([*steps, step], first, fstep)
                break  # the first one in execution order is where differentiability ends
    return hits


def check_non_differentiable(run: Run, settings: Settings) -> list[Finding]:
    """P9: an op that cannot be differentiated (argmax, comparison, integer cast) feeds the loss,
    with the parameters left without a gradient because their path breaks there (P1 leaves
    them to this finding: one cause, one finding)."""
    hits = _non_differentiable(run)
    if not hits:
        return []
    groups, where, _, _ = _cut_groups(run)
    cut: dict[tuple[str, str, str], list[int]] = {}
    for key, indices in groups.items():
        op = where[key][1]
        if op and _stops_gradient(op):
            cut.setdefault(_op_key(op), []).extend(indices)
    findings: list[Finding] = []
    for (name, module, src), (steps, op, fstep) in hits.items():
        where_txt = f" in {module!r}" if module else ""
        what = ("has a gradient of zero everywhere" if name.rstrip("_") in _STEP_FUNCTIONS
                else "is not differentiable")
        indices = cut.get((name, module, src), [])
        names = [run.param_name(i) for i in indices]
        lost = ""
        if names:
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            one = len(names) == 1
            lost = (f" {shown} {'gets' if one else 'get'} no gradient at all: {'its' if one else 'their'} only path to "
                    "the loss goes through it.")
        message = (f"{name}{where_txt} {what} but the loss depends on it: gradient silently stops there "
                   f"({describe_steps(steps, run.last_step)}).{lost}")
        targets = [FindingTarget(**g.target_of_op(fstep, run.rank, op))]  # type: ignore[typeddict-item]
        targets += [FindingTarget(step=steps[0], rank=run.rank, param=run.param_name(i), module=run.param_module(i))
                    for i in indices]
        findings.append(make("P9", "error", message, P9_FIX, steps, rank=run.rank, targets=targets,
                             modules=[module] if module else [], params=names or None, src=src or None,
                             data={"op": name}))
    return findings
