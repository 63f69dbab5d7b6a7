"""`torchscope doctor FILE... [--json] [--set k=v]`: findings of session files, exit 1 on an error-level one."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pydantic_core

from torchscope.schema import Finding

from .engine import diagnose
from .finding import describe_steps
from .settings import Settings

_MARK = {"error": "ERROR", "warning": "WARN ", "info": "INFO "}


def _where(finding: Finding) -> str:
    parts: list[str] = []
    for t in finding.get("targets", []):
        bits = [f"{k}={t[k] if t[k] != '' else '(root)'}" for k in ("param", "module", "node", "op")  # type: ignore[literal-required]
                if k in t]
        if bits:
            parts.append(" ".join(bits))
    more = f"; and {len(parts) - 6} more (--json lists them)" if len(parts) > 6 else ""
    return "; ".join(parts[:6]) + more


def format_finding(finding: Finding, last_step: int) -> str:
    lines = [f"{_MARK.get(finding.get('severity', 'info'), 'INFO ')} {finding.get('code')} "
             f"{finding.get('title', '')}",
             f"    {finding.get('message', '')}"]
    steps = finding.get("steps", [])
    if steps:
        lines.append(f"    steps: {describe_steps(steps, last_step)}")
    where = _where(finding)
    if where:
        lines.append(f"    where: {where}")
    if finding.get("src"):
        lines.append(f"    source: {finding['src']}")
    lines.append(f"    fix: {finding.get('fix', '')}")
    return "\n".join(lines)


def _status(text: str) -> None:
    """One line of progress on the terminal, rewritten in place ("" clears it)."""
    sys.stderr.write(f"\r\033[K{'torchscope doctor: ' + text + '...' if text else ''}")
    sys.stderr.flush()


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


class _Seen:
    """What the CLI's notes need of a file's events, taken as they stream to the doctor: its
    session and end events, its last step, the steps of graphs whose ops were cut."""

    def __init__(self, tell: bool) -> None:
        self.tell = tell
        self.session: dict[str, Any] | None = None
        self.end: dict[str, Any] = {}
        self.last_step = -1
        self.held = 0  # the steps the file holds (QA 53d: a file whose frames were lost said last_step + 1, `info` fewer)
        self.partial: set[Any] = set()

    def tap(self, events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for ev in events:
            kind = ev.get("kind")
            if kind == "step" and isinstance(ev.get("step"), int):
                self.held += ev["step"] > self.last_step  # (a step's events are in order; a repeat is the same step)
                self.last_step = max(self.last_step, ev["step"])
                if self.tell and ev["step"] % 5000 == 4999:
                    _status(f"read {ev['step'] + 1:,} steps")
            elif kind == "graph" and ev.get("shed_ops"):
                self.partial.add(ev.get("step", -1))
            elif kind == "session" and self.session is None:
                self.session = ev
            elif kind == "end" and not self.end:
                self.end = ev
            yield ev
        if self.tell and self.last_step >= 5000:
            _status(f"read {self.last_step + 1:,} steps; checking P1-P18")


def _print_json(value: Any) -> None:
    # NaN/Infinity (a diverging run's losses) as strings, as the server's API writes them:
    # strict JSON parsers (jq, JSON.parse) refuse the bare literals
    try:
        text = pydantic_core.to_json(value, indent=2, inf_nan_mode="strings")
    except pydantic_core.PydanticSerializationError:
        # a file name that is not UTF-8 (Python holds each such byte as a surrogate escape) is
        # no JSON text: written escaped, "bad\\udcff.tscope", as the lines on stderr name it
        # (QA 53b: a traceback and exit 1, which CI reads as an error-level finding)
        text = pydantic_core.to_json(_escaped(value), indent=2, inf_nan_mode="strings")
    print(text.decode())


def _escaped(value: Any) -> Any:
    """``value`` with every string's surrogates written as ``\\udcff``: valid Unicode."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, Mapping):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_escaped(v) for v in value]
    return value


def _escaping_stdout() -> None:
    """A name that is not UTF-8 printed where stdout refuses it (a UTF-8 locale's stdout is
    strict): escaped, as stderr writes it -- not a UnicodeEncodeError mid-output (QA 53b).  As
    ``torchscope.server.cli.escaping_stdout`` (``torchscope doctor``) does."""
    if isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.errors == "strict":
        with contextlib.suppress(ValueError, OSError):
            sys.stdout.reconfigure(errors="backslashreplace")


