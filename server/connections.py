"""Connections that never finish a request (slowloris).  uvicorn closes a connection kept
alive and idle between requests (``timeout_keep_alive``), but it waits without limit for the
headers of a request: those of a connection that sends nothing, or a byte now and then.
Hundreds of such connections each hold a file descriptor, before the token check can see
them (it needs the headers).  ``timed_protocol`` gives that wait a limit; a request *body*
that stalls is the security middleware's (``security.py``: it can still answer 408).

The limit never touches a request being served: the live channel's stream (SSE) stays open
for hours, and an import's body is read at the client's pace."""

from __future__ import annotations

import asyncio
from typing import Any


def timed_protocol(timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools when installed, else h11: what ``http="auto"``
    takes) closing a connection whose next request's headers have not all arrived within
    ``timeout`` seconds of the connection, or of the first byte after the previous response."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    base: Any = AutoHTTPProtocol

    class HeaderTimeoutProtocol(base):  # type: ignore[misc]
        # both of uvicorn's protocols keep the request being served as ``cycle`` (None before
        # the first): a request whose headers have arrived is a new cycle
        _timer: asyncio.TimerHandle | None = None
        _timed: Any = None  # the cycle that was the latest when the timer was armed

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._await_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self.transport.is_closing():
                self._await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _await_headers(self) -> None:
            if not hasattr(self, "cycle"):
                return  # a uvicorn that keeps its request otherwise: untimed, never cut mid-request
            cycle = self.cycle
            if cycle is not None and not getattr(cycle, "response_complete", False):
                return  # a request is being served: how fast its body comes is the middleware's
            if self._timer is not None and self._timed is cycle:
                return  # this wait is timed already (a byte more of the same headers)
            self._disarm()
            self._timed = cycle
            self._timer = asyncio.get_running_loop().call_later(timeout, self._headers_late)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _headers_late(self) -> None:
            self._timer = None
            transport: asyncio.Transport = self.transport
            # no request began since the timer was armed; a connection upgraded (a WebSocket)
            # has another protocol now and is not this one's any more
            if (getattr(self, "cycle", None) is self._timed and not transport.is_closing()
                    and transport.get_protocol() is self):
                transport.close()

    return HeaderTimeoutProtocol
