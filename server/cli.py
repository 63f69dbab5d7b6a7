"""The ``torchscope`` command: serve, open, demo, info, doctor.

Imports are lazy (FastAPI/uvicorn only under ``serve``) so ``torchscope --help`` is fast.
Every bad input ends in one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import uvicorn

    from torchscope.sessionfile import FrameInfo, Readable

    from .live import LiveHub

DESCRIPTION = ("torchscope: see your PyTorch training live — graph, gradients and memory of every step. "
               # (a newcomer's first question: where do the runs these commands take come from)
               "Add torchscope.watch(model, optimizer) to your training script: it shows each step on the "
               "dashboard server (started if none runs) and records the run to ./torchscope-runs/*.tscope, "
               "a session file these commands open, summarize and diagnose.")
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


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """A command's description wrapped to the terminal, as argparse wraps the options' help (raw,
    each was one line of hundreds of characters, cut mid-word by the terminal); a text of several
    lines -- the examples, laid out by hand -- kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # one line, not a usage dump: "torchscope serve: invalid port 'abc' ... (see --help)"
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _host(text: str) -> str:
    # "" bound every interface and printed the URL http://:6150/ (QA 53)
    if not text.strip():
        raise argparse.ArgumentTypeError("give an address: 127.0.0.1 (this machine only), 0.0.0.0 (every "
                                         "network interface) or one of this machine's addresses")
    return text.strip()


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: give a number from 1 to 65535") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {port}: give a number from 1 to 65535")
    return port


_SERVER_ENV = ("Which server: --server URL, else $TORCHSCOPE_SERVER, else http://127.0.0.1:6150 (--port N: "
               "http://127.0.0.1:N); a server on this machine's 127.0.0.1/localhost is started in the background "
               "when none answers (its URL, pid and how to stop it are printed). $TORCHSCOPE_TOKEN: the token of a "
               "server that needs one, as for watch().")
_STARTED_DATA = "data directory of the server started when none answers (default $TORCHSCOPE_DATA or ~/.torchscope)"
_EXAMPLES = {
    "serve": """examples:
  torchscope serve                            dashboard at http://127.0.0.1:6150
  torchscope serve --port 7000 --data runs/   another port, sessions stored under runs/
  torchscope serve --host 0.0.0.0             reachable from other machines (a token is generated,
                                              kept in the data directory: the same after a restart)
  torchscope serve --verbose                  uvicorn's log and one line per request""",
    "open": """examples:
  torchscope open run.tscope                     the server on 127.0.0.1:6150 (started if none answers)
  torchscope open a.tscope b.tscope              both imported; two runs open side by side (Compare runs)
  torchscope open sweep/*.tscope                 each imported; 3 to 8 runs open side by side too
                                                 (9 or more: the sessions page, to tick up to 8 there)
  torchscope open runs/*.tscope --no-browser     each imported, its URL printed
  torchscope open run.tscope --no-browser        print the URL only
  torchscope open run.tscope --no-follow         a run still writing it: import what it holds now
  torchscope open run.tscope --port 7000         the server on 127.0.0.1:7000
  torchscope open run.tscope --server http://gpu-box:6150
  TORCHSCOPE_SERVER=http://gpu-box:6150 TORCHSCOPE_TOKEN=... torchscope open run.tscope""",
    "demo": """examples:
  torchscope demo                        train 200 steps, watch them on http://127.0.0.1:6150
  torchscope demo --steps 50 --no-browser
  torchscope demo --server http://127.0.0.1:7000""",
    "info": """examples:
  torchscope info run.tscope
  torchscope info torchscope-runs/*.tscope       one summary per file""",
    "doctor": """examples:
  torchscope doctor run.tscope
  torchscope doctor run.tscope --json | jq '.[].code'
  torchscope doctor runs/*.tscope                each file's findings; exit 1 if any has an error
  torchscope doctor run.tscope --set min_steps=5 --set dead_zero_frac=0.999""",
}


