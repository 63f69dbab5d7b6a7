"""Thresholds of the doctor: one registry, each with its default and the reason for it.

Every threshold is a field of `Settings`; `SETTING_HELP` documents each one (docs/doctor.md
is written from it and a test checks that none is undocumented).  A session can override
any of them with strings (`torchscope doctor FILE --set explode_factor=1e4`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Settings:
    min_steps: int = 3
    dead_zero_frac: float = 0.99
    explode_factor: float = 1e3
    explode_min_norm: float = 1.0
    vanish_factor: float = 1e4
    layer_ratio: float = 1e4
    memory_growth_bytes: int = 256 * 1024
    growth_steps: int = 4
    hook_bytes: int = 64 * 1024 * 1024
    copies_per_step: int = 8
    scaler_skip_steps: int = 3
    min_scale: float = 1.0

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, object] | None) -> Settings:
        """Defaults with `overrides` (name -> number or string) applied; ValueError on a bad name or value."""
        known = {f.name: f.default for f in fields(cls)}
        values: dict[str, int | float] = {}
        for key, raw in (overrides or {}).items():
            if key not in known:
                raise ValueError(f"unknown doctor setting {key!r} (known: {', '.join(sorted(known))})")
            values[key] = _in_range(key, _convert(key, raw, type(known[key])))
        return cls(**values)  # type: ignore[arg-type]


# What each setting means bounds it: (lowest, whether the lowest itself is allowed, highest).
# A factor of 1 or less would call every step exploding; min_steps=0 reported a condition
# twice and a negative one crashed P3.
_RANGES: dict[str, tuple[float, bool, float]] = {
    "min_steps": (1, True, math.inf), "dead_zero_frac": (0, False, 1), "explode_factor": (1, False, math.inf),
    "explode_min_norm": (0, True, math.inf), "vanish_factor": (1, False, math.inf), "layer_ratio": (1, False, math.inf),
    "memory_growth_bytes": (0, True, math.inf), "growth_steps": (1, True, math.inf), "hook_bytes": (0, True, math.inf),
    "copies_per_step": (0, True, math.inf), "scaler_skip_steps": (1, True, math.inf), "min_scale": (0, False, math.inf),
}


def _in_range(name: str, value: int | float) -> int | float:
    low, closed, high = _RANGES[name]
    if math.isnan(value) or value > high or value < low or (value == low and not closed):
        bound = f"{'at least' if closed else 'more than'} {low:g}" + (f" and at most {high:g}" if high != math.inf else "")
        raise ValueError(f"doctor setting {name!r} must be {bound}, got {value:g}")
    return value


# Why each default is what it is; the CLI's --set and docs/doctor.md use these names.
SETTING_HELP: dict[str, str] = {
    "min_steps": "steps a condition must hold (P2 dead, P3 layer ratio, P7 alive graphs, P12 copies) before it "
                 "is reported, capped at the run's length; also the warm-up steps P3 takes as its baseline",
    "dead_zero_frac": "P2: fraction of exact zeros in a parameter's gradient from which it counts as dead",
    "explode_factor": "P3: total gradient norm this many times above the median of all earlier steps = exploding",
    "explode_min_norm": "P3: an exploding norm must also be at least this large (a converged run's tiny norms bounce)",
    "vanish_factor": "P3: total gradient norm this many times below the largest earlier norm, while the loss stayed "
                     "within 100x of its value then, = vanishing (a loss going to zero is convergence)",
    "layer_ratio": "P3: per-element gradient size (norm/sqrt(numel)) at the model's output end over its input "
                   "end (the median of its last quarter of weights over the largest of its first), within one step, "
                   "from which gradients vanish layer by layer",
    "memory_growth_bytes": "P7: live bytes at step boundaries must grow by at least this much per step",
    "growth_steps": "P7/P13: consecutive steps of growth before memory growth is reported",
    "hook_bytes": "P13: bytes held by a module's forward hooks that are reported even when they do not grow",
    "copies_per_step": "P12: host<->device copies per step above which they are reported as redundant",
    "scaler_skip_steps": "P14: consecutive optimizer steps the GradScaler skipped (inf/NaN), or skipped steps making up 10% or more of the run, before it is reported (isolated skips are the scaler calibrating)",
    "min_scale": "P14: a GradScaler scale below this has collapsed",
}


def _convert(name: str, raw: object, kind: type) -> int | float:
    text = str(raw).strip()
    try:
        value = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else float(text)
    except ValueError:
        raise ValueError(f"doctor setting {name!r} needs a number, got {text!r}") from None
    if kind is not int:
        return value
    # whole-number settings accept "1e6" too (people write byte sizes that way), not 3.5 or inf
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"doctor setting {name!r} needs a whole number, got {text!r}")
    return int(value)
