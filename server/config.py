"""Server settings in one place: the CLI flags, the environment and the app read them here."""

from __future__ import annotations

import ipaddress
import math
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from torchscope.transport import UNSENDABLE_TOKEN, read_token, sendable

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


@dataclass
class Settings:
    data_dir: Path = field(default_factory=default_data_dir)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = None  # required for ingest and viewing when set
    db_url: str | None = None
    read_timeout_s: float = field(default_factory=read_timeout)

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