def build_parser(prog: str = "torchscope") -> argparse.ArgumentParser:
    """``prog``: how the usage, the help and argparse's errors name the command (``python -m
    torchscope`` where capture/__main__.py runs it)."""
    from .config import DEFAULT_HOST, DEFAULT_PORT, MAX_COMPARE, version

    p = _Parser(prog=prog, description=DESCRIPTION, epilog=EPILOG, formatter_class=_Formatter)
    p.add_argument("--version", action="version", version=f"torchscope {version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=description, epilog=_EXAMPLES[name],
                              formatter_class=_Formatter)

    s = command("serve", "run the dashboard server", (
        "Run the dashboard server. It stores sessions in SQLite in the data directory DIR (--data) and "
        "binds to 127.0.0.1 unless --host says otherwise; bound to an address other machines can reach "
        "(any but 127.0.0.1, ::1, localhost) it requires a token: $TORCHSCOPE_TOKEN or --token (which other users see in `ps`), else one generated on "
        "its first start, kept in DIR/token (readable by you only) for the next starts on DIR, and "
        "printed in the URL. It creates DIR readable by you only."))
    s.add_argument("--host", type=_host, default=DEFAULT_HOST, help=(
        "address to bind (default %(default)s: this machine only; 0.0.0.0: every network interface, a token "
        "then required)"))
    s.add_argument("--port", type=_port, default=DEFAULT_PORT, help="port (default %(default)s)")
    s.add_argument("--data", metavar="DIR", help="data directory (default $TORCHSCOPE_DATA or ~/.torchscope)")
    s.add_argument("--token", help="require this token for ingest and viewing (default $TORCHSCOPE_TOKEN)")
    s.add_argument("--db", metavar="URL", help="store URL; only sqlite:///PATH today -- relative to here, "
                                               "sqlite:////abs/path absolute (default $TORCHSCOPE_DB or DIR/torchscope.db)")
    talk = s.add_mutually_exclusive_group()  # "--quiet --verbose" is a mistake: say so, not pick one
    talk.add_argument("--quiet", action="store_true", help="print nothing but errors")
    talk.add_argument("--verbose", action="store_true", help="print uvicorn's log, with one line per request")

    o = command("open", "import a session file into the server and open it in the browser", (
        "Import a .tscope session file (a colleague's, or a run recorded without a server) into the "
        "dashboard server and open its page. The file is read, never changed. A file its run is still "
        "writing is followed: imported again as it grows, until the run ends (Ctrl-C stops following). "
        + _SERVER_ENV))
    o.add_argument("file", nargs="+", help="a .tscope session file (several: each imported; 2 to "
                   f"{MAX_COMPARE} runs open side by side on the Compare page, more on the sessions page; "
                   "a file that cannot be imported is named with the reason and the others are imported, "
                   "exit status 2)")
    _server_options(o, DEFAULT_PORT)
    o.add_argument("--data", metavar="DIR", help=_STARTED_DATA)
    o.add_argument("--no-browser", action="store_true", help="print the URL only")
    o.add_argument("--no-follow", action="store_true",
                   help="import a file its run is still writing as it is now, and return")

    d = command("demo", "run a small CPU training with capture and show it live", (
        "Train a small model on the CPU with torchscope.watch() and open its live dashboard. The run is "
        "also recorded to ./torchscope-runs/ (a .tscope file `torchscope open` reopens). " + _SERVER_ENV))
    _server_options(d, DEFAULT_PORT)
    d.add_argument("--steps", type=int, default=200, help="training steps (default %(default)s)")
    d.add_argument("--data", metavar="DIR", help=_STARTED_DATA)
    d.add_argument("--no-browser", action="store_true", help="print the URL only")

    i = command("info", "summarize session files (no server needed)", (
        "Print what a .tscope session file holds: its model, steps, captured graphs, ranks and how "
        "the run ended, without starting a server; one summary per file. A file cut short, or damaged "
        "part way, is summarized up to there, and a note says what was dropped."))
    i.add_argument("file", nargs="+", help="a .tscope session file (several: one summary each)")

    dr = command("doctor", "find common training bugs in session files (pitfalls P1-P18)", (
        "List the pitfalls found in a session file (P1-P18: a gradient that never reaches a layer, "
        "a missing zero_grad(), NaN/Inf, exploding gradients, evaluation left in train mode, ...), each with its "
        "steps, a one-line explanation and a fix; several files: each one's under a line naming it (--json: a list of "
        "{\"file\", \"findings\"}). Exit status: 0 no error-level finding (warnings and notes exit 0), "
        "1 an error-level finding, 2 an unreadable file (of several: any) or a bad option."))
    dr.add_argument("file", nargs="+", help="a .tscope session file (several: each diagnosed)")
    dr.add_argument("--json", action="store_true", help="print the findings as JSON")
    dr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help=f"override a doctor threshold (repeatable); keys: {_doctor_keys()}")
    return p


