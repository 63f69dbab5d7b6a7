"""P8 (in-place op modified a tensor saved for backward) and P10 (backward through a freed graph).

Both usually surface as a RuntimeError from backward(); the capture records its message.  P8
also has a silent form the capture flags on the op ("inplace_saved": e.g. a `.data` write).
"""

from __future__ import annotations

import re
from typing import Any

from torchscope.schema import Finding, FindingTarget

from .. import graph as g
from ..finding import and_list, describe_steps, make
from ..run import Run, RunError, as_dict, as_int, as_list, errors, notes
from ..settings import Settings

INPLACE_TEXT = "modified by an inplace operation"
FREED_TEXT = "backward through the graph a second time"

FIX_P8 = ("Use the out-of-place form (x = x + 1, torch.relu(x) instead of x.relu_()/ReLU(inplace=True)) on "
          "tensors that backward still needs, or .clone() before modifying; never write through .data.")
_FIX_P10_WAYS = ("detach an output another loss already "
                 "backpropagated through (a GAN's fakes for the discriminator: netD(fake.detach())), empty a list of "
                 "outputs kept for the loss "
                 "after each update (a policy's saved log-probabilities: del saved_log_probs[:]), collect rollouts "
                 "under torch.no_grad() or detach what they store (PPO's old log-probabilities and values, read again "
                 "by each epoch's loss), or pass retain_graph=True only if you really must backward twice.")
FIX_P10 = ("Call backward() once per graph: sum the losses first (loss = a + b; loss.backward()), detach "
           "state carried between batches (hidden = hidden.detach()), " + _FIX_P10_WAYS)
# the failing backward went through the previous batch's graph by a recurrent state carried into
# this batch's forward (truncated BPTT without its detach): that detach first (QA 51b)
FIX_P10_STATE = ("Detach the state carried from one batch to the next before the next forward -- hidden = "
                 "hidden.detach() (an LSTM's pair: h, c = h.detach(), c.detach()) --, so each backward goes through "
                 "its own batch's graph only (truncated backprop through time); do not pass retain_graph=True for it, "
                 "which keeps every earlier batch's graph and backpropagates through all of them. Otherwise: sum the "
                 "losses of one graph first (loss = a + b; loss.backward()), " + _FIX_P10_WAYS)
_RECURRENT = re.compile(r"RNN|LSTM|GRU")

FIX_EMBEDDING = ("nn.Embedding(max_norm=...) renormalises the rows it looks up in place, in its forward: a "
                 "differentiable use of its weight before the lookup (a tied output layer, a similarity against the "
                 "embedding table) must use a copy -- w = emb.weight.clone() -- or come after the lookup; "
                 "or drop max_norm.")
_RENORM = "embedding_renorm"

FIX_STALE = ("Detach the state carried from one batch to the next (h = h.detach() before the next forward) and "
             "drop retain_graph=True: each step then backpropagates through its own graph only (truncated BPTT), "
             "which optimizer.step() has not changed under it.")

_NODE_IN_MESSAGE = re.compile(r"output \d+ of (\w+)")
_SHAPE_IN_MESSAGE = re.compile(r"\[torch\.\w+ \[([\d, ]*)\]\]")


def _shape_of(message: str) -> list[int] | None:
    """The modified tensor's shape, as torch writes it: "[torch.FloatTensor [32, 96]]"."""
    m = _SHAPE_IN_MESSAGE.search(message)
    return [int(x) for x in m.group(1).replace(" ", "").split(",") if x] if m else None


def _stale_params(run: Run, shape: list[int] | None, steps: list[int]) -> list[str]:
    """Trainable parameters of the modified tensor's shape (or, 2-D, transposed: a view such as
    ``weight.t()`` or an RNN's flattened weights), when the failing backward came after an
    optimizer step: it updated them in place under a graph built before it."""
    if shape is None or not steps or steps[0] < 1:
        return []
    shapes = (shape, shape[::-1])
    return [run.param_name(i) for i, p in enumerate(run.params)
            if p.get("requires_grad", True) and [as_int(x) for x in as_list(p.get("shape"))] in shapes]


