"""diagnose(): every rule over every rank's facts, findings ordered errors first, then by step."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from torchscope.schema import Finding, capture_off

from .finding import make, sort_key
from .rules import RULES
from .run import Run, split_by_rank
from .settings import Settings

log = logging.getLogger("torchscope.doctor")


def diagnose(events: Iterable[dict[str, Any]], settings: Settings | None = None) -> list[Finding]:
    """Findings (P1..P15) over the events of a run (a file, the store, a live stream so far).

    A rule that trips over a malformed event (or a bug of ours) is no exception in the server or
    the CLI: it gives a ``doctor`` finding naming the check that did not run, so a failure never
    reads as "no problems found".
    """
    settings = settings or Settings()
    findings: list[Finding] = []
    for run in split_by_rank(events):
        findings.extend(_capture_off(run))
        for code, rule in RULES:
            try:
                findings.extend(rule(run, settings))
            except Exception as exc:  # noqa: BLE001 - one broken rule must not hide the others
                log.debug("doctor rule %s failed on rank %d", code, run.rank, exc_info=True)
                findings.append(_unchecked(code, exc, run.rank))
    return sorted(findings, key=sort_key)


def _capture_off(run: Run) -> list[Finding]:
    """A part of the capture that turned itself off after an internal error (its log event):
    what the session holds from there is less than the run did, so no finding -- or "no step
    recorded" -- may be read as the run's all.  One finding a part."""
    out: list[Finding] = []
    seen: set[str] = set()
    for ev in run.logs:
        off = capture_off(ev)
        if off is None:
            continue
        part, error = off
        if part in seen:
            continue
        seen.add(part)
        step = ev.get("step")
        at = f" at step {step}" if isinstance(step, int) and not isinstance(step, bool) else ""
        lost = ("no step after it is recorded" if part == "step" else
                f"the session holds no {part} facts after it")
        out.append(make("doctor", "warning",
                        f"torchscope's capture of {part} turned itself off{at} after an internal error "
                        f"({error[:200]}): {lost}, "
                        "so the findings here (or their absence) do not cover the rest of the run.",
                        "This is a torchscope bug: please report it with the error above and, if you can, the "
                        "session file. Your training ran unchanged.", [], rank=run.rank,
                        title=f"The capture stopped recording {part}", data={"part": part}))
    return out


def _unchecked(code: str, exc: Exception, rank: int) -> Finding:
    """The finding of a check that raised: what was not checked, and the error in one line."""
    where = exc.__traceback__
    while where is not None and where.tb_next is not None:
        where = where.tb_next
    at = f" in {where.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{where.tb_lineno}" if where else ""
    error = f"{type(exc).__name__}: {exc}"[:200]
    return make("doctor", "warning", f"The {code} check failed on this run ({error}{at}), so {code} "
                f"was not checked; the other findings stand.",
                "This is a torchscope bug: please report it with the error above and, if you can, the session "
                "file.", [], rank=rank,
                title=f"The doctor could not check {code}", data={"check": code, "error": error})