def _server_options(parser: argparse.ArgumentParser, default_port: int) -> None:
    parser.add_argument("--server", metavar="URL", help="the server's URL (default $TORCHSCOPE_SERVER, "
                        f"else http://127.0.0.1:{default_port})")
    parser.add_argument("--port", type=_port, help="the server on 127.0.0.1:PORT (instead of --server)")


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
    except (TypeError, UnicodeError):  # "encoding of hostname failed": a byte that is not UTF-8 (QA 53b)
        sock.close()
        raise CliError(f"cannot bind {host!r}:{port} (not a host name or address)", 2) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _lock_data_dir(data_dir: Path, url: str) -> int | None:
    """``datalock.acquire``, its refusal one line: "a torchscope server at URL (pid N) already
    uses the data directory D ..." (exit 2, as a port in use)."""
    from .datalock import DataDirInUse, acquire

    try:
        return acquire(data_dir, url)
    except DataDirInUse as exc:
        raise CliError(str(exc), 2) from None
    except OSError as exc:
        raise CliError(f"cannot lock the data directory {data_dir} ({exc.strerror})", 2) from None


def cmd_serve(args: argparse.Namespace) -> int:
    from .config import ConfigError, Settings, default_data_dir, lan_address, make_data_dir

    try:
        settings = Settings(data_dir=Path(args.data).expanduser() if args.data else default_data_dir(),
                            host=args.host, port=args.port, token=args.token, db_url=args.db)
        settings.db_path  # noqa: B018 - validates the --db URL before anything starts
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None
    if settings.data_dir.exists() and not settings.data_dir.is_dir():
        raise CliError(f"the data directory {settings.data_dir} is a file, not a directory: give --data a "
                       "directory (created if missing)", 2)
    # what the server writes (the SQLite store and its -wal, imports in progress) is never
    # readable by other users of the machine, whatever the umask (022 left the store 0644; QA 51c)
    os.umask(os.umask(0) | 0o007)
    try:
        make_data_dir(settings.data_dir)
    except OSError as exc:
        raise CliError(f"cannot create the data directory {settings.data_dir} ({exc.strerror})", 2) from None
    # one server per data directory, held for this process's life (the kernel lets it go with
    # the process, killed or not): two would both write the one store (QA 51c)
    lock = _lock_data_dir(settings.data_dir, settings.base_url())  # noqa: F841 - held open while serving
    try:
        kept = settings.keep_token()
    except OSError as exc:
        raise CliError(f"cannot create the data directory {settings.data_dir} ({exc.strerror})", 2) from None
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None
    sock = _bind(args.host, args.port)
    import uvicorn

    from .app import create_app
    from .client import page_url
    from .connections import timed_protocol

    app = create_app(settings)
    if not args.quiet:
        url = page_url(settings.base_url() + "/", settings.token)  # the token URL-encoded
        # the store's file where --db put it elsewhere (sqlite:///runs/ts.db is relative to here,
        # sqlite:////var/ts.db absolute, as SQLAlchemy reads them: QA 36c looked in the wrong place)
        where = settings.data_dir if settings.db_path.parent == settings.data_dir else settings.db_path.resolve()
        print(f"torchscope dashboard: {url}  (data: {where})", flush=True)
        if args.host in ("0.0.0.0", "::"):  # the URL above is this machine's own; colleagues need its address
            lan = lan_address()
            there = page_url(f"http://{lan or '<this machine>'}:{settings.port}/", settings.token)
            print(f"  from other machines: {there}  (bound to {args.host}: reachable from other machines)", flush=True)
        if kept is not None:
            path, made = kept
            print(f"  token: {'a new one, ' if made else ''}kept in {path} (the owner's alone) and used again at each "
                  "start on this data directory; delete the file for a new one, or give --token / $TORCHSCOPE_TOKEN",
                  flush=True)
    # uvicorn's own lines ("INFO: Started server process", one per request) only with --verbose:
    # the dashboard line above is what a user needs, and warnings and errors still show
    # Slow clients: a connection idle between requests is closed after timeout_keep_alive (the
    # transport reconnects, retrying once), one slow to send its headers after the read timeout
    # (timed_protocol), a stalled body answered 408 (the security middleware).  No
    # limit_concurrency: uvicorn counts open connections against it, so slow clients holding
    # connections would make it refuse everyone else (503), while descriptors are not bounded.
    config = uvicorn.Config(app, log_level="info" if args.verbose else "warning", access_log=args.verbose,
                            timeout_graceful_shutdown=3, timeout_keep_alive=5,
                            http=timed_protocol(settings.read_timeout_s))
    _server(config, app.fastapi.state.hub).run(sockets=[sock])
    return 0


