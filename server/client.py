"""What the CLI needs from a server: find one on a port, start one in the background,
upload a session file.  Standard library only (urllib), so the CLI stays light."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchscope.transport import NEEDS_TOKEN, WRONG_TOKEN, local_port

from .config import make_data_dir


class ClientError(RuntimeError):
    """One line for the user; ``code`` is the exit status (2: the input was bad)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def refused(base: str, token: str | None) -> ClientError:
    """The error of a 401: no token given, or a wrong one."""
    return ClientError(f"the server at {base} {WRONG_TOKEN if token else NEEDS_TOKEN}")


def page_url(url: str, token: str | None) -> str:
    """The URL to open in a browser: with ``?token=`` when the server needs one (the page then
    keeps it in a cookie)."""
    if not token:
        return url
    return f"{url}{'&' if '?' in url else '?'}{urllib.parse.urlencode({'token': token})}"


def sessions(base: str, token: str | None) -> list[dict[str, Any]]:
    """The server's session list ([] when it cannot be read); a ClientError when it wants a token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(base + "/api/sessions", headers=headers), timeout=5) as r:
            data = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise refused(base, token) from None
        return []
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def health(base: str, timeout: float = 1.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(base + "/api/health", timeout=timeout) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("ok") is True else None


# how long a port that takes connections and answers nothing is waited for: a server binds its
# port first and answers ~1 s later (more on a loaded machine or with a large store to open)
_STARTING_WAIT_S = 15.0


def _silent(base: str) -> bool:
    """Whether the port takes connections and answers nothing (no HTTP response within a
    second): a torchscope server binds its port before it opens its store, so one still
    starting looks so; another program that answers with anything else is not waited for."""
    try:
        with urllib.request.urlopen(base + "/api/health", timeout=1.0):
            return False
    except urllib.error.HTTPError:
        return False
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, TimeoutError)
    except TimeoutError:
        return True
    except (OSError, ValueError):
        return False


def _started_meanwhile(base: str, deadline: float) -> bool:
    """Whether a torchscope server answers at ``base`` before ``deadline``, while its port stays
    silent: another command (a training script's watch(), a second `torchscope open`) started it
    a moment ago and it is opening its store."""
    while time.monotonic() < deadline:
        if health(base):
            return True
        if not _silent(base):
            return bool(health(base))
    return False


def ensure_server(
    base: str, data: str | None = None, timeout: float = 30.0
) -> tuple[str, subprocess.Popen[bytes] | None]:
    """``base`` when a torchscope server answers there; else, for a loopback URL with a port
    (``transport.local_port``), a server started there in its own process session (so it
    outlives this command and the user can keep browsing), and that process (None: a server
    was already running)."""
    if health(base):
        return base, None
    port = local_port(base)
    if port is None:
        raise ClientError(f"no torchscope server answers at {base}")
    if _listening(port):
        if _silent(base):
            print(f"torchscope: port {port} takes connections but answers nothing yet (a server starting?); "
                  f"waiting up to {_STARTING_WAIT_S:.0f} s", file=sys.stderr, flush=True)
            if _started_meanwhile(base, time.monotonic() + _STARTING_WAIT_S):
                return base, None
        elif health(base):  # a server that bound the port after the first look, and answers now (QA 49d)
            return base, None
        # 2 as `serve` says it: the --port given cannot be used
        raise ClientError(f"port {port} is in use by another program (not a torchscope server); choose another with --port", 2)
    cmd = [sys.executable, "-m", "torchscope.server.cli", "serve", "--port", str(port), "--quiet"]
    if data:
        cmd += ["--data", data]
    log_dir = Path(data).expanduser() if data else Path(os.environ.get("TORCHSCOPE_DATA", "~/.torchscope")).expanduser()
    if (other := _serving(log_dir, base)) is not None:  # one server per data directory: that one
        return other, None
    if log_dir.exists() and not log_dir.is_dir():  # as `serve` says it (it read "cannot write the server's log")
        raise ClientError(f"the data directory {log_dir} is a file, not a directory: give --data a directory "
                          "(created if missing)", 2)
    try:
        make_data_dir(log_dir)  # (the server's own data directory: owner only, as `serve` makes it)
        log = os.fdopen(os.open(log_dir / "server.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")
    except OSError as exc:
        raise ClientError(f"cannot write the server's log in {log_dir} ({exc.strerror})", 2) from None
    with log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if health(base):
            return base, proc
        if proc.poll() is not None:
            # its port taken by a server another command started after the check above
            if _started_meanwhile(base, deadline):
                return base, None
            if (other := _serving(log_dir, base)) is not None:  # one started on that data directory meanwhile
                return other, None
            raise ClientError(f"could not start a server on port {port} (see {log_dir / 'server.log'}); "
                              "choose another with --port")
        time.sleep(0.1)
    stop_server(proc)
    raise ClientError(f"the server on port {port} did not answer within {timeout:.0f}s")


def _serving(data_dir: Path, asked: str) -> str | None:
    """The URL of the server that holds ``data_dir`` (``datalock``), once it answers, said on
    stderr: a server cannot be started on a data directory another one uses, and the file the
    user opens belongs in that one's store.  None when no server holds it.  A ClientError when
    one holds it and does not answer (bound elsewhere, or hung)."""
    from .datalock import holder

    info = holder(data_dir)
    deadline = time.monotonic() + 2.0
    while info is not None and not info.get("url") and time.monotonic() < deadline:  # written a moment after the lock
        time.sleep(0.1)
        info = holder(data_dir)
    if info is None:
        return None
    url, pid = info.get("url"), info.get("pid")
    who = f"a torchscope server{f' (pid {pid})' if isinstance(pid, int) else ''}"
    if isinstance(url, str) and (health(url) or _started_meanwhile(url, time.monotonic() + _STARTING_WAIT_S)):
        print(f"torchscope: note: no server answered at {asked}, and {who} at {url} uses the data directory "
              f"{data_dir} (one server per data directory): using that one", file=sys.stderr, flush=True)
        return url
    raise ClientError(f"no server answered at {asked}, and {who}{f' at {url}' if isinstance(url, str) else ''} "
                      f"already uses the data directory {data_dir} but does not answer; stop it, or give --data "
                      "another directory")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """End a server this command started for nothing (its import failed): no server is left
    behind on the port, holding a store the user never saw."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:port."""
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _progress(done: int, total: int, label: str) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done / 2**20:.1f}/{total / 2**20:.1f} MiB")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def form_name(name: str) -> str:
    """A file name as a multipart ``filename="..."`` carries it: UTF-8 text, its quote and line
    breaks percent-encoded as browsers send them.  A name that is not UTF-8 (a Latin-1 name from
    an old disk: Python holds each such byte as a surrogate escape, ``\\udcff``) has ``?`` for
    those (QA 53b: a UnicodeEncodeError traceback); the server reduces every name to
    ``upload.safe_name``'s characters anyway."""
    text = name.encode("utf-8", "replace").decode("utf-8")
    return text.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


