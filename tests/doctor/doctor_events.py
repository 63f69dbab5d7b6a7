"""Hand-written event streams for the rule tests: the facts the capture records, spelled out."""

from __future__ import annotations

from typing import Any

PARAMS = [("enc.weight", "enc", [8, 4]), ("enc.bias", "enc", [8]), ("head.weight", "head", [1, 8]),
          ("head.bias", "head", [1])]


def session(params: list[tuple[str, str, list[int]]] | None = None,
            modules: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    params = PARAMS if params is None else params
    modules = modules if modules is not None else [("", "Net"), ("enc", "Linear"), ("head", "Linear")]
    return {"kind": "session", "schema": [1, 0], "session_id": "s", "rank": 0, "name": "t",
            "modules": [{"path": p, "type": t} for p, t in modules],
            "params": [{"name": n, "module": m, "shape": s, "numel": _numel(s), "requires_grad": True}
                       for n, m, s in params]}


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def grads(n: int = 4, norm: float | list[float | None] = 1.0, **over: list[Any]) -> dict[str, Any]:
    norms = norm if isinstance(norm, list) else [norm] * n
    g: dict[str, Any] = {"norm": norms, "max_abs": norms, "zero_frac": [0.0] * n,
                         "nan": [0] * n, "inf": [0] * n, "none": [], "pre_nonzero": []}
    g.update(over)
    return g


def step(i: int, **over: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"kind": "step", "step": i, "rank": 0, "micro_batches": 1, "loss": 0.5, "losses": [0.5],
                          "grads": grads(), "zero_grad": 1, "training": True, "backward_roots": ["MseLossBackward0"],
                          "backward_src": ["train.py:20"], "step_src": "train.py:21", "backward_errors": [],
                          "forwards": [{"micro": 0, "grad_mode": True, "training": True, "built_graph": True,
                                        "backward": True, "src": "train.py:18"}],
                          "no_backward_forwards": 0, "graphs_alive": 0,
                          "memory": {"live": 1_000_000, "params": 500_000}, "copies": {"count": 0, "bytes": 0}}
    if "scaler" in over and "backward_roots" not in over:
        ev["backward_roots"] = ["MulBackward0"]  # a loss the GradScaler scaled, as real captures record it
    ev.update(over)
    return ev


def clean_run(n: int = 8) -> list[dict[str, Any]]:
    return [session(), *[step(i, grads=grads(norm=1.0 / (1 + 0.1 * i))) for i in range(n)], {"kind": "end",
            "status": "finished", "steps": n}]


def codes(findings: list[Any]) -> list[str]:
    return [f["code"] for f in findings]
