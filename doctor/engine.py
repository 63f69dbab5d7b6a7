"""diagnose(): every rule over every rank's facts, findings ordered errors first, then by step."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from torchscope.schema import Finding

from .finding import sort_key
from .rules import RULES
from .run import split_by_rank
from .settings import Settings

log = logging.getLogger("torchscope.doctor")


def diagnose(events: Iterable[dict[str, Any]], settings: Settings | None = None) -> list[Finding]:
    """Findings (P1..P15) over the events of a run (a file, the store, a live stream so far).

    A rule that trips over a malformed event is skipped and logged: a diagnosis is never worth
    an exception in the server or the CLI.
    """
    settings = settings or Settings()
    findings: list[Finding] = []
    for run in split_by_rank(events):
        for code, rule in RULES:
            try:
                findings.extend(rule(run, settings))
            except Exception:  # noqa: BLE001 - one broken rule must not hide the others
                log.exception("doctor rule %s failed on rank %d", code, run.rank)
    return sorted(findings, key=sort_key)
