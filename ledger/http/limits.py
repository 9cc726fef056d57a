"""Connection limits that keep ``serve`` answering under hostile load (issue 25.1).

Two dangers, and what this module does about each:

- A request whose headers never finish (the "slowloris" attack: a header byte now
  and then, never the blank line) holds its connection, and so a file descriptor,
  for ever: uvicorn times out only idle keep-alive connections, and any byte resets
  that timer. Every request has ``header_timeout`` seconds, from the moment its
  connection is ready for it (accepted, or its previous response sent), to deliver
  its whole header block; then the connection is closed, unanswered.
  ``GuardedH11Protocol`` tells the guard when its connection waits and when it is
  busy; one sweep per process (every ``header_timeout / 4`` seconds, at most 1 s)
  closes the late ones, oldest first: no timer per request.
- Enough such connections exhaust the descriptors: ``accept()`` fails with EMFILE.
  asyncio (3.11) then logs the error with a traceback for each of the up to
  ``backlog`` (2,048) accept attempts of one loop tick, and schedules as many
  restarts, every second (measured: 55 MB of stderr in 12 s, and ``/healthz`` timing
  out for everyone). ``GuardedEventLoop`` keeps at most ``max_connections`` client
  connections open, a cap chosen below the descriptor limit
  (``default_max_connections``). At the cap, each new connection is accepted and the
  one that has waited longest for a request (headers not finished, or idle between
  keep-alive requests) is closed for it, so a fresh client is served rather than
  refused (no 503). If every connection is in the middle of a request, the new one is
  let in over the cap and accepting pauses (``ACCEPT_PAUSE``) until one finishes: later
  clients wait in the listen backlog. Should ``accept()`` fail all the same
  (descriptors used elsewhere, or a cap set above what ``ulimit -n`` allows), the
  cap comes down to ``ACCEPT_HEADROOM`` below the connections then open, the
  connections over it are closed, and the failure is logged at most once per
  ``LOG_EVERY`` seconds with how many there were.
- Everything is per process: with ``serve --workers N`` each worker has these limits.

The loop is uvicorn's ``loop`` setting (``guarded_loop``) and the protocol
(``ledger.http.protocol.GuardedH11Protocol``) its ``http`` setting; both read one
``ConnectionGuard`` per process (``GUARD``), set by
``configure`` (or ``configure_from_environment`` in the workers of ``--workers N``).
This module imports no HTTP server (the CLI reads its defaults).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import suppress
from typing import Any

# The serve defaults live with the CLI's other server settings (standard library only).
from ledger.http.settings import HEADER_TIMEOUT

#: Descriptors kept for everything but client connections: the store (SQLite opens a
#: file, its WAL and its shared memory per connection, and reads run in a pool of
#: threads), the listening socket, logs; and an eighth of the limit besides.
FD_RESERVE = 64
#: The default cap never exceeds this, however high the descriptor limit.
MAX_CONNECTIONS_CEILING = 10_000
#: Seconds accepting pauses after ``accept()`` failed for want of descriptors, or at
#: the cap with every connection in the middle of a request.
ACCEPT_PAUSE = 0.1
#: When ``accept()`` finds no descriptor, the cap comes down to this many below the
#: connections open at that moment (descriptors for the store's reads meanwhile).
ACCEPT_HEADROOM = 32
#: Connections closed to make room in one loop iteration, at most: their descriptors
#: are free only in the next (so at most this many over the cap are open).
EVICT_BATCH = 16
#: A failing ``accept()`` is logged at most once per this many seconds.
LOG_EVERY = 10.0
#: Environment of ``serve --workers N`` (read by each worker).
MAX_CONNECTIONS_ENV = "CATALOG_LEDGER_SERVE_MAX_CONNECTIONS"
HEADER_TIMEOUT_ENV = "CATALOG_LEDGER_SERVE_HEADER_TIMEOUT"

_RESOURCE_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

log = logging.getLogger("catalog_ledger.serve")


def descriptor_limit() -> int:
    """This process's (soft) limit on open file descriptors: ``ulimit -n``."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_CONNECTIONS_CEILING * 2 if soft == resource.RLIM_INFINITY else int(soft)


