"""Runs the pitfall reproducers and clean scripts once per test session, in parallel, and diagnoses them.

Shared by the reproducer tests (and handy by hand: `python tests/doctor/doctor_runs.py`).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import EXAMPLES, run_script  # noqa: E402

from torchscope.doctor import diagnose  # noqa: E402
from torchscope.sessionfile import iter_events  # noqa: E402

PITFALLS = EXAMPLES / "pitfalls"
STEPS = "6"


def reproducer(code: str) -> Path:
    """examples/pitfalls/p05_....py for "P5"."""
    matches = sorted(PITFALLS.glob(f"p{int(code[1:]):02d}_*.py"))
    assert len(matches) == 1, f"expected one reproducer for {code}, found {matches}"
    return matches[0]


CLEAN = [PITFALLS / "clean_accumulation.py", PITFALLS / "clean_amp.py",
         EXAMPLES / "mlp.py", EXAMPLES / "cnn.py", EXAMPLES / "transformer.py"]


def record(script: Path, out: Path, *extra: str) -> list[dict[str, Any]]:
    """Run `script` with --record `out` (plus `extra`) and return its events."""
    # --server none: never let an example auto-start a server from a test.
    run_script(script, "--record", str(out), "--server", "none", "--steps", STEPS, *extra, timeout=240)
    return list(iter_events(out))


def script_findings(tmp_path: Path, script_text: str, variant: str, mode: str,
                    env: dict[str, str] | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """A test's training script (``script_text``, run as ``train.py VARIANT MODE RECORD`` in
    ``tmp_path``) recorded and diagnosed: its path and the findings."""
    script = tmp_path / "train.py"
    script.write_text(script_text)
    out = tmp_path / f"{variant}_{mode}.tscope"
    run_script(script, variant, mode, str(out), env=env, timeout=240, cwd=tmp_path)
    return script, [dict(f) for f in diagnose(iter_events(out))]


def diagnose_all(jobs: list[tuple[str, Path, tuple[str, ...]]], tmp: Path,
                 workers: int | None = None) -> dict[str, list[dict[str, Any]] | BaseException]:
    """name -> findings (or the exception that running the script raised)."""
    def one(job: tuple[str, Path, tuple[str, ...]]) -> tuple[str, list[dict[str, Any]] | BaseException]:
        name, script, extra = job
        try:
            return name, [dict(f) for f in diagnose(record(script, tmp / f"{name}.tscope", *extra))]
        except BaseException as exc:  # reported by the test that needs it
            return name, exc

    with ThreadPoolExecutor(max_workers=workers or max(2, (os.cpu_count() or 2) * 2)) as pool:
        return dict(pool.map(one, jobs))


def all_jobs() -> list[tuple[str, Path, tuple[str, ...]]]:
    jobs: list[tuple[str, Path, tuple[str, ...]]] = []
    for n in range(1, 19):
        code = f"P{n}"
        jobs.append((code, reproducer(code), ()))
        jobs.append((f"{code}-fixed", reproducer(code), ("--fixed",)))
    jobs += [(f"clean-{p.stem}", p, ()) for p in CLEAN if p.exists()]
    return jobs


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        results = diagnose_all(all_jobs(), Path(d))
    for name, res in results.items():
        if isinstance(res, BaseException):
            print(f"{name}: FAILED {str(res)[:300]}")
            continue
        print(f"{name}: " + (", ".join(f"{f['code']}/{f['severity']}@{f.get('since')}" for f in res) or "-"))
        for f in res:
            print(f"    {f['code']}: {f['message']}")