def _server(config: uvicorn.Config, hub: LiveHub) -> uvicorn.Server:
    """uvicorn's server, ending the dashboards' live streams as it starts to stop: they never
    end by themselves, so a SIGTERM with a tab open waited the 3 s graceful timeout and logged
    "ERROR: Cancel 2 running task(s)" (QA 37d)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            hub.close()
            await super().shutdown(sockets)

    return Server(config)


# ---------------------------------------------------------------------- files
def _check_file(path_text: str) -> tuple[Path, Readable]:
    """A session file and what of it can be read (``sessionfile.salvage``), or a one-line
    CliError naming what is wrong with it (exit 2: bad input, as argparse's; `doctor` keeps 1
    for an error-level finding, told apart in CI)."""
    from torchscope.sessionfile import SessionFileError, salvage

    from .fileinfo import wrapped

    path = Path(path_text)
    if (why := wrapped(path)) is not None:  # (the import says it in the same words)
        raise CliError(why, 2)
    try:
        found = salvage(path)
    except SessionFileError as exc:
        raise CliError(str(exc), 2) from None
    if not found.frames:
        raise CliError(found.error(str(path)), 2)
    return path, found


def cmd_info(args: argparse.Namespace) -> int:
    from torchscope.sessionfile import SessionFileError

    from .fileinfo import summarize

    code = 0
    for n, name in enumerate(args.file):
        if n:
            print(flush=True)
        try:
            path, found = _check_file(name)
            try:
                info = summarize(path, found)
            except SessionFileError as exc:  # the checksums held; a record can still be bad
                raise CliError(str(exc), 2) from None
        except CliError as exc:
            if len(args.file) == 1:
                raise
            print(f"torchscope info: {exc}", file=sys.stderr, flush=True)
            code = max(code, exc.code)
            continue
        if len(args.file) > 1:
            info = {"file": name, **info}
        width = max(map(len, info)) + 2  # the longest label, its colon and a space
        for key, value in info.items():
            print(f"{key + ':':<{width}}{value}")
    return code


def _server_base(args: argparse.Namespace) -> str:
    """The server `open` and `demo` use: --server, --port, $TORCHSCOPE_SERVER or the default,
    as ``watch()`` finds it."""
    from torchscope.transport import DEFAULT_SERVER, base_url_hint, names_more_than_a_server, server_url

    if args.server and args.port:
        raise CliError("give --server or --port, not both", 2)
    if args.port:
        return f"http://127.0.0.1:{args.port}"
    origin, text = ("--server", args.server) if args.server else ("TORCHSCOPE_SERVER", os.environ.get("TORCHSCOPE_SERVER"))
    if not text:
        return DEFAULT_SERVER
    url = server_url(text)
    if url is None:
        sep = " " if origin.startswith("-") else "="
        raise CliError(f"{origin}{sep}{text!r} is not an http(s) URL (e.g. {DEFAULT_SERVER})", 2)
    if names_more_than_a_server(url):
        raise CliError(base_url_hint(origin, text), 2)
    return url


def _say_started(args: argparse.Namespace, base: str, started: subprocess.Popen[bytes] | None) -> None:
    """Where the server this command started in the background is, and how to stop it (said
    once it stays: one started for a file the server then refused is stopped again); or that
    --data went unused, the server already running."""
    if started is not None:
        from torchscope.transport import started_line

        print(f"torchscope {args.command}: {started_line(base, started.pid)}", file=sys.stderr, flush=True)
        from torchscope.transport import DEFAULT_SERVER, server_url

        from .client import health

        usual = (server_url(os.environ.get("TORCHSCOPE_SERVER") or "") or DEFAULT_SERVER).rstrip("/")
        if base.rstrip("/") != usual and health(usual):
            # a mistyped --server/--port starts a second, empty server (QA 42): the usual one is named
            print(f"torchscope {args.command}: note: no server answered at {base}, so this new one (with its own "
                  f"data) was started; a torchscope server is also running at {usual}", file=sys.stderr, flush=True)
    elif args.data and not _holds(base, args.data):  # (the server of that very directory: nothing to say)
        print(f"torchscope {args.command}: note: a server was already running at {base}; it stores the run in "
              f"its own data directory, not in --data {args.data}", file=sys.stderr, flush=True)


def _holds(base: str, data: str) -> bool:
    """Whether the server at ``base`` is the one that holds the data directory ``data``."""
    from .datalock import holder

    info = holder(Path(data).expanduser())
    return info is not None and str(info.get("url", "")).rstrip("/") == base.rstrip("/")


def _env_token() -> str | None:
    """$TORCHSCOPE_TOKEN as the server reads it; one that cannot be sent is a one-line error."""
    from torchscope.transport import UNSENDABLE_TOKEN, read_token, sendable

    token = read_token()
    if not sendable(token):
        raise CliError(f"TORCHSCOPE_TOKEN: {UNSENDABLE_TOKEN}", 2)
    return token


def cmd_open(args: argparse.Namespace) -> int:
    from .client import ClientError, ensure_server, page_url, sessions, stop_server, upload
    from .config import MAX_COMPARE

    several = len(args.file) > 1
    # every file checked before any is imported, and no server started for none; of several, a
    # bad one is said and the others imported (QA 51c: one stray file in runs/*.tscope imported
    # nothing, and named only the first bad one)
    files: list[tuple[Path, Readable]] = []
    refused = 0
    for name in args.file:
        try:
            files.append(_check_file(name))
        except CliError as exc:
            if not several:
                raise
            print(f"torchscope open: {exc}", file=sys.stderr, flush=True)
            refused += 1
    if not files:
        raise CliError(f"none of the {len(args.file)} files was imported (each is said above)", 2)
    token = _env_token()
    started = None
    try:
        base, started = ensure_server(_server_base(args), args.data)
        # a server that wants a token says so now: refused mid-upload, the socket would only say
        # "broken pipe"
        sessions(base, token)
    except ClientError as exc:
        if started is not None:
            stop_server(started)
        raise CliError(str(exc), exc.code) from None
    follow = not several and not args.no_follow  # several: each as it is now (QA 48d: one file only)
    imported: list[dict[str, Any]] = []
    for path, found in files:
        try:
            with _storing_progress(base, token, path):
                res = upload(base, path, token)
        except ClientError as exc:
            if several and exc.code == 2:  # this file refused by the server (its words name it): the others go on
                print(f"torchscope open: {exc}", file=sys.stderr, flush=True)
                refused += 1
                continue
            if started is not None and not imported:
                stop_server(started)
            raise CliError(f"{path}: {exc}" if several else str(exc), exc.code) from None
        if not imported:
            _say_started(args, base, started)
        writer = _writer(path, found)
        # a run this server holds every frame of already (it streams here): nothing was imported,
        # so no "imported as it is now" beside it (QA 51c: both lines, contradicting each other)
        already = res.get("frames", 0) > 0 and res.get("new_frames") == 0
        running = writer is not None and not already
        note = res.get("note") or found.note(str(path), writer is not None)  # (a server of an earlier build says nothing)
        if note and not (writer is not None and (follow or already)):  # followed: said below
            print(f"torchscope open: note: {note}", file=sys.stderr, flush=True)
        if running and several:  # (QA 48e: neither followed, nothing said)
            print(f"torchscope open: note: {path}'s run is still writing it: imported as it is now (one file "
                  f"at a time is followed: torchscope open {path})", file=sys.stderr, flush=True)
        elif running and not follow:  # --no-follow (QA 49b: nothing said, and it read "killed")
            print(f"torchscope open: note: {path}'s run is still writing it: imported as it is now; open it again "
                  "for the rest (without --no-follow, open follows it to its end)", file=sys.stderr, flush=True)
        if already:  # as the sessions page says it
            given = "; its name and tags from the file were given to it" if res.get("labeled") else ""
            print(f"torchscope open: {path} is already on this server (the same run): nothing new imported{given}",
                  file=sys.stderr, flush=True)
        print(page_url(base + res["url"], token), flush=True)
        imported.append({**res, "writer": writer})
    if not imported:
        if started is not None:
            stop_server(started)
        raise CliError(f"none of the {len(args.file)} files was imported (each is said above)", 2)
    ids = list(dict.fromkeys(str(r["id"]) for r in imported))
    if len(ids) == 2:  # two runs: side by side, as ticking them on the sessions page does
        url = page_url(f"{base}/compare?a={ids[0]}&b={ids[1]}", token)
        print(f"torchscope open: both runs side by side: {url}", file=sys.stderr, flush=True)
    elif 2 < len(ids) <= MAX_COMPARE:  # a sweep's files: all of them on the Compare page
        url = page_url(f"{base}/compare?{urllib.parse.urlencode({'runs': ','.join(ids)})}", token)
        print(f"torchscope open: all {len(ids)} runs side by side: {url}", file=sys.stderr, flush=True)
    else:
        url = page_url(base + (str(imported[0]["url"]) if len(ids) == 1 else "/"), token)
        if len(ids) > MAX_COMPARE:  # (QA 52a: their URLs and not a word why no Compare page)
            print(f"torchscope open: {len(ids)} runs: Compare shows at most {MAX_COMPARE} side by side; tick the "
                  f"ones to compare on the sessions page: {url}", file=sys.stderr, flush=True)
    if not args.no_browser:
        import webbrowser

        webbrowser.open(url)
    if refused:  # the lines above said why, each; this says what came of the whole command
        print(f"torchscope open: {len(imported)} of {len(args.file)} files imported; {refused} refused (said "
              "above)", file=sys.stderr, flush=True)
        return 2
    if follow and imported[0]["writer"] is not None:
        return _follow(base, files[0][0], token, imported[0]["writer"])
    return 0


FOLLOW_EVERY_S = 1.0  # how often a followed file is looked at (longer while its imports take longer)


def _writer(path: Path, found: Readable) -> dict[str, Any] | None:
    """The session event of a file whose run is still writing it on this machine (its process
    runs, and the file has no end event yet), else None."""
    from torchscope.session import writer_alive
    from torchscope.sessionfile import FLAG_SERIES, SessionFileError, iter_events

    frames = [f for f in found.frames if not f.flags & FLAG_SERIES]
    try:
        session = next((ev for ev in iter_events(path, frames[:4]) if ev.get("kind") == "session"), None)
    except (SessionFileError, OSError, ValueError):
        return None
    return session if session is not None and writer_alive(session) and not _ended(path, frames) else None


def _ended(path: Path, frames: list[FrameInfo] | None = None) -> bool:
    """Whether the file holds its run's end event (the last frame but the series frames after it)."""
    from torchscope.sessionfile import FLAG_SERIES, SessionFileError, index, iter_events

    try:
        if frames is None:
            frames = [f for f in index(path)[1] if not f.flags & FLAG_SERIES]
        return any(ev.get("kind") == "end" for ev in iter_events(path, frames[-1:]))
    except (SessionFileError, OSError, ValueError):
        return False