def default_max_connections(limit: int | None = None) -> int:
    """The default ``--max-connections``: the descriptor limit less a reserve for the
    store and the server (``FD_RESERVE`` and an eighth of the limit), at least 1, at
    most ``MAX_CONNECTIONS_CEILING``. 160 under ``ulimit -n 256``, 832 under 1024."""
    limit = descriptor_limit() if limit is None else limit
    return max(1, min(MAX_CONNECTIONS_CEILING, limit - FD_RESERVE - limit // 8))


class _Connection(socket.socket):
    """An accepted client socket that tells the guard when it is closed, and how it
    is to be closed when the guard needs its descriptor."""

    __slots__ = ("_evicted", "_guard", "_released", "evict", "since")

    _guard: ConnectionGuard
    _released: bool
    _evicted: bool
    #: When it began to wait for a request (monotonic seconds).
    since: float
    #: Closes the connection at once (the protocol sets its transport's ``abort``);
    #: until then, a shutdown that its transport sees as the peer's end.
    evict: Callable[[], None]

    def close(self) -> None:
        if not getattr(self, "_released", True):
            self._released = True
            self._guard.released(self)
        super().close()

    def _shutdown(self) -> None:
        with suppress(OSError):
            self.shutdown(socket.SHUT_RDWR)


class ConnectionGuard:
    """The client connections of one process: how many are open, which wait for a
    request (oldest first), and the limits (``configure``)."""

    def __init__(
        self,
        *,
        max_connections: int | None = None,
        header_timeout: float = HEADER_TIMEOUT,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_connections = (
            default_max_connections() if max_connections is None else max_connections
        )
        self.header_timeout = header_timeout
        self._monotonic = monotonic
        #: Accepted and not yet closed.
        self.open = 0
        #: Connections waiting for a request, by file descriptor, longest-waiting first.
        self._waiting: OrderedDict[int, _Connection] = OrderedDict()
        self._by_fd: dict[int, _Connection] = {}
        #: Connections closed to make room or at the header deadline (for tests and the
        #: benchmark), and those of them whose descriptors are not free yet.
        self.evicted = 0
        self.timed_out = 0
        self.evicting = 0
        self._sweeper: asyncio.TimerHandle | None = None
        #: ``accept()`` failures for want of descriptors, and those not yet logged.
        self.accept_failures = 0
        self._unlogged = 0
        self._logged_at: float | None = None

    # -- the loop's side ---------------------------------------------------------------

    def adopt(
        self, listener: socket.socket, fd: int, loop: asyncio.AbstractEventLoop
    ) -> _Connection:
        """The accepted descriptor ``fd`` as a counted connection, waiting for a request."""
        conn = _Connection(listener.family, listener.type, listener.proto, fileno=fd)
        conn._guard = self
        conn._released = False
        conn._evicted = False
        conn.evict = conn._shutdown
        conn.since = self._monotonic()
        self.open += 1
        self._by_fd[fd] = conn
        self._waiting[fd] = conn
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._sweep_every(), self._sweep, loop)
        return conn

    def _sweep_every(self) -> float:
        return min(1.0, max(0.05, self.header_timeout / 4))

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the connections that have waited ``header_timeout`` seconds for a
        request's headers (one timer per process, not one per request: the waiting
        connections are in the order they began to wait)."""
        self._sweeper = None
        deadline = self._monotonic() - self.header_timeout
        while self._waiting:
            conn = next(iter(self._waiting.values()))
            if conn.since > deadline:
                break
            self.timed_out += 1
            self._close(self._waiting.popitem(last=False)[1])
        if self.open:
            self._sweeper = loop.call_later(self._sweep_every(), self._sweep, loop)

    def _close(self, conn: _Connection) -> None:
        self.evicting += 1
        conn._evicted = True
        conn.evict()

    def released(self, conn: _Connection) -> None:
        self.open -= 1
        if conn._evicted:
            self.evicting -= 1
        fd = conn.fileno()
        if self._by_fd.get(fd) is conn:
            del self._by_fd[fd]
            self._waiting.pop(fd, None)

    def full(self) -> bool:
        """As many connections as the cap, not counting those being closed."""
        return self.open - self.evicting >= self.max_connections

    def make_room(self) -> bool:
        """Close the connection that has waited longest for a request; ``False`` when
        every connection is in the middle of one. Its descriptor is free once its
        transport has closed it (the next loop iteration)."""
        if not self._waiting:
            return False
        _, conn = self._waiting.popitem(last=False)
        self.evicted += 1
        self._close(conn)
        return True

    def accept_failed(self, exc: OSError) -> None:
        """``accept()`` found no descriptor: the cap comes down to what the descriptors
        allow (``ACCEPT_HEADROOM`` below the connections open now), connections over it
        are closed, and this is logged at most once per ``LOG_EVERY`` seconds."""
        self.accept_failures += 1
        self._unlogged += 1
        if exc.errno == errno.EMFILE:
            self.max_connections = max(1, min(self.max_connections, self.open - ACCEPT_HEADROOM))
            while self.open - self.evicting > self.max_connections and self.make_room():
                pass
        now = self._monotonic()
        if self._logged_at is not None and now - self._logged_at < LOG_EVERY:
            return
        log.warning(
            "accept() failed %d time(s) since the last report: %s; connections capped at %d "
            "(closing those that wait longest for a request); set --max-connections lower "
            "or raise `ulimit -n` (now %d)",
            self._unlogged,
            exc.strerror or exc,
            self.max_connections,
            descriptor_limit(),
        )
        self._unlogged = 0
        self._logged_at = now

    # -- the protocol's side -----------------------------------------------------------

    def busy(self, fd: int) -> None:
        """The connection on ``fd`` received a whole request header: not evictable."""
        self._waiting.pop(fd, None)

    def waiting(self, fd: int) -> None:
        """The connection on ``fd`` waits for a request (again): evictable, newest, and
        its headers due ``header_timeout`` seconds from now."""
        conn = self._by_fd.get(fd)
        if conn is not None and not conn._evicted:
            conn.since = self._monotonic()
            self._waiting[fd] = conn
            self._waiting.move_to_end(fd)

    def bind(self, fd: int, evict: Callable[[], None]) -> None:
        """How the guard closes the connection on ``fd`` (its transport's ``abort``)."""
        conn = self._by_fd.get(fd)
        if conn is not None:
            conn.evict = evict


#: The guard of this process.
GUARD = ConnectionGuard()


def configure(*, max_connections: int | None, header_timeout: float) -> ConnectionGuard:
    """Set this process's limits (``serve``); ``None``: ``default_max_connections()``."""
    GUARD.max_connections = (
        default_max_connections() if max_connections is None else max_connections
    )
    GUARD.header_timeout = header_timeout
    return GUARD


def configure_from_environment() -> None:
    """The limits ``serve --workers N`` passed its workers, if it did."""
    if MAX_CONNECTIONS_ENV in os.environ:
        raw = os.environ[MAX_CONNECTIONS_ENV]
        configure(
            max_connections=int(raw) if raw else None,
            header_timeout=float(os.environ.get(HEADER_TIMEOUT_ENV, HEADER_TIMEOUT)),
        )


class GuardedEventLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop whose ``accept()`` keeps to ``GUARD``'s cap and never
    spins (nor floods the log) when descriptors run out.

    It replaces ``BaseSelectorEventLoop._accept_connection`` (the method asyncio calls
    when a listening socket is readable), keeping its signature and its hand-over to
    ``_accept_connection2``, which sets up the transport and the protocol."""

    def _accept_connection(
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        sock: socket.socket,
        sslcontext: Any = None,
        server: Any = None,
        backlog: int = 100,
        *timeouts: Any,
    ) -> None:
        guard = GUARD
        for _ in range(backlog):
            if guard.evicting >= EVICT_BATCH:
                return  # again next iteration, once their descriptors are free
            if guard.open - guard.evicting > guard.max_connections:  # over the cap already
                if not guard.make_room():  # and every connection is mid-request: wait
                    self._pause_accepting(
                        protocol_factory, sock, sslcontext, server, backlog, *timeouts
                    )
                return
            try:
                fd, addr = sock._accept()  # type: ignore[attr-defined]
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # nothing more to accept
            except OSError as exc:
                if exc.errno not in _RESOURCE_ERRORS:
                    raise  # the loop logs it and goes on, as asyncio does
                guard.accept_failed(exc)
                if not guard.evicting:  # nothing will free a descriptor soon: wait
                    self._pause_accepting(
                        protocol_factory, sock, sslcontext, server, backlog, *timeouts
                    )
                return
            # At the cap, the connection that has waited longest for a request makes
            # room for this one (its descriptor is free the next loop iteration).
            room = not guard.full() or guard.make_room()
            conn = guard.adopt(sock, fd, self)
            conn.setblocking(False)
            self.create_task(
                self._accept_connection2(  # type: ignore[attr-defined]
                    protocol_factory, conn, {"peername": addr}, sslcontext, server, *timeouts
                )
            )
            if not room:  # every connection is mid-request: this one is over the cap
                self._pause_accepting(
                    protocol_factory, sock, sslcontext, server, backlog, *timeouts
                )
                return

    def _pause_accepting(self, *args: Any) -> None:
        sock: socket.socket = args[1]
        self._remove_reader(sock.fileno())  # type: ignore[attr-defined]
        self.call_later(ACCEPT_PAUSE, self._resume_accepting, *args)

    def _resume_accepting(self, *args: Any) -> None:
        sock: socket.socket = args[1]
        server = args[3]
        if sock.fileno() < 0 or (server is not None and not server.is_serving()):
            return  # closed meanwhile: nothing to resume
        self._add_reader(sock.fileno(), self._accept_connection, *args)  # type: ignore[attr-defined]


def guarded_loop() -> asyncio.AbstractEventLoop:
    """uvicorn's loop factory for ``serve`` (``loop="ledger.http.limits:guarded_loop"``)."""
    configure_from_environment()
    return GuardedEventLoop()