def _settings(overrides: Mapping[str, str] | None) -> Settings | None:
    """The thresholds with ``overrides`` applied; None (said on stderr) for a bad one."""
    try:
        return Settings.from_overrides(overrides)
    except ValueError as exc:
        print(f"torchscope doctor: {exc}", file=sys.stderr)
        return None


def run(path: str, as_json: bool = False, overrides: Mapping[str, str] | None = None) -> int:
    """Print the findings of the session file at `path`; 1 if any is an error, 0 if none, 2 on bad input."""
    settings = _settings(overrides)
    return 2 if settings is None else _run(path, settings, as_json, None)


def run_files(paths: Sequence[str], as_json: bool = False, overrides: Mapping[str, str] | None = None,
              refused: Mapping[str, str] | None = None) -> int:
    """The findings of each file (one: `run`'s output, exactly), each under a ``==> FILE <==``
    line (as `head` and `tail` head several files); ``--json``: one list of ``{"file", "findings"}``
    (``{"file", "error"}`` for a file that could not be read).  ``refused``: files the caller
    found unreadable already, with why.  Exit status: 2 if a file was unreadable, else 1 if one
    had an error-level finding, else 0 (so a CI step over ``runs/*.tscope`` tells them apart)."""
    refused = refused or {}
    if len(paths) == 1 and paths[0] not in refused:
        return run(paths[0], as_json, overrides)
    settings = _settings(overrides)
    if settings is None:
        return 2
    if len(paths) == 1:
        # one file, unreadable: its line on stderr, and with --json the ``{"file", "error"}`` the
        # list of several files holds for it, alone (QA 52a: nothing on stdout for `jq` to read)
        return _unreadable(paths[0], refused[paths[0]], as_json, None)
    code = 0
    listed: list[dict[str, Any]] = []
    for n, path in enumerate(paths):
        sys.stdout.flush()  # each file's lines before the next one's notes on stderr, in one log too
        if not as_json:
            print(f"\n==> {path} <==" if n else f"==> {path} <==", flush=True)
        code = max(code, _unreadable(path, refused[path], as_json, listed) if path in refused
                   else _run(path, settings, as_json, listed))
    if as_json:
        _print_json(listed)
    sys.stdout.flush()
    unread = sum(1 for x in listed if "error" in x)
    bad = sum(1 for x in listed if any(f.get("severity") == "error" for f in x.get("findings", [])))
    print(f"torchscope doctor: {_count(len(paths), 'file')}: {bad} with an error-level finding, {unread} unreadable",
          file=sys.stderr, flush=True)
    return code


def _unreadable(path: str, why: str, as_json: bool, listed: list[dict[str, Any]] | None) -> int:
    """A file that could not be read: one line on stderr, exit status 2; with ``--json`` its
    ``{"file", "error"}`` -- in the list of several files (``listed``, printed by the caller), or
    alone on stdout for a single file, whose readable run prints its findings' list: an object,
    not a list, is the error."""
    print(f"torchscope doctor: {why}", file=sys.stderr, flush=True)
    if listed is not None:
        listed.append({"file": path, "error": why})
    elif as_json:
        _print_json({"file": path, "error": why})
    return 2