def _follow(base: str, path: Path, token: str | None, session: dict[str, Any]) -> int:
    """Import a file again whenever it grew, until its run ends (its process is gone), so the
    page shows the run as it goes on; Ctrl-C stops following and leaves what was imported."""
    from torchscope.session import writer_alive

    from .client import ClientError, upload

    print(f"torchscope open: {path} is still being written by its run (pid {session.get('pid')}): following it, "
          "the page shows each step as it comes -- Ctrl-C stops following (what was imported stays)",
          file=sys.stderr, flush=True)
    size = -1  # (it may have grown since the first import read it)
    wait = FOLLOW_EVERY_S
    try:
        while True:
            time.sleep(wait)
            # read before the size: the bytes that made it so are in what is imported next
            ended = _ended(path)
            gone = not writer_alive(session)
            now = path.stat().st_size
            if now != size:
                t0 = time.monotonic()
                upload(base, path, token, quiet=True)
                size = now
                wait = max(FOLLOW_EVERY_S, 2 * (time.monotonic() - t0))  # a big file: fewer imports
            if ended or gone:
                how = "has ended" if ended else "stopped without ending it (killed?)"
                print(f"torchscope open: {path}'s run {how}; the whole file is imported", file=sys.stderr, flush=True)
                return 0
    except KeyboardInterrupt:
        print(f"torchscope open: stopped following {path}; what was imported stays on the server",
              file=sys.stderr, flush=True)
        return 0
    except (ClientError, OSError) as exc:
        raise CliError(f"following {path} stopped: {exc}", 1) from None


