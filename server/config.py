"""Server settings in one place: the CLI flags, the environment and the app read them here."""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import secrets
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from torchscope.transport import UNSENDABLE_TOKEN, read_token, sendable

# runs the Compare page shows at once: lines a chart and columns the facts table stay readable
# with (frontend/colors.js has a colour for each), also what `torchscope open` of a sweep opens
MAX_COMPARE = 8

DEFAULT_PORT = 6150
DEFAULT_HOST = "127.0.0.1"
# A session whose writer has not been heard from for this long is "ended unexpectedly".
RUNNING_TIMEOUT_S = 30.0
# How often the server looks for such sessions to diagnose (an ended run is diagnosed at its end).
SILENT_SWEEP_S = 5.0
# Body limits: one ingest POST carries whole frames (a frame may be up to MAX_FRAME_BYTES);
# an import carries a whole file; everything else is a small JSON document.
MAX_INGEST_BYTES = 80 * 1024 * 1024
MAX_IMPORT_BYTES = 4 * 1024 * 1024 * 1024
MAX_OTHER_BYTES = 64 * 1024
TOKEN_COOKIE = "torchscope_token"
# Slow clients (slowloris): a connection must send a request's headers within this many
# seconds (of connecting, or of starting its next request), and a request body may not pause
# longer than this, nor arrive slower than MIN_BODY_RATE bytes/s on average once this much
# time has passed; otherwise the connection is closed (a slow body is answered 408 first).  Far
# more than any client needs on a slow link, and it bounds how long a client that sends
# nothing, or a byte now and then, holds a connection (uvicorn has no such limit).
# $TORCHSCOPE_READ_TIMEOUT sets another (seconds).
READ_TIMEOUT_S = 30.0
MIN_BODY_RATE = 500  # bytes/s, as Apache's mod_reqtimeout asks of a body by default


# The generated token of a server bound beyond loopback without one, kept in its data directory
# (the owner's alone) so a restart keeps it: links, bookmarks and running jobs' $TORCHSCOPE_TOKEN
# stayed valid only until the next restart (QA 51c).
TOKEN_FILE = "token"


class ConfigError(ValueError):
    """A bad setting; the message is one line for the CLI."""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _v

    try:
        return _v("torchscope")
    except PackageNotFoundError:
        return "0.0.0"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_timeout() -> float:
    """``READ_TIMEOUT_S``, or $TORCHSCOPE_READ_TIMEOUT when set."""
    text = os.environ.get("TORCHSCOPE_READ_TIMEOUT", "").strip()
    if not text:
        return READ_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"TORCHSCOPE_READ_TIMEOUT={text!r}: give a number of seconds above 0")
    return value


def default_data_dir() -> Path:
    return Path(os.environ.get("TORCHSCOPE_DATA", "~/.torchscope")).expanduser()


def sqlite_path(db_url: str | None, data_dir: Path) -> Path:
    """Resolve the store URL.  Only SQLite exists today; the URL form is where a
    ``postgresql://`` team store would plug in without touching the API."""
    if not db_url:
        return data_dir / "torchscope.db"
    if db_url.startswith("sqlite:///"):
        return Path(db_url[len("sqlite:///") :]).expanduser()
    scheme = db_url.split(":", 1)[0]
    raise ConfigError(f"unsupported --db {scheme!r}: only sqlite:///PATH is supported today")


def make_data_dir(path: Path) -> None:
    """Create the data directory (and its parents) if missing, the directory itself readable by
    its owner only: it holds every run and the token, and on a shared machine the 0755 that
    the usual umask gives let every local user read the store (QA 51c).  One that exists is left
    as it is."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)


def kept_token(data_dir: Path) -> tuple[str, bool]:
    """The token kept in ``data_dir`` (created, 0600, on first use); and whether it was created
    now.  The file is written whole under another name and linked into place, so two servers
    starting at once on one directory read the same token, never a half-written one."""
    path = data_dir / TOKEN_FILE
    for _ in range(2):
        try:
            token = read_token(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the token file {path} ({exc}): fix or delete it") from None
        else:
            if token is None or not sendable(token):
                raise ConfigError(f"the token file {path} holds no usable token: delete it (a new one is made) "
                                  "or write one printable word in it")
            return token, False
        token = secrets.token_urlsafe(24)
        try:
            fd, tmp = tempfile.mkstemp(prefix=".token-", dir=data_dir)  # 0600, as mkstemp makes it
        except OSError as exc:
            raise ConfigError(f"cannot keep the token in {path} ({exc.strerror})") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(token + "\n")
            os.link(tmp, path)
        except FileExistsError:
            continue  # another server made it meanwhile: read that one
        except OSError as exc:
            raise ConfigError(f"cannot keep the token in {path} ({exc.strerror})") from None
        finally:
            os.unlink(tmp)
        return token, True
    raise ConfigError(f"cannot keep the token in {path}")  # (made and gone between two looks)


def lan_address() -> str | None:
    """This machine's address on its network, as other machines reach it (the one the default
    route leaves from), else its host name; None when it has neither."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))  # a datagram socket's connect sends nothing: it picks the route
        address = str(s.getsockname()[0])
        if not ipaddress.ip_address(address).is_loopback and address != "0.0.0.0":
            return address
    name = socket.gethostname()
    return name if name and name != "localhost" else None


@dataclass
class Settings:
    data_dir: Path = field(default_factory=default_data_dir)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = None  # required for ingest and viewing when set
    db_url: str | None = None
    read_timeout_s: float = field(default_factory=read_timeout)
    # the token was generated here (exposed without one given): `keep_token` swaps in the kept one
    generated_token: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).expanduser()
        # an empty token is no token (``--token "$TORCHSCOPE_TOKEN"`` with the variable unset):
        # never one that an empty cookie or ``?token=`` would match
        self.token = read_token(self.token)
        if not sendable(self.token):
            raise ConfigError(f"{UNSENDABLE_TOKEN}: choose one without")
        if self.db_url is None:
            self.db_url = os.environ.get("TORCHSCOPE_DB") or None
        # Exposed beyond this machine: never without a token.
        if self.token is None and not is_loopback(self.host):
            self.token = secrets.token_urlsafe(24)
            self.generated_token = True

    def keep_token(self) -> tuple[Path, bool] | None:
        """A generated token replaced by the one kept in the data directory (which must exist),
        made on its first start: the file, and whether it was made now; None when the token was
        given (it wins, and nothing is written)."""
        if not self.generated_token:
            return None
        self.token, made = kept_token(self.data_dir)
        return self.data_dir / TOKEN_FILE, made

    @property
    def db_path(self) -> Path:
        return sqlite_path(self.db_url, self.data_dir)

    @property
    def allowed_hosts(self) -> set[str]:
        return {self.host.strip("[]"), "localhost", "127.0.0.1", "::1"}

    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"
