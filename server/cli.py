"""The ``torchscope`` command: serve, open, demo, info, doctor.

Imports are lazy (FastAPI/uvicorn only under ``serve``) so ``torchscope --help`` is fast.
Every bad input ends in one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

DESCRIPTION = "torchscope: see your PyTorch training live — graph, gradients and memory of every step."
EPILOG = """examples:
  torchscope serve                 dashboard at http://127.0.0.1:6150
  torchscope open run.tscope       import a session file and open it in the browser
  torchscope demo                  run a small CPU training with capture and watch it
  torchscope info run.tscope       one-screen summary of a session file
  torchscope doctor run.tscope     list the pitfalls found in a session file

exit status: 0 done, 1 a failure (a server that cannot be reached), 2 bad input (an
unreadable session file, a bad option); `doctor` also exits 1 on an error-level finding"""


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # one line, not a usage dump: "torchscope serve: invalid port 'abc' ... (see --help)"
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: give a number from 1 to 65535") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {port}: give a number from 1 to 65535")
    return port


def build_parser() -> argparse.ArgumentParser:
    from .config import DEFAULT_HOST, DEFAULT_PORT, version

    p = _Parser(prog="torchscope", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"torchscope {version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    s = sub.add_parser("serve", help="run the dashboard server", description=(
        "Run the dashboard server. It stores sessions in SQLite under --data and binds to "
        "127.0.0.1 unless --host says otherwise; bound to any other address it requires a token "
        "(generated and printed in the URL, or --token / $TORCHSCOPE_TOKEN)."))
    s.add_argument("--host", default=DEFAULT_HOST, help="address to bind (default %(default)s)")
    s.add_argument("--port", type=_port, default=DEFAULT_PORT, help="port (default %(default)s)")
    s.add_argument("--data", metavar="DIR", help="data directory (default $TORCHSCOPE_DATA or ~/.torchscope)")
    s.add_argument("--token", help="require this token for ingest and viewing (default $TORCHSCOPE_TOKEN)")
    s.add_argument("--db", metavar="URL", help="store URL; only sqlite:///PATH today (default $TORCHSCOPE_DB "
                                               "or DIR/torchscope.db)")
    s.add_argument("--quiet", action="store_true", help="print nothing but errors")

    o = sub.add_parser("open", help="import a session file into the server and open it in the browser", description=(
        "Import a .tscope session file (a colleague's, or a run recorded without a server) into the "
        "dashboard server on --port, started in the background when none answers, and open its page. "
        "The file is read, never changed."))
    o.add_argument("file", help="a .tscope session file")
    o.add_argument("--port", type=_port, default=DEFAULT_PORT, help="server port (default %(default)s); "
                   "a server is started in the background when none answers")
    o.add_argument("--data", metavar="DIR", help="data directory of a server started here")
    o.add_argument("--no-browser", action="store_true", help="print the URL only")

    d = sub.add_parser("demo", help="run a small CPU training with capture and show it live", description=(
        "Train a small model on the CPU with torchscope.watch() and open its live dashboard: the "
        "server on --port is used, or started in the background when none answers. The run is "
        "also recorded to ./torchscope-runs/ (a .tscope file `torchscope open` reopens)."))
    d.add_argument("--port", type=_port, default=DEFAULT_PORT, help="server port (default %(default)s)")
    d.add_argument("--steps", type=int, default=200, help="training steps (default %(default)s)")
    d.add_argument("--data", metavar="DIR", help="data directory of a server started here")
    d.add_argument("--no-browser", action="store_true", help="print the URL only")

    i = sub.add_parser("info", help="summarize a session file", description=(
        "Print what a .tscope session file holds: its model, steps, captured graphs, ranks and how "
        "the run ended, without starting a server."))
    i.add_argument("file", help="a .tscope session file")

    dr = sub.add_parser("doctor", help="diagnose a session file (pitfalls P1-P15)", description=(
        "List the pitfalls found in a session file, each with its steps, a one-line explanation "
        "and a fix. Exit status: 0 no error-level finding (warnings and notes exit 0), 1 an error-level finding, 2 an unreadable file or bad option."))
    dr.add_argument("file", help="a .tscope session file")
    dr.add_argument("--json", action="store_true", help="findings as JSON")
    dr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help=f"override a doctor threshold (repeatable); keys: {_doctor_keys()}")
    return p


def _doctor_keys() -> str:
    try:
        from dataclasses import fields

        from torchscope.doctor.settings import Settings
    except ImportError:  # an install without the doctor: `doctor` says so when run
        return "see docs/doctor.md"
    return ", ".join(f.name for f in fields(Settings))


# ---------------------------------------------------------------------- serve
def _bind(host: str, port: int) -> socket.socket:
    """Bind before uvicorn so "port in use" is one clear line (and no race with it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise CliError(f"port {port} is in use; choose another with --port", 2) from None
        raise CliError(f"cannot bind {host}:{port} ({exc.strerror})", 2) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def cmd_serve(args: argparse.Namespace) -> int:
    from .config import ConfigError, Settings, default_data_dir

    settings = Settings(data_dir=Path(args.data).expanduser() if args.data else default_data_dir(),
                        host=args.host, port=args.port, token=args.token, db_url=args.db)
    try:
        settings.db_path  # noqa: B018 - validates the --db URL before anything starts
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create the data directory {settings.data_dir} ({exc.strerror})", 2) from None
    sock = _bind(args.host, args.port)
    import uvicorn

    from .app import create_app

    app = create_app(settings)
    if not args.quiet:
        url = settings.base_url() + "/" + (f"?token={settings.token}" if settings.token else "")
        print(f"torchscope dashboard: {url}  (data: {settings.data_dir})", flush=True)
    config = uvicorn.Config(app, log_level="warning" if args.quiet else "info", access_log=False,
                            timeout_graceful_shutdown=3)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


# ---------------------------------------------------------------------- files
def _check_file(path_text: str) -> Path:
    """A readable session file, or a one-line CliError naming what is wrong with it (exit 2:
    bad input, as argparse's; `doctor` keeps 1 for an error-level finding, told apart in CI)."""
    from torchscope.sessionfile import SessionFileError, index, no_frames

    path = Path(path_text)
    try:
        _, frames = index(path)
    except SessionFileError as exc:
        raise CliError(str(exc), 2) from None
    if not frames:
        raise CliError(no_frames(path), 2)
    return path


def cmd_info(args: argparse.Namespace) -> int:
    from torchscope.sessionfile import SessionFileError

    from .fileinfo import summarize

    path = _check_file(args.file)
    try:
        info = summarize(path)
    except SessionFileError as exc:  # _check_file reads frame headers; a body can still be corrupt
        raise CliError(str(exc), 2) from None
    width = max(map(len, info)) + 2  # the longest label, its colon and a space
    for key, value in info.items():
        print(f"{key + ':':<{width}}{value}")
    return 0


def cmd_open(args: argparse.Namespace) -> int:
    from .client import ClientError, ensure_server, page_url, sessions, stop_server, upload

    path = _check_file(args.file)
    token = os.environ.get("TORCHSCOPE_TOKEN") or None
    started = None
    try:
        base, started = ensure_server(args.port, args.data)
        # a server that wants a token says so now: refused mid-upload, the socket would only say
        # "broken pipe"
        sessions(base, token)
        with _storing_progress(base, token, path):
            res = upload(base, path, token)
    except ClientError as exc:
        if started is not None:
            stop_server(started)
        raise CliError(str(exc), exc.code) from None
    url = page_url(base + res["url"], token)
    print(url, flush=True)
    if not args.no_browser:
        import webbrowser

        webbrowser.open(url)
    return 0


@contextlib.contextmanager
def _storing_progress(base: str, token: str | None, path: Path) -> Iterator[None]:
    """On a terminal, while the server reads an uploaded file into its store (the long part
    of a big import): a progress bar of the bytes of frames it has read, polled from
    ``GET /api/ingest/imports`` in a thread (the upload's own bar is the client's)."""
    if not (sys.stderr.isatty() and path.stat().st_size > 1024 * 1024):
        yield
        return
    from .upload import safe_name

    stop = threading.Event()
    poller = threading.Thread(target=_poll_import, args=(base, token, safe_name(path.name), stop), daemon=True)
    poller.start()
    try:
        yield
    finally:
        stop.set()
        poller.join()


def _poll_import(base: str, token: str | None, name: str, stop: threading.Event) -> None:
    from .client import _progress

    drawn = (-1, 0)
    while not stop.wait(0.2):
        mine = [i for i in _imports(base, token) if i.get("name") == name and i.get("total")]
        if mine and (mine[0]["done"], mine[0]["total"]) != drawn:
            drawn = (mine[0]["done"], mine[0]["total"])
            _progress(*drawn, "storing")
    if 0 <= drawn[0] < drawn[1]:  # finished between two polls: the bar ends full
        _progress(drawn[1], drawn[1], "storing")


def _imports(base: str, token: str | None) -> list[dict[str, Any]]:
    """The server's imports in progress ([] when it cannot say: an older server)."""
    import json
    import urllib.request

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        req = urllib.request.Request(base + "/api/ingest/imports", headers=headers)
        with urllib.request.urlopen(req, timeout=5) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError):
        return []
    return [i for i in data if isinstance(i, dict)] if isinstance(data, list) else []


