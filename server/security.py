"""Who may talk to the server: a pure ASGI middleware (so SSE streams pass untouched).

- Host header check against DNS rebinding: a page on evil.example whose name re-resolves
  to 127.0.0.1 still sends ``Host: evil.example``; only the bound address and the loopback
  names are served, compared as DNS compares names (``LOCALHOST`` and ``localhost.`` too).
  (With a token required the token is the guard, so any Host is fine: behind Docker or a
  LAN the name the client uses is not known in advance.)
- Token: when set, every request but /api/health needs it as ``Authorization: Bearer``,
  ``?token=``, or the cookie set when a page was opened with ``?token=``.
- Cross-origin writes: a page of another site can send a POST/PATCH/DELETE without reading
  the answer (a form, ``fetch(..., {mode: "no-cors"})``), and the Host it sends is ours.
  The browser says where the request comes from: ``Sec-Fetch-Site`` (anything but
  ``same-origin``/``none`` is refused) or, from older browsers, ``Origin`` (refused unless it
  names the host the request went to).  Clients that are not browsers (the training
  process, ``torchscope open``, curl) send neither and pass.
- Body size limits per route family; CORS stays closed (no CORS headers are ever sent).
- Slow bodies: one that pauses too long, or trickles in a byte at a time, is answered 408 and
  its connection closed (uvicorn has no read timeout; ``connections.py`` times the headers).
"""

from __future__ import annotations

import asyncio
import html
import ipaddress
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .config import MAX_IMPORT_BYTES, MAX_INGEST_BYTES, MAX_OTHER_BYTES, MIN_BODY_RATE, TOKEN_COOKIE

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = ("/api/health",)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def cross_origin(headers: dict[bytes, bytes]) -> str | None:
    """Where a browser's write came from when that is not this server's own page, else None."""
    site = headers.get(b"sec-fetch-site")
    if site is not None:
        s = site.decode("latin-1").strip().lower()
        return None if s in ("same-origin", "none") else f"a {s} page"
    origin = headers.get(b"origin")
    if origin is None:
        return None
    o = origin.decode("latin-1").strip()
    netloc = urlsplit(o).netloc.lower() if o != "null" else ""
    # behind a reverse proxy the Host is the proxy's upstream; the name the browser used is forwarded
    ours = {headers.get(b"host", b"").decode("latin-1").lower(),
            headers.get(b"x-forwarded-host", b"").decode("latin-1").lower()}
    return None if netloc and netloc in ours else f"the page at {o}"


def body_limit(path: str) -> int:
    if path.startswith("/api/ingest/"):
        return MAX_INGEST_BYTES
    if path == "/api/sessions/import":
        return MAX_IMPORT_BYTES
    return MAX_OTHER_BYTES


