"""The HTTP/1.1 protocol `serve` runs uvicorn with: its h11 protocol, with ``TCP_NODELAY``.

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

from ledger.http.limits import GuardedH11Protocol


class NoDelayH11Protocol(GuardedH11Protocol):
    """uvicorn's h11 protocol on a connection with Nagle's algorithm off (and the
    header deadline and connection accounting of ``ledger.http.limits``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