def _run(path: str, settings: Settings, as_json: bool, listed: list[dict[str, Any]] | None) -> int:
    """`run` of one file with its thresholds; ``listed``: several files' --json list, to which
    its findings are added (printed by the caller)."""
    # Imported here: the codec pulls zlib/struct only, but keeping the doctor's import light matters in the server.
    from torchscope.session import writer_alive
    from torchscope.sessionfile import SessionFileError, iter_events, salvage

    seen = _Seen(tell=sys.stderr.isatty())  # a person at a terminal: a long run's file takes a while
    try:
        found = salvage(path)  # one pass over the file: its frames, and what it left out
        # the events stream through the doctor, never all held: a long full run's graphs are
        # sampled as they come (doctor/kept.py; QA 51a: 6.9 GB for 30,000 MLP steps held whole)
        findings = diagnose(seen.tap(iter_events(path, found.frames)), settings)
        end, session, last_step, held = seen.end, seen.session, seen.last_step, seen.held
        # a run still training (this machine's process that wrote the file is alive): its
        # file has no end yet, and maybe half a frame, and nothing is lost
        writing = not end and isinstance(session, dict) and writer_alive(session)
        left_out = found.note(path, writing)  # damage or a torn tail, in one line
    except (SessionFileError, OSError, ValueError) as exc:
        return _unreadable(path, str(exc), as_json, listed)
    ended = bool(end)
    if seen.tell and last_step >= 5000:
        _status("")
    if listed is not None:  # several files: their JSON is one list, printed at the end
        listed.append({"file": path, "findings": findings})
    if as_json:
        if listed is None:
            _print_json(findings)
    elif not findings and last_step < 0:
        # not "no problems found": a run whose loop torchscope never saw end a step (no
        # optimizer.step() nor backward() it could see) holds nothing to diagnose
        print(f"{path}: no step recorded, nothing to diagnose (the run ended before its first optimizer step, or "
              "no step of its loop ended where torchscope could see it).")
    elif not findings:
        print(f"{path}: no problems found ({_count(held, 'step')}).")
    else:
        errors = sum(1 for f in findings if f.get("severity") == "error")
        print(f"{path}: {_count(len(findings), 'finding')}, {_count(errors, 'error')}, {_count(held, 'step')}\n")
        print("\n\n".join(format_finding(f, last_step) for f in findings))
    # on stderr: --json's output stays the findings alone
    if writing and not found.damage:
        print(f"torchscope doctor: note: {path} is still being written (its run is going on); the findings cover "
              f"the {_count(held, 'step')} it holds so far.", file=sys.stderr)
    elif left_out:
        print(f"torchscope doctor: note: {left_out}; the findings cover the {_count(held, 'step')} it "
              "holds.", file=sys.stderr)
    elif not ended:
        print(f"torchscope doctor: note: {path} is incomplete (it has no end event: the run was killed); the "
              f"findings cover the {_count(held, 'step')} it holds.", file=sys.stderr)
    if isinstance(session, dict) and session.get("mode") == "light" and not as_json:
        # light's "no problems found" is not the other modes' (QA 46a: a P8, a P16 and a P18 run
        # read clean): say what it could not look at
        print("torchscope doctor: note: a light run records no graph, so the checks that read one did not run -- "
              "in-place writes through .data (P8), a non-differentiable op on the loss path (P9), probabilities "
              "given to a loss (P16), an advantage not detached (P18), batch-norm statistics a checkpoint's recompute "
              "updates twice (P11) -- and P1, P2 and P4 name no op; "
              "mode='default' records the first step's graph and one in every few.", file=sys.stderr)
    if end.get("status") == "error" and end.get("message"):
        # a crash no rule explains is still the first thing to look at
        print(f"torchscope doctor: note: the run stopped with an error after {_count(held, 'step')}: "
              f"{str(end['message'])[:300]}", file=sys.stderr)
    partial = sorted(seen.partial)
    if partial:
        settings_of = session.get("settings") if isinstance(session, dict) else None
        cap = settings_of.get("max_ops") if isinstance(settings_of, dict) else None
        first = f"its first {cap:,} ops" if isinstance(cap, int) else "its first ops"
        shown = ", ".join(map(str, partial[:5])) + (f" and {len(partial) - 5} more" if len(partial) > 5 else "")
        print(f"torchscope doctor: note: the graphs of {_count(len(partial), 'step')} are partial (step {shown}: a step's "
              f"graph holds {first}); findings that follow ops (P1, P9, where a NaN began) see those only.",
              file=sys.stderr)
    return 1 if any(f.get("severity") == "error" for f in findings) else 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (`python -m torchscope.doctor.cli FILE`); `torchscope doctor` wires `run` the same way."""
    import argparse

    parser = argparse.ArgumentParser(prog="torchscope doctor", description=__doc__)
    parser.add_argument("file", nargs="+")
    parser.add_argument("--json", action="store_true", help="print findings as JSON")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a threshold")
    args = parser.parse_args(argv)
    _escaping_stdout()
    overrides: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"torchscope doctor: --set needs KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        overrides[key.strip()] = value
    try:
        return run_files(args.file, as_json=args.json, overrides=overrides)
    except BrokenPipeError:  # `... | head`: the reader left, nothing is wrong
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        return 0


if __name__ == "__main__":
    sys.exit(main())