def host_name(host_header: str) -> str:
    """``[::1]:6150`` -> ``::1``; ``localhost:6150`` -> ``localhost``."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def canonical_host(host: str) -> str:
    """A host name as DNS compares it: case does not count, and ``localhost.`` (the fully
    qualified form, with its root dot) is ``localhost``."""
    host = host.lower()
    return host[:-1] if host.endswith(".") else host


async def _reply(send: Send, status: int, detail: str, close: bool = False) -> None:
    """A one-line JSON answer; ``close``: the connection ends with it (uvicorn honours the
    header), as after a body that stalled: its rest would never be read."""
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# What a browser shows at a tokened server's address opened without the token (a person, not a
# script: a JSON error body would be all they see)
_TOKEN_PAGE = b"""<!doctype html><html><head><meta charset="utf-8"><title>torchscope: token needed</title>
<style>body{font:15px/1.5 system-ui,sans-serif;max-width:40em;margin:4em auto;padding:0 1em}code{background:#eee;padding:0 4px}</style>
</head><body><h1>This torchscope server needs its token</h1>
<p>It opens only with the token it printed when it started%(why)s
(a token given that is not it is refused too):
open the URL it printed (it ends in <code>?token=...</code>), or add <code>?token=</code> and the token to this
address. Your browser then keeps it for this server.</p>
<p>Training scripts and the <code>torchscope</code> command read it from <code>TORCHSCOPE_TOKEN</code>.</p>
</body></html>"""


def token_page(reachable: bool) -> bytes:
    """The page, saying why the token is asked only where it is so: a server bound to a
    loopback address with ``--token`` is not reachable from other machines."""
    why = b", as it is reachable from other machines" if reachable else b""
    return _TOKEN_PAGE % {b"why": why}


def _page_load(scope: Scope, headers: dict[bytes, bytes]) -> bool:
    """A browser opening a page (a person reads the answer), not a script's or a page's request."""
    return scope.get("method") == "GET" and b"text/html" in headers.get(b"accept", b"")


async def _reply_page(send: Send, status: int, page: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/html; charset=utf-8"),
                            (b"content-length", str(len(page)).encode())]})
    await send({"type": "http.response.body", "body": page})


# What a browser shows at an address this server does not serve (``http://0.0.0.0:6150``, a name
# of this machine): the way to one it serves, not the JSON refusal an API client gets
_HOST_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>torchscope: open it at its own address</title>
<style>body{font:15px/1.5 system-ui,sans-serif;max-width:40em;margin:4em auto;padding:0 1em}code{background:#eee;padding:0 4px}</style>
</head><body><h1>Open torchscope at <a href="%(url)s">%(url)s</a></h1>
<p>This torchscope server answers only at the address it is bound to, <code>localhost</code> and
<code>127.0.0.1</code>, not at <code>%(host)s</code>: so a web page whose name is made to point at this
machine cannot read your runs (DNS rebinding). To open it under another name, start it with
<code>torchscope serve --host 0.0.0.0</code>, which then asks for the token it prints.</p>
</body></html>"""


def host_page(host_header: str, server: tuple[str | None, int | None]) -> bytes:
    """The page for a refused ``Host``; its link is the address the connection came in on (the
    server's socket: ``[::1]`` for a server bound there) and keeps the port the browser used (a
    forwarded port may not be the one the server is bound to)."""
    host = host_name(host_header)
    tail = host_header.rpartition(":")[2] if host_header != host else ""
    port = tail if tail.isdigit() else str(server[1] or "")
    try:
        ip = ipaddress.ip_address(server[0] or "")
        local = f"[{ip}]" if ip.version == 6 else str(ip)
    except ValueError:  # no socket address (an in-process client)
        local = "127.0.0.1"
    url = f"http://{local}{f':{port}' if port else ''}/"
    return (_HOST_PAGE % {"url": url, "host": html.escape(host)}).encode()


class SecurityMiddleware:
    def __init__(self, app: ASGIApp, allowed_hosts: set[str], token: str | None, reachable: bool = True,
                 read_timeout: float | None = None) -> None:
        """``read_timeout``: the longest a request body may pause, and its grace before it must
        keep ``MIN_BODY_RATE`` (``_body_wait``); None: no limit."""
        self.app = app
        self.allowed_hosts = {canonical_host(h) for h in allowed_hosts}
        self.token = token
        self.read_timeout = read_timeout
        self._token_page = token_page(reachable)  # ``reachable``: bound to a non-loopback address

    def _token_of(self, scope: Scope, headers: dict[bytes, bytes]) -> str | None:
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if "token" in query:
            return query["token"][0]
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get(b"cookie", b"").decode("latin-1"))
        except Exception:  # a malformed cookie header is just no cookie
            return None
        morsel = cookie.get(TOKEN_COOKIE)
        return morsel.value if morsel else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        path: str = scope.get("path", "")
        if self.token is None:
            host = host_name(headers.get(b"host", b"").decode("latin-1"))
            if canonical_host(host) not in self.allowed_hosts:
                if _page_load(scope, headers):
                    server = scope.get("server") or (None, None)
                    await _reply_page(send, 400, host_page(headers.get(b"host", b"").decode("latin-1"), server))
                else:
                    await _reply(send, 400, f"Host {host!r} is not served here (DNS rebinding protection)")
                return
        elif path not in OPEN_PATHS:
            given = self._token_of(scope, headers)
            if given is None or not secrets.compare_digest(given.encode(), self.token.encode()):
                if _page_load(scope, headers):
                    await _reply_page(send, 401, self._token_page)
                elif given is None:
                    await _reply(send, 401, "this torchscope server needs its token (open the URL it printed)")
                else:
                    await _reply(send, 401, "the token given is not this torchscope server's (open the URL it printed)")
                return
        if scope.get("method", "GET") not in SAFE_METHODS and (where := cross_origin(headers)) is not None:
            await _reply(send, 403, f"a write from {where} is refused: only torchscope's own pages may change data")
            return
        limit = body_limit(path)
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > limit
            except ValueError:
                await _reply(send, 400, "bad Content-Length")
                return
            if too_big:
                await _reply(send, 413, f"request body over the {limit} byte limit")
                return
        received = 0
        refused = False  # the body went over the limit, or stalled: the 413 or 408 sent is the answer
        started = False
        body_done = False
        body_began: float | None = None

        async def limited_receive() -> Message:
            # Counted as it arrives (a chunked body has no Content-Length): over the limit, the
            # 413 goes out here and the app sees the client gone (it would turn an exception
            # raised into its body parser's 400 or a 500).  Paced while the body is incomplete
            # (``_body_wait``): a client that stops sending it, or sends a byte now and then
            # (slowloris), gets a 408 and the connection closed.  Once the body is whole, a
            # receive waits for the client to leave (a streamed answer, such as the live
            # channel's, listens for that): no limit then.
            nonlocal received, refused, body_done, body_began
            if refused:
                return {"type": "http.disconnect"}
            if body_done or self.read_timeout is None:
                msg = await receive()
            else:
                now = asyncio.get_running_loop().time()
                body_began = now if body_began is None else body_began
                try:
                    msg = await asyncio.wait_for(receive(), _body_wait(self.read_timeout, body_began, received, now))
                except asyncio.TimeoutError:
                    refused = True
                    if not started:
                        await _reply(send, 408, f"the request body came too slowly (a pause over {self.read_timeout:g} s, "
                                                f"or under {MIN_BODY_RATE} bytes/s)", close=True)
                    return {"type": "http.disconnect"}
            if msg["type"] == "http.request":
                body_done = not msg.get("more_body", False)
                received += len(msg.get("body", b""))
                if received > limit:
                    refused = True
                    if not started:
                        await _reply(send, 413, f"request body over the {limit} byte limit")
                    return {"type": "http.disconnect"}
            return msg

        async def guarded_send(msg: Message) -> None:
            nonlocal started
            if refused:
                return  # the app's answer to a body it never got whole
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not refused:
                raise
            # the app failed on the body it did not get (ClientDisconnect): answered already


def _body_wait(timeout: float, began: float, received: int, now: float) -> float:
    """How long to wait for the next piece of a request body: a pause may last ``timeout``,
    and the body must come at ``MIN_BODY_RATE`` on average after a first ``timeout`` of grace
    (as Apache's mod_reqtimeout paces bodies): a byte every few seconds resets no clock."""
    due = began + timeout + received / MIN_BODY_RATE
    return max(min(timeout, due - now), 0.001)


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit
