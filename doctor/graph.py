"""Walking one captured GraphEvent: op dataflow (tensor ids) and the autograd node graph.

Both P1 (where a parameter's path breaks) and P9 (where differentiability ends) need to know
which forward ops feed which; both use these helpers so the walk exists once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from .run import Run, as_dict, as_int, as_list

BREAK_FLAGS = frozenset({"breaks_graph", "new_leaf", "non_differentiable"})


def ops(graph: dict[str, Any]) -> list[dict[str, Any]]:
    """Ops in execution order (ids are assigned in order; sort to be safe), less full mode's
    ops of optimizer.step(): the update's in-place writes to the parameters under no_grad are
    what it is for, not a pitfall of the step's graph."""
    return sorted((o for o in as_list(graph.get("ops")) if isinstance(o, dict) and o.get("phase") != "optimizer"),
                  key=lambda o: as_int(o.get("id")))


def flags(op: dict[str, Any]) -> set[str]:
    return {str(f) for f in as_list(op.get("flags"))}


def param_tensor_ids(graph: dict[str, Any], param: str) -> set[int]:
    return {as_int(t.get("id"), -1) for t in as_list(graph.get("tensors"))
            if isinstance(t, dict) and t.get("param") == param}


def consumers(graph_ops: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """tensor id -> ops that read it."""
    out: dict[int, list[dict[str, Any]]] = {}
    for op in graph_ops:
        for t in as_list(op.get("inputs")):
            out.setdefault(as_int(t, -1), []).append(op)
    return out


def producers(graph_ops: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """tensor id -> the op that wrote it (the last writer wins: in-place ops re-produce a tensor)."""
    return {t: ops[-1] for t, ops in writers(graph_ops).items()}


# ops that hand a value on unchanged, or pick some of it
MOVES = frozenset(f"aten::{n}" for n in (
    "view", "reshape", "_unsafe_view", "_reshape_alias", "squeeze", "unsqueeze", "flatten", "contiguous", "clone",
    "_to_copy", "to", "alias", "expand", "slice", "select", "gather", "index", "index_select", "take_along_dim",
))  # fmt: skip


def op_inputs(op: dict[str, Any] | None) -> list[int]:
    """An op's input tensor ids ([] for no op)."""
    return [as_int(t, -1) for t in as_list(op.get("inputs"))] if op is not None else []


def made_by(tid: int, made: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The op that made tensor ``tid`` (``made``: ``producers``), followed back through ops
    that only move or pick values (``MOVES``, each by its first input)."""
    op = made.get(tid)
    for _ in range(16):
        if op is None or str(op.get("name")) not in MOVES:
            return op
        ins = op_inputs(op)
        op = made.get(ins[0]) if ins else None
    return None


def writers(graph_ops: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """tensor id -> every op that wrote it, in execution order: the op that made it, then the
    in-place ops that wrote it again (``relu_`` of ``ReLU(inplace=True)``, ``masked_fill_``)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for op in graph_ops:
        for t in as_list(op.get("outputs")):
            out.setdefault(as_int(t, -1), []).append(op)
    return out


def writer_before(written: dict[int, list[dict[str, Any]]], tensor: int, op_id: int) -> dict[str, Any] | None:
    """The op whose write of ``tensor`` the op ``op_id`` read: the latest before it.  An in-place
    op reads what the op before it wrote, not its own output."""
    found = None
    for w in written.get(tensor, ()):
        if as_int(w.get("id"), -1) >= op_id:
            break
        found = w
    return found


def _walk(start: Iterable[dict[str, Any]],
          neighbours: Callable[[dict[str, Any], int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """`start` and every op reachable through `neighbours(op)`, in execution order."""
    seen: dict[int, dict[str, Any]] = {}
    queue = deque(start)
    while queue:
        op = queue.popleft()
        oid = as_int(op.get("id"), -1)
        if oid not in seen:
            seen[oid] = op
            queue.extend(neighbours(op, oid))
    return [seen[k] for k in sorted(seen)]


def downstream(graph_ops: list[dict[str, Any]], start: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """`start` and every op fed (transitively) by their outputs, in execution order."""
    readers = consumers(graph_ops)

    def fed(op: dict[str, Any], oid: int) -> list[dict[str, Any]]:
        # dataflow runs forward in time
        return [r for t in as_list(op.get("outputs")) for r in readers.get(as_int(t, -1), [])
                if as_int(r.get("id"), -1) > oid]

    return _walk(start, fed)


def upstream(graph_ops: list[dict[str, Any]], op: dict[str, Any],
             passes: Callable[[dict[str, Any]], bool] = lambda _: True) -> list[dict[str, Any]]:
    """`op` and every op whose outputs (transitively) fed it, in execution order; not walking
    on past an op for which ``passes`` is false (e.g. passes_gradient)."""
    written = writers(graph_ops)

    def feeding(cur: dict[str, Any], cid: int) -> list[dict[str, Any]]:
        if not passes(cur):
            return []
        found = (writer_before(written, as_int(t, -1), cid) for t in as_list(cur.get("inputs")))
        return [w for w in found if w is not None]

    return _walk([op], feeding)


def passes_gradient(op: dict[str, Any]) -> bool:
    """Whether a gradient flows back through ``op`` to its inputs: not through a ``detach``
    (the straight-through ``z + (round(z) - z).detach()``) nor an op run with grad mode off
    (inside a custom ``autograd.Function``'s forward, under ``no_grad``)."""
    return op.get("grad_mode") is not False and str(op.get("name", "")).rstrip("_") != "aten::detach"


def node_by_id(graph: dict[str, Any], node_id: int) -> dict[str, Any]:
    for n in as_list(graph.get("nodes")):
        if isinstance(n, dict) and as_int(n.get("id"), -1) == node_id:
            return n
    return {}


def loss_op(graph: dict[str, Any]) -> dict[str, Any]:
    """The forward op that produced the loss (the op of the root grad_fn node), or {}."""
    if "root" not in graph:
        return {}
    return op_of_node(graph, node_by_id(graph, as_int(graph.get("root"), -1)))


def op_of_node(graph: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """The forward op that created ``node``, or {} (not recorded, or no op link)."""
    if "op" not in node:
        return {}
    op_id = as_int(node.get("op"), -1)
    for op in as_list(graph.get("ops")):
        if isinstance(op, dict) and as_int(op.get("id"), -1) == op_id:
            return op
    return {}


def node_children(graph: dict[str, Any]) -> dict[int, list[int]]:
    """node id -> the nodes in its next_functions, in input order."""
    children: dict[int, list[int]] = {}
    for edge in as_list(graph.get("edges")):
        if isinstance(edge, list) and len(edge) >= 2:
            children.setdefault(as_int(edge[0], -1), []).append(as_int(edge[1], -1))
    return children


def descendants(children: dict[int, list[int]], start: int) -> set[int]:
    """``start`` and every node reachable from it in ``children`` (node_children's map)."""
    seen: set[int] = set()
    queue = deque([start])
    while queue:
        n = queue.popleft()
        if n in seen:
            continue
        seen.add(n)
        queue.extend(children.get(n, []))
    return seen


def reachable_nodes(graph: dict[str, Any]) -> set[int]:
    """Autograd nodes reachable from the root through next_functions edges."""
    if "root" not in graph:
        return set()
    return descendants(node_children(graph), as_int(graph.get("root"), -1))


def accumulate_node(graph: dict[str, Any], param: str) -> dict[str, Any]:
    for n in as_list(graph.get("nodes")):
        if isinstance(n, dict) and n.get("name") == "AccumulateGrad" and n.get("param") == param:
            return n
    return {}


def target_of_op(step: int, rank: int, op: dict[str, Any]) -> dict[str, Any]:
    target: dict[str, Any] = {"step": step, "rank": rank, "op": as_int(op.get("id"), -1)}
    if op.get("module") is not None and not (op.get("module") == "" and "outside_model" in flags(op)):
        target["module"] = str(op.get("module"))  # (an op the loop ran outside the model is in none: the loss)
    return target


def op_label(op: dict[str, Any], run: Run) -> str:
    """``aten::addmm in '0' (Linear)``: the op, its module's path and its type (a
    path alone, in an ``nn.Sequential``, is a bare index: QA 42)."""
    name = str(op.get("name", "op"))
    if name.startswith("torch::"):  # a torch-level call the function mode saw: as the user wrote it
        name = name.removeprefix("torch::") + ("" if name.endswith(".data") else "()")
    module = as_dict(op).get("module")
    if not module:
        return name
    kind = run.module_type(str(module))
    return f"{name} in {module!r}" + (f" ({kind})" if kind else "")
