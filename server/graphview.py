"""Filters of ``GET /api/sessions/{id}/graph``: keep the ops of a module subtree and/or of
some op kinds, the autograd nodes those ops created, and the edges between kept nodes."""

from __future__ import annotations

from typing import Any


def _in_module(path: Any, prefix: str) -> bool:
    return isinstance(path, str) and (prefix == "" or path == prefix or path.startswith(prefix + "."))


def _op_matches(name: Any, kinds: set[str]) -> bool:
    # "aten::addmm" matches op=aten::addmm and op=addmm
    return isinstance(name, str) and (name in kinds or name.rsplit("::", 1)[-1] in kinds)


def filter_graph(ev: dict[str, Any], module: str | None, ops: list[str] | None) -> dict[str, Any]:
    if module is None and not ops:
        return ev
    kinds = set(ops or ())
    kept_ops = [o for o in ev.get("ops", []) if isinstance(o, dict)
                and (module is None or _in_module(o.get("module"), module))
                and (not kinds or _op_matches(o.get("name"), kinds))]
    op_ids = {o.get("id") for o in kept_ops}
    kept_nodes = [n for n in ev.get("nodes", []) if isinstance(n, dict)
                  and (n.get("op") in op_ids
                       or ("op" not in n and not kinds and module is not None and _in_module(n.get("module"), module)))]
    node_ids = {n.get("id") for n in kept_nodes}
    edges = [e for e in ev.get("edges", []) if isinstance(e, list) and len(e) >= 2
             and e[0] in node_ids and e[1] in node_ids]
    tensor_ids = {t for o in kept_ops for k in ("inputs", "outputs") for t in o.get(k, []) if isinstance(t, int)}
    tensors = [t for t in ev.get("tensors", []) if isinstance(t, dict) and t.get("id") in tensor_ids]
    return {**ev, "ops": kept_ops, "nodes": kept_nodes, "edges": edges, "tensors": tensors,
            "filtered": {"module": module, "op": sorted(kinds)}}