def _tensors(graph: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {as_int(t.get("id"), -1): t for t in as_list(graph.get("tensors")) if isinstance(t, dict)}


def _written(op: dict[str, Any], tensors: dict[int, dict[str, Any]]) -> Any:
    """The storage an in-place op writes: its first input's (``self``), None when not known."""
    return tensors.get(next((as_int(x, -1) for x in as_list(op.get("inputs"))), -1), {}).get("storage")


def _first_write_after(graph: dict[str, Any], tensors: dict[int, dict[str, Any]], after: int,
                       storages: set[Any]) -> dict[str, Any] | None:
    """The first in-place forward op after op ``after`` writing one of ``storages``."""
    for op in g.ops(graph):
        if (as_int(op.get("id"), -1) > after and op.get("phase", "forward") == "forward" and "inplace" in g.flags(op)
                and _written(op, tensors) in storages):
            return op
    return None


def _stale_fields(run: Run, step: int) -> set[tuple[str, str]]:
    """(node class, saved field) of the nodes of ``step`` whose saved tensors torch refused to
    read because an in-place op modified them (``saved_unreadable`` events, "MulBackward0._saved_other:
    ..."): those tensors are missing from their node's ``saved`` list, the capture could not read them."""
    out: set[tuple[str, str]] = set()
    for s, ev in run.step_events():
        for e in notes(ev, "saved_unreadable") if s == step else []:
            text = str(e.get("node", ""))
            if INPLACE_TEXT in text:
                name, _, rest = text.partition(".")
                out.add((name, rest.partition(":")[0]))
    return out


def _saves(node: dict[str, Any], storage: Any, stale: set[tuple[str, str]]) -> str:
    """How ``node`` (one whose op read or made ``storage``) is known to have saved that storage:
    "listed" in its readable saved tensors; "stale" when a saved field of its class could not be
    read, modified in place, and its own list has no readable field of that name (the events name
    a class, not a node: the Linear whose readable ``_saved_mat1`` is its input is not the
    AddmmBackward0 whose ``_saved_mat1`` went stale); "" when its saved list is whole and lacks
    the storage -- it did not need the tensor (the op that produced it, e.g.)."""
    saved = [as_dict(t) for t in as_list(node.get("saved"))]
    if any(t.get("storage") == storage for t in saved):
        return "listed"
    name, fields = str(node.get("name", "")), {str(t.get("name")) for t in saved}
    return "stale" if any(cls == name and attr not in fields for cls, attr in stale) else ""


def _needers(graph: dict[str, Any], culprit: dict[str, Any],
             stale: set[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(all, inferred): the grad_fn nodes that needed what ``culprit`` (an in-place op) overwrote:
    of the nodes whose forward read or made its storage before it, those that saved it
    (``_saves``); the inferred ones are known from an unreadable saved field, not the storage."""
    tensors = _tensors(graph)
    storage = _written(culprit, tensors)
    if storage is None:
        return [], []
    cid = as_int(culprit.get("id"), -1)
    ops = {as_int(op.get("id"), -1): op for op in g.ops(graph)}

    def holds(op: dict[str, Any], kinds: tuple[str, ...]) -> bool:
        return any(tensors.get(as_int(t, -1), {}).get("storage") == storage for k in kinds for t in as_list(op.get(k)))

    nodes = [as_dict(n) for n in as_list(graph.get("nodes"))]
    op_of = {as_int(n.get("id"), -1): as_int(n.get("op"), -1) for n in nodes}
    children = g.node_children(graph)
    names: dict[str, str] = {}
    for node in sorted(nodes, key=lambda n: as_int(n.get("op"), cid)):
        op = ops.get(as_int(node.get("op"), -1))
        if op is not None:
            touched = as_int(op.get("id"), -1) < cid and holds(op, ("inputs", "outputs"))
        else:  # a node no op made (a custom autograd.Function's: its forward's ops ran under no_grad)
            # read what the ops of the nodes in its next_functions made
            made = [ops.get(op_of.get(c, -1)) for c in children.get(as_int(node.get("id"), -1), [])]
            touched = any(m is not None and as_int(m.get("id"), -1) < cid and holds(m, ("outputs",)) for m in made)
        how = _saves(node, storage, stale) if touched else ""
        if how:
            module = op.get("module") if op is not None else None
            label = f"{node.get('name')}" + (f" (in {module!r})" if module else "")
            names[label] = "listed" if names.get(label) == "listed" else how
    return list(names), [n for n, how in names.items() if how == "stale"]


def _node_named(run: Run, steps: list[int], name: str) -> tuple[int, dict[str, Any]]:
    """The node ``name`` in the graph of the first of ``steps`` (the failing ones) that was
    captured, else of any captured step: a healthy step's graph holds the node but not the
    in-place op that broke it."""
    for gstep in dict.fromkeys([*steps, *sorted(run.graphs)]):
        for graph in run.graphs_of(gstep):
            inplace = {as_int(op.get("id"), -1) for op in g.ops(graph) if "inplace" in g.flags(op)}
            # Torch names the forward op ("Sigmoid") or the node ("SigmoidBackward0") in its message.
            named = [as_dict(n) for n in as_list(graph.get("nodes"))
                     if str(as_dict(n).get("name", "")) == name or str(as_dict(n).get("name", "")).startswith(f"{name}Backward")]
            # of several (a MulBackward0 of x * 0 and one of h.mul_()), an in-place op's: the
            # tensor torch names is the output of the op that modified it; else (two tanh, the
            # first one's output then written by `h += x`) the one whose output a later in-place
            # op wrote over
            best = next((n for n in named if as_int(n.get("op"), -1) in inplace),
                        next((n for n in named if _overwrote_output(graph, n) is not None), named[0] if named else None))
            if best is not None:
                return gstep, best
    return -1, {}


def _overwrote_output(graph: dict[str, Any], node: dict[str, Any]) -> dict[str, Any] | None:
    """The first in-place forward op, after the op that made ``node``, writing a storage that
    op output: what the node saved of its own result (a ReLU's, a sigmoid's) is gone.  (The
    capture cannot read such a node's saved tensors once they are stale, so the silent form's
    flag is not there.)"""
    if "op" not in node:
        return None
    made = as_int(node.get("op"), -1)
    tensors = _tensors(graph)
    source = next((op for op in g.ops(graph) if as_int(op.get("id"), -1) == made), None)
    if source is None:
        return None
    storages = {tensors[t].get("storage") for t in (as_int(x, -1) for x in as_list(source.get("outputs")))
                if t in tensors and "storage" in tensors[t]}
    return _first_write_after(graph, tensors, made, storages)


def _reader_overwritten(graph: dict[str, Any], shape: list[int],
                        stale: set[tuple[str, str]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the in-place forward op, the node) when an op whose grad_fn node saved (``_saves``) a
    tensor of ``shape`` it read or made had that storage written by a later in-place forward op."""
    tensors = _tensors(graph)
    nodes = {as_int(n.get("op"), -1): n for n in as_list(graph.get("nodes")) if isinstance(n, dict) and "op" in n}
    for op in g.ops(graph):
        node = nodes.get(as_int(op.get("id"), -1))
        if op.get("phase", "forward") != "forward" or node is None:
            continue
        for t in [*as_list(op.get("inputs")), *as_list(op.get("outputs"))]:
            meta = tensors.get(as_int(t, -1), {})
            if ([as_int(x) for x in as_list(meta.get("shape"))] != shape or meta.get("storage") is None
                    or not _saves(node, meta["storage"], stale)):
                continue
            later = _first_write_after(graph, tensors, as_int(op.get("id"), -1), {meta["storage"]})
            if later is not None:
                return later, node
    return None


def check_inplace(run: Run, settings: Settings) -> list[Finding]:
    findings: list[Finding] = []
    crashes = [e for e in errors(run) if INPLACE_TEXT in e.message]
    crash_steps = sorted({e.step for e in crashes})
    if crashes:
        first = crashes[0]
        targets = [FindingTarget(step=first.step, rank=run.rank)]
        match = _NODE_IN_MESSAGE.search(first.message)
        node_name = match.group(1) if match else ""
        shape = _shape_of(first.message)
        gstep, node = _node_named(run, crash_steps, node_name) if node_name else (-1, {})
        stale = _stale_params(run, shape, crash_steps) if not node else []
        if stale:
            return [*_stale_graph(run, stale, crash_steps, first), *_silent_inplace(run, crash_steps)]
        if node:
            node_name = str(node.get("name", node_name))
            targets = [FindingTarget(step=gstep, rank=run.rank, node=as_int(node.get("id")),
                                     module=str(node.get("module", "")))]
        # The in-place op itself, when a failing step's graph was captured (the capture flags it,
        # or it wrote the output of the op whose node needed it)
        culprit = next(((s, op) for s in crash_steps for graph in run.graphs_of(s) for op in g.ops(graph)
                        if "inplace_saved" in g.flags(op)), None)
        # torch names the tensor's grad_fn now: when that is an in-place op's own node (output 0
        # of MulBackward0 after h.mul_()), that op is the culprit and the nodes that needed the
        # tensor are the earlier ones that saved it
        own = None
        saved_by = ""  # the node that saved the tensor, found from its shape when torch names none of the graph
        if culprit is None and node:
            own = next(((gstep, op) for graph in run.graphs_of(gstep) for op in g.ops(graph)
                        if as_int(op.get("id"), -1) == as_int(node.get("op"), -2) and "inplace" in g.flags(op)), None)
            # ... unless a later in-place op wrote what that node saved of its own result: a
            # ResNet block's ReLU(inplace=True) then `out += identity` -- the += broke it, and
            # torch.relu in place of relu_ would not fix it (QA 40a)
            later = next(((gstep, op) for graph in run.graphs_of(gstep)
                          if (op := _overwrote_output(graph, node)) is not None), None)
            culprit = later or own
        elif culprit is None and not node_name and shape is not None:
            # torch names no grad_fn (the tensor has none: a buffer, a leaf written under
            # no_grad -- a MoCo queue enqueued in place): the op that read a tensor of that shape
            # for a node that saves tensors, and the in-place op that wrote its storage after
            found = next(((s, hit) for s in crash_steps for graph in run.graphs_of(s)
                          if (hit := _reader_overwritten(graph, shape, _stale_fields(run, s))) is not None), None)
            if found is not None:
                gstep, (op, node) = found
                culprit, node_name = (gstep, op), str(node.get("name", ""))
                targets = [FindingTarget(step=gstep, rank=run.rank, node=as_int(node.get("id")),
                                         module=str(node.get("module", "")))]
        elif culprit is None and node_name:
            # no node of that name in the graph ("output 0 of Sub": g.sub_(0.5) on a tensor the
            # loss no longer uses): an in-place op of that name in a failing step's graph
            own = next(((s, op) for s in crash_steps for graph in run.graphs_of(s) for op in g.ops(graph)
                        if "inplace" in g.flags(op) and _op_named(op, node_name)), None)
            culprit = own
            if culprit is None and shape is not None:
                # nor an in-place op of it ("output 0 of AsStrided": a view such as emb.weight[:8],
                # read by a linear layer, then nn.Embedding(max_norm=...) renormalising the weight
                # in place): the op whose node saved a tensor of that shape and the in-place op
                # that wrote its storage after
                found = next(((s, hit) for s in crash_steps for graph in run.graphs_of(s)
                              if (hit := _reader_overwritten(graph, shape, _stale_fields(run, s))) is not None), None)
                if found is not None:
                    gstep, (op, node) = found
                    culprit = (gstep, op)
                    saved_by = str(node.get("name", "")) + (f" (in {node['module']!r})" if node.get("module") else "")
                    targets = [FindingTarget(step=gstep, rank=run.rank, node=as_int(node.get("id")),
                                             module=str(node.get("module", "")))]
        where = ""
        if culprit:
            targets.insert(0, FindingTarget(**g.target_of_op(culprit[0], run.rank, culprit[1])))  # type: ignore[typeddict-item]
            where = f" ({g.op_label(culprit[1], run)})"
        needed = f" that {node_name} needed for backward" if node_name else " that backward needed"
        if own is not None:
            needers, inferred = next((_needers(graph, own[1], _stale_fields(run, own[0]))
                                      for graph in run.graphs_of(own[0])), ([], []))
            size = f" ({shape})" if shape is not None else ""
            needed = f"{size} that {and_list(needers)} saved for backward" if needers else f"{size} that backward needed"
            if inferred:  # not seen saving it: what they saved could not be read any more
                one = len(inferred) == 1
                who = "" if inferred == needers else f"{and_list(inferred)}: "
                needed += (f" ({who}{'it' if one else 'they'} read that tensor in the forward, and torch found what "
                           f"{'it' if one else 'they'} saved modified in place)")
        elif saved_by:
            needed = f" ({shape}, output 0 of {node_name}) that {saved_by} saved for backward"
        elif node_name and not node:
            # a node of no captured graph ("AsStrided", a view): torch names what made the tensor
            size = f"{shape}, " if shape is not None else ""
            needed = f" ({size}output 0 of {node_name}) that backward needed"
        times = f" {len(crashes)} times" if len(crashes) > 1 else ""  # a loop that catches it goes on failing
        message = (f"backward() failed{times}: an in-place op{where} changed a tensor{needed} "
                   f"({describe_steps(crash_steps, run.last_step)}).")
        src = str(culprit[1].get("src", "")) if culprit else first.src
        renorm = culprit is not None and _RENORM in str(culprit[1].get("name", ""))
        fix = FIX_EMBEDDING if renorm else FIX_P8
        if renorm:
            message += (" nn.Embedding(max_norm=...) renormalised the rows it looked up in place, in its forward, "
                        "after an op had saved its weight (or a view of it) for backward.")
        elif culprit is None and not any(run.graphs_of(s) for s in crash_steps):
            light = " (mode='light' captures none)" if run.session.get("mode") == "light" else ""
            message += f" No graph of a failing step was captured{light}, so the in-place op is not named."
            suspects = _embeddings_of(run, shape) if not node else []
            if suspects:
                message += (f" The tensor could be a view of the weight of {and_list(suspects)} (nn.Embedding): "
                            "with max_norm set, its forward renormalises that weight in place.")
                fix = f"{FIX_P8} {FIX_EMBEDDING}"
        findings.append(make("P8", "error", message, fix, crash_steps, rank=run.rank,
                             targets=targets, modules=[str(node.get("module"))] if node.get("module") else [],
                             src=src or None, data={"error": first.message[:500]}))
    return [*findings, *_silent_inplace(run, crash_steps)]


def _embeddings_of(run: Run, shape: list[int] | None) -> list[str]:
    """The ``Embedding``/``EmbeddingBag`` modules whose weight a 2-D tensor of ``shape`` could be
    (or be a view of: rows of it, transposed or not), as the module paths."""
    if shape is None or len(shape) != 2:
        return []
    out: list[str] = []
    for i, p in enumerate(run.params):
        module = run.param_module(i)
        w = [as_int(x) for x in as_list(p.get("shape"))]
        if run.module_type(module) not in ("Embedding", "EmbeddingBag") or len(w) != 2:
            continue
        if (shape[1] == w[1] and shape[0] <= w[0]) or (shape[0] == w[1] and shape[1] <= w[0]):
            out.append(repr(module))
    return list(dict.fromkeys(out))


def _op_named(op: dict[str, Any], name: str) -> bool:
    """Whether ``op`` (``aten::sub_``) is the one torch's message names (``Sub``, ``SubBackward1``)."""
    base = str(op.get("name", "")).removeprefix("aten::").rstrip("_").replace("_", "")
    return base.lower() == re.sub(r"Backward\d*$", "", name).lower()


def _stale_graph(run: Run, params: list[str], steps: list[int], first: RunError) -> list[Finding]:
    """The failing backward went through a graph built before an optimizer.step() that updated a
    parameter it saved: state carried across steps without detach, kept with retain_graph."""
    # several parameters of the shape torch's message names: which one it was, the message does not
    # say (QA 37a: an encoder's and a decoder's weight_hh_l0, both [32, 96], read as both updated)
    which = (and_list(params) if len(params) == 1
             else f"one of {', '.join(params[:-1])} or {params[-1]} (torch's error names only their shape)")
    message = (f"backward() failed: optimizer.step() had updated {which} in place, and this "
               "backward went through a graph built before that step which still needed it: state carried from "
               "one batch to the next without .detach() (an RNN's hidden state), its graph kept with "
               f"retain_graph=True ({describe_steps(steps, run.last_step)}).")
    module_of = {run.param_name(i): run.param_module(i) for i in range(len(run.params))}
    modules = sorted({module_of.get(p, "") for p in params} - {""})
    return [make("P8", "error", message, FIX_STALE, steps, rank=run.rank, params=params, modules=modules,
                 targets=[FindingTarget(step=steps[0], rank=run.rank, param=p) for p in params],
                 src=first.src or None, data={"error": first.message[:500]})]


def _silent_inplace(run: Run, crash_steps: list[int]) -> list[Finding]:
    findings: list[Finding] = []
    silent: dict[tuple[str, str], tuple[list[int], int, dict[str, Any]]] = {}
    for step, graph in run.all_graphs():
        for op in g.ops(graph):
            if "inplace_saved" in g.flags(op):
                key = (str(op.get("name", "")), str(op.get("src", "")))
                steps, fstep, first_op = silent.get(key, ([], step, op))
                if step not in steps:  # an op run twice a step (two forwards) is one step
                    silent[key] = ([*steps, step], fstep, first_op)
    recorded = {step for step, _ in run.all_graphs()}
    for (name, src), (steps, fstep, op) in silent.items():
        if fstep in crash_steps:
            continue  # the same event, already reported with the error
        when = describe_steps(steps, run.last_step)
        if set(steps) == recorded and len(recorded) < len(run.steps):
            # only the recorded steps' ops are looked at: "at step 0" read as a one-off (QA 46a)
            when = (f"{when}: on every step whose ops were recorded, {len(recorded)} of {len(run.steps)}; the other "
                    "steps' ops were not")
        message = (f"{g.op_label(op, run)} wrote in place into a tensor saved for backward: the gradient is computed "
                   f"from the new values ({when}).")
        findings.append(make("P8", "error", message, FIX_P8, steps, rank=run.rank,
                             targets=[FindingTarget(**g.target_of_op(fstep, run.rank, op))],  # type: ignore[typeddict-item]
                             modules=[str(op.get("module"))] if op.get("module") else [], src=src or None,
                             data={"op": name}))
    return findings


def check_double_backward(run: Run, settings: Settings) -> list[Finding]:
    crashes = [e for e in errors(run) if FREED_TEXT in e.message]
    if not crashes:
        return []
    first = crashes[0]
    # The backward that freed the graph is the latest before the failing one: of the same step
    # (two backward calls) or the step before (state carried across batches, an RNN hidden state
    # never detached; a GAN's generator loss through the critic's backward of G(z) undetached --
    # the step's last backward, not its first: QA 37a named the critic's real-batch backward)
    srcs = {s: [str(b) for b in as_list(ev.get("backward_src"))] for s, ev in run.step_events()}
    failing = srcs.get(first.step, [])
    at = len(failing) - 1  # the failing backward: its step's last (the run stopped there, or the loop skipped on)
    earlier = [s for s in srcs if s < first.step and srcs[s]]
    prev = first.step if at > 0 or not earlier else earlier[-1]
    prev_src = failing[at - 1] if at > 0 else srcs[prev][-1] if srcs.get(prev) and prev != first.step else ""
    freed_by = f" (first freed by the backward at {prev_src})" if prev_src else ""
    seen = _carried_state(run, first.step) if at == 0 and prev != first.step else None
    guess = None if seen else _recurrent_loop(run, first.step, prev_src)
    carried = seen or guess
    state = (f": the previous batch's output from the forward at {seen} was carried into this batch's forward "
             "without .detach() (a recurrent hidden state), so this backward went on into that batch's graph" if seen
             else f": the same forward ({guess}) and backward ran for each batch of a model with a recurrent layer "
             f"({guess_layer(run)}) -- a hidden state carried from one batch into the next without .detach() takes "
             "each backward on into the batch before, whose graph the previous backward freed" if guess else "")
    message = (f"backward() ran through a graph whose saved tensors were already freed by an earlier backward"
               f"{freed_by}{state} ({describe_steps(sorted({e.step for e in crashes}), run.last_step)}).")
    targets = [FindingTarget(step=first.step, rank=run.rank)]
    graphs = run.graphs_of(prev)
    if graphs and "root" in graphs[0]:
        targets.append(FindingTarget(step=prev, rank=run.rank, node=as_int(graphs[0].get("root"))))
    return [make("P10", "error", message, FIX_P10_STATE if carried else FIX_P10, [e.step for e in crashes],
                 rank=run.rank, targets=targets, src=first.src or None,
                 data={"error": first.message[:500], "freed_by": prev_src, **({"carried": carried} if carried else {})})]


def _carried_state(run: Run, step: int) -> str | None:
    """The line of the forward whose output an earlier step left alive and ``step``'s forward
    at that same line took in again (a recurrent hidden state carried across batches without
    .detach(): the capture's ``graphs_kept`` of ``step``, "state" -- or "output" when the
    earlier backward freed it before a walk could find it nested -- in a model with a
    recurrent layer); None when nothing says so (a policy's kept log-probabilities, a GAN's
    fakes: their fixes come first then)."""
    ev = next((ev for s, ev in run.step_events() if s == step), {})
    kept = as_dict(ev.get("graphs_kept"))
    src = str(kept.get("src") or "")
    if not src or as_int(kept.get("step"), step) >= step:
        return None
    if kept.get("of") == "state":
        return src
    used = [f for f in as_list(ev.get("forwards")) if isinstance(f, dict) and f.get("backward") is True]
    return src if kept.get("of") == "output" and guess_layer(run) and any(f.get("src") == src for f in used) else None


def guess_layer(run: Run) -> str:
    """The model's first recurrent layer (``'rnn' (LSTM)``), "" for none."""
    return next((f"{str(m.get('path'))!r} ({m.get('type')})" for m in as_list(run.session.get("modules"))
                 if isinstance(m, dict) and m.get("path") and _RECURRENT.search(str(m.get("type", "")))), "")


def _recurrent_loop(run: Run, step: int, freed_by: str) -> str | None:
    """The forward's line when ``step`` (a failing one) is a loop over batches of a recurrent
    model whose every forward and backward run at one line each, the backward that freed the
    graph among them: the shape of truncated BPTT with its detach missing, where the capture
    had no earlier output alive left to show (the loop caught the error and reset the state:
    PyTorch's word-language-model style ``hidden = None``)."""
    ev = next((ev for s, ev in run.step_events() if s == step), {})
    backwards = {str(b) for b in as_list(ev.get("backward_src"))}
    forwards = {str(f.get("src")) for f in as_list(ev.get("forwards")) if isinstance(f, dict) and f.get("backward") is True}
    if not guess_layer(run) or len(backwards) != 1 or freed_by not in backwards or len(forwards) != 1:
        return None
    return next(iter(forwards)) or None