def cmd_demo(args: argparse.Namespace) -> int:
    from .client import ClientError, ensure_server, page_url, sessions

    if args.steps < 1:
        raise CliError("--steps must be at least 1", 2)
    token = os.environ.get("TORCHSCOPE_TOKEN") or None
    try:
        base, _ = ensure_server(args.port, args.data)
        known = {s["id"] for s in sessions(base, token)}  # and a server that wants a token says so now
    except ClientError as exc:
        raise CliError(str(exc), exc.code) from None
    proc = subprocess.Popen([sys.executable, "-m", "torchscope.demo_train", "--server", base,
                             "--steps", str(args.steps)])
    try:
        url = page_url(_demo_session(base, token, known, proc) or base + "/", token)
        print(url, flush=True)
        if not args.no_browser:
            import webbrowser

            webbrowser.open(url)
        code = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the demo's training too: it ends its runs itself
        try:
            proc.wait(10)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.terminate()
        print(f"\ndemo stopped; its runs stay on the dashboard at {page_url(base + '/', token)}", file=sys.stderr)
        return 130
    if code == 0:
        print(f"demo finished; the dashboard stays at {page_url(base + '/', token)} "
              "(the server keeps running in the background)", file=sys.stderr)
    return code


def _demo_session(base: str, token: str | None, known: set[str], proc: subprocess.Popen[bytes]) -> str | None:
    """The page of the demo's transformer run (the graph worth seeing first), once it shows."""
    from .client import sessions

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        new = [s["id"] for s in sessions(base, token)
               if s["id"] not in known and str(s.get("name") or "").endswith("transformer")]
        if new:
            return f"{base}/sessions/{new[0]}"
        time.sleep(0.2)
    return None


def cmd_doctor(args: argparse.Namespace) -> int:
    path = _check_file(args.file)
    overrides: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--set {item!r}: expected KEY=VALUE", 2)
        overrides[key.strip()] = value.strip()
    try:
        from torchscope.doctor.cli import run
    except ImportError as exc:
        raise CliError(f"the doctor is not available in this install ({exc})") from None
    return int(run(str(path), args.json, overrides))


COMMANDS = {"serve": cmd_serve, "open": cmd_open, "demo": cmd_demo, "info": cmd_info, "doctor": cmd_doctor}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except CliError as exc:
        print(f"torchscope: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