@contextlib.contextmanager
def _storing_progress(base: str, token: str | None, path: Path) -> Iterator[None]:
    """On a terminal, while the server reads an uploaded file into its store (the long part
    of a big import): a progress bar of the bytes of frames it has read, polled from
    ``GET /api/ingest/imports`` in a thread (the upload's own bar is the client's)."""
    if not (sys.stderr.isatty() and path.stat().st_size > 1024 * 1024):
        yield
        return
    from .client import form_name
    from .upload import safe_name

    stop = threading.Event()
    # the name the server gives the upload (the one `upload` sends, made safe)
    poller = threading.Thread(target=_poll_import, args=(base, token, safe_name(form_name(path.name)), stop),
                              daemon=True)
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
    token = _env_token()
    try:
        base, started = ensure_server(_server_base(args), args.data)
        known = {s["id"] for s in sessions(base, token)}  # and a server that wants a token says so now
    except ClientError as exc:
        raise CliError(str(exc), exc.code) from None
    _say_started(args, base, started)
    # (its watch() reads $TORCHSCOPE_TOKEN as this command did)
    proc = subprocess.Popen([sys.executable, "-m", "torchscope.demo_train", "--server", base,
                             "--steps", str(args.steps)])
    try:
        page = _demo_session(base, token, known, proc)
        url = page_url(page or base + "/", token)
        # one write: the demo's training prints its losses into the same terminal (or pipe),
        # and print()'s separate write of the newline let a loss line land inside the URL's
        sys.stdout.write(url + "\n")
        sys.stdout.flush()
        if page:
            print(f"torchscope demo: that page is its transformer run; its MLP run is beside it in the sessions "
                  f"list at {page_url(base + '/', token)}", file=sys.stderr, flush=True)
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
        kept = f" (the server keeps running in the background: stop it with `kill {started.pid}`)" if started else ""
        print(f"demo finished; the dashboard stays at {page_url(base + '/', token)}{kept}", file=sys.stderr)
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
    names = [str(Path(name)) for name in args.file]  # as the reader's messages name them
    refused: dict[str, str] = {}  # of several files, those that cannot be read: said in their turn
    for name in names:
        try:
            _check_file(name)
        except CliError as exc:
            if len(names) == 1 and not args.json:  # (--json: said as JSON by run_files)
                raise
            refused[name] = str(exc)
    overrides: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--set {item!r}: expected KEY=VALUE", 2)
        overrides[key.strip()] = value.strip()
    try:
        from torchscope.doctor.cli import run_files
    except ImportError as exc:
        raise CliError(f"the doctor is not available in this install ({exc})") from None
    return int(run_files(names, args.json, overrides, refused))


