"""Building findings: one place for titles, step wording and the order findings are shown in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from torchscope.schema import Finding, FindingTarget

if TYPE_CHECKING:
    from .run import Run

Severity = Literal["error", "warning", "info"]
View = Literal["graph", "memory", "gradients"]

TITLES: dict[str, str] = {
    "P1": "Parameter gets no gradient",
    "P2": "Dead branch: gradient is all zeros",
    "P3": "Exploding or vanishing gradients",
    "P4": "NaN or Inf",
    "P5": "zero_grad() missing or misplaced",
    "P6": "Graph built but never used (evaluation without no_grad)",
    "P7": "Graph kept alive across steps",
    "P8": "In-place op modified a tensor saved for backward",
    "P9": "Non-differentiable op on the loss path",
    "P10": "backward() through a freed graph",
    "P11": "Module in the wrong train/eval mode",
    "P12": "Redundant device copies every step",
    "P13": "Module hook keeps tensors alive",
    "P14": "AMP GradScaler skipping steps or clipping scaled gradients",
    "P15": "Gradient accumulation without dividing the loss",
    "P16": "Loss given probabilities instead of logits",
    "P17": "module.requires_grad = False froze nothing",
    "P18": "Advantage not detached in the policy loss",
}

_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def describe_steps(steps: list[int], last_step: int) -> str:
    """'at step 3', 'since step 3, every step', or 'on 4 steps (3, 5, 9, 12)'."""
    if not steps:
        return ""
    if len(steps) == 1:
        return f"at step {steps[0]}"
    contiguous = steps == list(range(steps[0], steps[-1] + 1))
    if contiguous and steps[-1] >= last_step:
        return f"since step {steps[0]}, every step"
    if contiguous:
        return f"steps {steps[0]}-{steps[-1]}"
    return f"on {len(steps)} steps ({list_steps(steps)})"


def in_captured_graphs(run: Run, steps: list[int]) -> str:
    """'captured graphs since step 3, every step' and the like: the steps a rule found something
    in, told against the steps that have a graph.  Default mode captures every 50th step, and a
    long full run's graphs are sampled as the doctor reads them (kept.py): a loss given
    probabilities on every step from 5,500 of a 6,000-step full run read "on 15 steps (5500,
    5550, ...)", as though the steps between were clean (QA 52a)."""
    steps = sorted(set(steps))
    sampled = "; the doctor read a sample of this long run's graphs, not every step's" if run.graphs_left_out else ""
    plural = "s" if len(steps) > 1 else ""
    have = sorted(run.graphs)
    at = have.index(steps[0]) if steps and steps[0] in have else -1
    if len(steps) < 2 or at < 0 or steps == list(range(steps[0], steps[-1] + 1)) \
            or have[at:at + len(steps)] != steps:
        return f"captured graph{plural} {describe_steps(steps, run.last_step)}{sampled}"
    # every captured graph of a stretch: the steps between had none to tell
    span = f"since step {steps[0]}" if steps[-1] == have[-1] else f"from step {steps[0]} to {steps[-1]}"
    return f"every captured graph {span}, {len(steps)} graphs: {list_steps(steps)}{sampled}"


def list_steps(steps: list[int]) -> str:
    """'3, 5, 9, 12', the first six and '...' after them."""
    return ", ".join(str(s) for s in steps[:6]) + (", ..." if len(steps) > 6 else "")


def make(code: str, severity: Severity, message: str, fix: str, steps: list[int], *,
         rank: int = 0, targets: list[FindingTarget] | None = None, modules: list[str] | None = None,
         params: list[str] | None = None, src: str | None = None, view: View = "graph",
         data: dict[str, Any] | None = None, title: str | None = None) -> Finding:
    steps = sorted(set(steps))
    finding = Finding(code=code, severity=severity, title=title or TITLES[code], message=message, fix=fix,
                      steps=steps, since=steps[0] if steps else 0, rank=rank,
                      targets=targets or [], modules=modules or [], params=params or [],
                      view=view, data=data or {})
    if src:
        finding["src"] = src
    return finding


def sort_key(finding: Finding) -> tuple[int, int, int]:
    code = finding.get("code", "P99")
    return (_SEVERITY_ORDER.get(finding.get("severity", "info"), 3), finding.get("since", 0),
            int(code[1:]) if code[1:].isdigit() else 99)


def contiguous_runs(steps: list[int]) -> list[list[int]]:
    """[1,2,3,7,8] -> [[1,2,3],[7,8]]: how often a condition held without a break."""
    runs: list[list[int]] = []
    for s in sorted(steps):
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


def and_list(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
