"""Fifty-third session: the command as a newcomer meets it, and a rename taken back.

- `python -m torchscope ...` was no command (only the `torchscope` script on PATH was): it runs
  the CLI now (capture/__main__.py), its usage and errors naming it `python -m torchscope`;
- a run renamed on the dashboard and renamed back to its recorded name downloaded as the recorded
  file, byte for byte: a colleague who had imported the earlier download (the rename) kept that
  name when importing the new one. Once given a name or tags, a run's download carries its labels,
  the recorded ones too;
- every command's `--help` printed its description as one line of hundreds of characters; a
  newcomer's help did not say where runs come from (`torchscope.watch`);
- `serve --host ""` served on every interface at the URL `http://:6150/`; `open` and `demo` with a
  `--data` that is a file said "cannot write the server's log".
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ServerProc, free_port
from server_helpers import run_frames, write_file
from test_server_cli import _bare_env, cli, one_line_error
from test_server_qa52 import _export, _labels, _patch, _upload

import torchscope
from torchscope.server.store import Store

COMMANDS = ("serve", "open", "demo", "info", "doctor")


def _module(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchscope", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def _env(**extra: str) -> dict[str, str]:
    return _bare_env(COLUMNS="100", **extra)  # (argparse wraps to $COLUMNS: both commands alike)


# ------------------------------------------------------------------ python -m torchscope
@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_python_m_torchscope_prints_the_commands_help(command: str | None) -> None:
    args = ["--help"] if command is None else [command, "--help"]
    script = cli(*args, env=_env())
    module = _module(*args, env=_env())
    assert module.returncode == script.returncode == 0, module.stderr
    assert module.stdout.startswith("usage: python -m torchscope" + (f" {command}" if command else "")), module.stdout
    # the same help, the usage's name aside (its continuation lines indented to it)
    assert " ".join(module.stdout.split()).replace("python -m torchscope", "torchscope") == " ".join(
        script.stdout.split())


def test_python_m_torchscope_exits_as_the_command_does(tmp_path: Path) -> None:
    res = _module(env=_env())  # no command: the help, exit 2
    assert res.returncode == 2 and res.stdout.startswith("usage: python -m torchscope [-h]")
    res = _module("serve", "--port", "x", env=_env())
    assert one_line_error(res) == ("python -m torchscope serve: argument --port: invalid port 'x': give a number "
                                   "from 1 to 65535 (see python -m torchscope serve --help)")
    assert res.returncode == 2
    missing = str(tmp_path / "missing.tscope")
    res, script = _module("info", missing, env=_env()), cli("info", missing, env=_env())
    assert (res.returncode, res.stderr) == (script.returncode, script.stderr) == (2, f"torchscope info: {missing}: "
                                                                                     "no such file\n")
    good = write_file(tmp_path / "run.tscope", run_frames("qa53-m", steps=3))
    res, script = _module("info", str(good), env=_env()), cli("info", str(good), env=_env())
    assert res.returncode == 0 and res.stdout == script.stdout and "steps: 3" in " ".join(res.stdout.split())
    assert _module("--version").stdout == cli("--version").stdout == f"torchscope {torchscope.__version__}\n"


def test_import_torchscope_does_not_run_or_import_the_cli() -> None:
    """capture/__main__.py imports no server module (it hands `-m torchscope` to a process running
    torchscope.server.cli), and only `-m` runs it."""
    code = ("import sys, torchscope; bad = [m for m in sys.modules if m.startswith(('torchscope.server', "
            "'torchscope.__main__'))]; assert not bad, bad")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


# ------------------------------------------------------------------ a rename taken back
def test_a_run_renamed_back_downloads_saying_its_recorded_name(tmp_path: Path) -> None:
    original = write_file(tmp_path / "run.tscope", run_frames("qa53-back", steps=5))
    untouched = write_file(tmp_path / "other.tscope", run_frames("qa53-untouched", steps=3))
    sid = "qa53-back"
    with ServerProc(tmp_path / "mine") as mine, ServerProc(tmp_path / "colleague") as colleague:
        _upload(mine, "run.tscope", original.read_bytes())
        _upload(mine, "other.tscope", untouched.read_bytes())
        _patch(mine, sid, name="baseline lr=1e-3", tags=["baseline"])
        first = tmp_path / "first.tscope"
        first.write_bytes(_export(mine, sid))
        _upload(colleague, "first.tscope", first.read_bytes())
        s = colleague.get(f"/api/sessions/{sid}")
        assert (s["name"], s["tags"]) == ("baseline lr=1e-3", ["baseline"])  # type: ignore[index]
        # renamed back: the recorded name ("run"), no tags
        _patch(mine, sid, name="run", tags=[])
        second = tmp_path / "second.tscope"
        second.write_bytes(_export(mine, sid))
        assert second.read_bytes() != original.read_bytes()  # it says the labels taken back
        assert _labels(second) == [{"name": "run", "tags": []}]
        # the colleague imports it over the copy they have: the name and tags taken back there too
        again = _upload(colleague, "second.tscope", second.read_bytes())
        assert again["new_frames"] == 0 and again["labeled"] is True, again
        s = colleague.get(f"/api/sessions/{sid}")
        assert (s["name"], s["tags"]) == ("run", []), s  # type: ignore[index]
        # the colleague's own download says them on (a third colleague had the first one)
        third = tmp_path / "third.tscope"
        third.write_bytes(_export(colleague, sid))
        assert _labels(third) == [{"name": "run", "tags": []}]
        # a run never renamed or tagged: the recorded file, byte for byte
        assert _export(mine, "qa53-untouched") == untouched.read_bytes()
        # and one whose rename left it as it was (the same name): nothing to take back, but said
        _patch(mine, "qa53-untouched", name="run")
        assert _labels(_write(tmp_path / "u.tscope", _export(mine, "qa53-untouched"))) == [{"name": "run", "tags": []}]
    # `torchscope info` and the notebook reader read the recorded name, not "run (recorded as run)"
    res = cli("info", str(second))
    assert res.returncode == 0, res.stderr
    assert dict(line.split(":", 1) for line in res.stdout.splitlines())["name"].strip() == "run", res.stdout
    assert "tags" not in dict(line.split(":", 1) for line in res.stdout.splitlines())
    got = torchscope.load(second)
    assert (got.name, got.tags) == ("run", [])


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_store_from_before_marks_its_renamed_sessions(tmp_path: Path) -> None:
    """A store written by the build before has no ``sessions.labeled``: opened, its renamed or
    tagged sessions are marked (their downloads keep saying their labels), the others not."""
    db = tmp_path / "torchscope.db"
    Store(db).close()
    with sqlite3.connect(db) as c:
        c.execute("ALTER TABLE sessions DROP COLUMN labeled")  # as the build before made it
        for sid, name, tags in (("qa53-old-a", "renamed", "[]"), ("qa53-old-b", "run", '["x"]'),
                                ("qa53-old-c", "run", "[]"), ("qa53-old-d", None, "[]")):
            c.execute("INSERT INTO sessions (id, name, tags, created_at, updated_at, meta) VALUES (?,?,?,?,?,?)",
                      (sid, name, tags, 0.0, 0.0, '{"name": "run"}' if name else None))
    store = Store(db)
    try:
        got = {sid: store.session(sid)["labeled"] for sid in ("qa53-old-a", "qa53-old-b", "qa53-old-c", "qa53-old-d")}
    finally:
        store.close()
    assert got == {"qa53-old-a": True, "qa53-old-b": True, "qa53-old-c": False, "qa53-old-d": False}


# ------------------------------------------------------------------ --help and bad arguments
@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_each_help_wraps_its_description_to_the_terminal(command: str | None) -> None:
    res = cli(*([] if command is None else [command]), "--help", env=_bare_env(COLUMNS="80"))
    assert res.returncode == 0
    description = res.stdout.split("\n\n")[1]  # after the usage
    assert len(description) > 80 and all(len(line) <= 80 for line in description.splitlines()), description


def test_the_help_tells_a_newcomer_where_runs_come_from() -> None:
    top = " ".join(cli("--help").stdout.split())
    assert "Add torchscope.watch(model, optimizer) to your training script" in top
    assert "./torchscope-runs/" in top
    doctor = " ".join(cli("doctor", "--help").stdout.split())
    assert "a missing zero_grad()" in doctor and "NaN/Inf" in doctor
    open_ = " ".join(cli("open", "--help").stdout.split())
    assert "Which server: --server URL" in open_ and "one that cannot be is said" not in open_
    assert "data directory of the server started when none answers (default $TORCHSCOPE_DATA" in open_


BAD_ARGS = [
    (["nosuch"], "torchscope: argument COMMAND: invalid choice: 'nosuch'"),
    (["serve", "--port", "0"], "torchscope serve: argument --port: invalid port 0"),
    (["serve", "--host", ""], "torchscope serve: argument --host: give an address: 127.0.0.1"),
    (["serve", "--host", "  "], "torchscope serve: argument --host: give an address"),
    (["serve", "--db", "postgres://x"], "torchscope serve: unsupported --db 'postgres'"),
    (["serve", "--data", "{file}"], "torchscope serve: the data directory {file} is a file, not a directory"),
    (["open", "{missing}"], "torchscope open: {missing}: no such file"),
    (["open"], "torchscope open: the following arguments are required: file"),
    (["open", "{good}", "--data", "{file}"], "torchscope open: the data directory {file} is a file, not a directory: "
                                             "give --data a directory (created if missing)"),
    (["open", "{good}", "--server", "notaurl"], "torchscope open: --server 'notaurl' is not an http(s) URL"),
    (["demo", "--steps", "0"], "torchscope demo: --steps must be at least 1"),
    (["demo", "--steps", "x"], "torchscope demo: argument --steps: invalid int value: 'x'"),
    (["demo", "--data", "{file}"], "torchscope demo: the data directory {file} is a file, not a directory"),
    (["info", "{missing}"], "torchscope info: {missing}: no such file"),
    (["info", "{file}"], "torchscope info: {file} is not a torchscope session file"),
    (["doctor", "{missing}"], "torchscope doctor: {missing}: no such file"),
    (["doctor", "{good}", "--set", "x"], "torchscope doctor: --set 'x': expected KEY=VALUE"),
    (["doctor", "{good}", "--set", "nosuch=1"], "torchscope doctor: unknown doctor setting 'nosuch'"),
    (["doctor", "{good}", "--set", "min_steps=x"], "torchscope doctor: doctor setting 'min_steps' needs a number"),
]


@pytest.mark.parametrize("args, said", BAD_ARGS, ids=[" ".join(a) or "none" for a, _ in BAD_ARGS])
def test_every_command_refuses_a_bad_argument_in_one_line(tmp_path: Path, args: list[str], said: str) -> None:
    (tmp_path / "notes.txt").write_text("just notes\n")
    names = {"file": str(tmp_path / "notes.txt"),
             "missing": str(tmp_path / "missing.tscope"),
             "good": str(write_file(tmp_path / "run.tscope", run_frames("qa53-bad", steps=3)))}
    port = ["--port", str(free_port())] if args and args[0] in ("serve", "open", "demo") and "--port" not in args \
        and "--server" not in args else []
    extra = ["--no-browser"] if args[:1] in (["open"], ["demo"]) and len(args) > 1 else []
    # (a server that started after all would hold the test: the timeout says so)
    res = cli(*[a.format(**names) for a in args], *port, *extra, timeout=30,
              env=_bare_env(TORCHSCOPE_DATA=str(tmp_path / "data")))
    line = one_line_error(res)
    assert line.startswith(said.format(**names)), line
    assert res.returncode == 2 and res.stdout == "", res.stdout
    assert not os.path.exists(tmp_path / "data" / "server.lock")  # no server was started