def upload(base: str, path: Path, token: str | None = None, quiet: bool = False) -> dict[str, Any]:
    """POST the file to /api/sessions/import as multipart; a progress bar for big files (not
    ``quiet``).  The bytes it has now: a file its run still writes grows as it is read."""
    boundary = uuid.uuid4().hex
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{form_name(path.name)}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    size = path.stat().st_size
    show = size > 1024 * 1024 and sys.stderr.isatty() and not quiet  # a terminal: a person waiting on it

    def body() -> Iterator[bytes]:
        yield head
        sent = 0
        with open(path, "rb") as f:
            while sent < size and (chunk := f.read(min(1 << 20, size - sent))):
                sent += len(chunk)
                if show:
                    _progress(sent, size, "importing")
                yield chunk
        if show:  # the upload is quick; reading every step into the store is the wait
            sys.stderr.write(f"the server is reading {path.name}'s steps...\n")
            sys.stderr.flush()
        yield tail

    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}",
               "Content-Length": str(len(head) + size + len(tail))}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(base + "/api/sessions/import", data=body(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise refused(base, token) from None
        try:
            detail = json.loads(exc.read()).get("detail", exc.reason)
        except ValueError:
            detail = exc.reason
        if exc.code in (503, 507):  # the server cannot store anything now: its words alone
            raise ClientError(f"the server at {base} could not import {path.name}: {detail}") from None
        # 4xx: the file (a body the server could not read), in the server's words when they name it
        if exc.code < 500 and path.name in str(detail):
            raise ClientError(str(detail), 2) from None
        raise ClientError(f"the server refused {path}: {detail}", 2 if exc.code < 500 else 1) from None
    except OSError as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
            # it answered the connection, then dropped it mid-upload: it is there, the upload failed
            raise ClientError(f"the server at {base} closed the connection during the upload of {path.name} "
                              f"({reason}); see its log") from None
        raise ClientError(f"could not reach the server at {base} ({exc})") from None