COMMANDS = {"serve": cmd_serve, "open": cmd_open, "demo": cmd_demo, "info": cmd_info, "doctor": cmd_doctor}


def _command_parser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The subcommand's parser (the top-level one for none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]  # type: ignore[no-any-return]
    return parser


def escaping_stdout() -> None:
    """A file name that is not UTF-8 (a Latin-1 name from an old disk: Python holds each such
    byte as a surrogate escape) printed where stdout refuses it -- a UTF-8 locale's stdout is
    strict -- raised UnicodeEncodeError mid-output (QA 53b: `info a.tscope b<0xff>.tscope`, the
    doctor's ``==> FILE <==``): written escaped instead (``\\udcff``), as stderr writes it.  (A
    C, POSIX or C.UTF-8 locale's stdout writes the name's own bytes: left so.)"""
    if isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.errors == "strict":
        with contextlib.suppress(ValueError, OSError):
            sys.stdout.reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None, prog: str = "torchscope") -> int:
    escaping_stdout()
    parser = build_parser(prog)
    args, extra = parser.parse_known_args(argv)
    if extra:
        # said by the command's own parser ("torchscope doctor: unrecognized arguments: b.tscope
        # (see torchscope doctor --help)"): argparse says it as the top-level one's
        _command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except CliError as exc:
        # "torchscope open: ...", as argparse's errors and the doctor's own lines name the command
        print(f"torchscope {args.command}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    # (run by capture/__main__.py for `python -m torchscope`, which names itself so; popped: the
    # servers and scripts this command starts are not that command)
    sys.exit(main(prog=os.environ.pop("TORCHSCOPE_PROG", "torchscope")))
