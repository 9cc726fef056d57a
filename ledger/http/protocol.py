"""The HTTP/1.1 protocol `serve` runs uvicorn with: its h11 protocol, with ``TCP_NODELAY``
and the connection accounting of ``ledger.http.limits``.

asyncio turns Nagle's algorithm off only for sockets whose protocol number is TCP.
``uvicorn --workers N`` binds its listening socket as ``socket.socket(family)``
(protocol 0), so the connections its workers accept keep Nagle on. uvicorn writes a
response's headers and its body separately, and the body then waits for the client's
delayed ACK: about 40 ms per response (measured: 91 reads/s on one connection instead
of 10,000). This protocol sets ``TCP_NODELAY`` on every TCP connection it is made for.
"""

from __future__ import annotations

import asyncio
import socket

from uvicorn.protocols.http.h11_impl import H11Protocol

from ledger.http.limits import GUARD


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, telling ``GUARD`` when its connection waits for a request
    (its headers are then due within ``header_timeout``; the guard closes it otherwise)
    and when it is busy with one (it is then not closed to make room)."""

    _fd = -1
    _started: object = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1
        GUARD.bind(self._fd, transport.abort)
        self._started = self.cycle
        GUARD.waiting(self._fd)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not self._started:  # a request's headers arrived: it is answered
            self._started = self.cycle
            GUARD.busy(self._fd)

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._started = self.cycle
            GUARD.waiting(self._fd)  # before a pipelined request is handled
        super().on_response_complete()


class NoDelayH11Protocol(GuardedH11Protocol):
    """uvicorn's h11 protocol on a connection with Nagle's algorithm off (and the
    header deadline and connection accounting of ``ledger.http.limits``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
