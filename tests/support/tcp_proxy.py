"""A loopback TCP proxy in front of a MySQL-family server that loses connections on cue.

Why: a network failure around ``COMMIT`` is the one failure a store cannot
classify on its own. If the connection drops *before* the server saw COMMIT,
nothing was written; if it drops *after* the server committed but before the
client read the OK packet, everything was written and the client does not know
(an ambiguous commit). Tests point the store's URL at this proxy, arm a drop,
and then check that the store surfaced a typed error and that a retry of the
same command id is classified correctly (R10). A real server, real sockets:
nothing is mocked.

The proxy parses the client->server direction into MySQL protocol packets
(3-byte little-endian payload length, 1-byte sequence id, payload). A packet
with sequence id 0 starts a command; for ``COM_QUERY`` (payload byte ``0x03``)
the rest of the payload is the SQL text. Per connection it remembers the
statements of the current transaction (cleared by ``COMMIT``/``ROLLBACK``), so a
drop can be aimed at "the COMMIT of the transaction that inserted X". The
server->client direction is forwarded as raw bytes, except while a reply is
being swallowed.

Drop modes, applied to the packet a trigger matches:

* ``BEFORE``  close both sides without forwarding the packet (for ``COMMIT``:
  the server never commits; it rolls back when it sees the closed socket);
* ``DURING``  forward the header and part of the payload, then close both
  sides (the server reads a truncated packet and aborts the connection);
* ``AFTER``   forward the whole packet, wait for the first packet of the
  server's reply, record it and close both sides without delivering it (for
  ``COMMIT``: committed, but the client never learns it - ambiguous).

``drop_now()`` closes every open connection immediately (a mid-transaction
drop at whatever point the clients are), and ``blackout`` makes the proxy
refuse every later connection (accepted and closed at once), modelling a
server that stays unreachable so the store cannot clean up.

Only loopback addresses are used, on both sides.
"""

from __future__ import annotations

import contextlib
import enum
import ipaddress
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from sqlalchemy.engine import make_url

COM_QUERY = 0x03
_HEADER = 4
_MAX_TXN_STATEMENTS = 10_000
_WRITE_VERBS = (b"INSERT", b"UPDATE", b"DELETE", b"REPLACE")


class DropMode(enum.Enum):
    """Where, relative to the matched packet, the connection is lost."""

    BEFORE = "before"
    DURING = "during"
    AFTER = "after"


@dataclass(frozen=True)
class Packet:
    """One client->server packet as the trigger sees it."""

    #: 1-based index among all client packets since the last ``reset_count``.
    index: int
    connection: int
    seq: int
    payload: bytes
    #: Statements of this connection's current transaction before this packet.
    transaction: tuple[bytes, ...]

    @property
    def is_command(self) -> bool:
        return self.seq == 0 and bool(self.payload)

    @property
    def sql(self) -> bytes | None:
        """The SQL text of a ``COM_QUERY`` command, else ``None``."""
        if self.is_command and self.payload[0] == COM_QUERY:
            return self.payload[1:]
        return None

    @property
    def verb(self) -> bytes:
        sql = self.sql
        return sql.lstrip().split(None, 1)[0].upper() if sql and sql.strip() else b""

    @property
    def is_commit(self) -> bool:
        return self.verb == b"COMMIT"

    @property
    def ends_transaction(self) -> bool:
        return self.verb in (b"COMMIT", b"ROLLBACK")

    @property
    def is_write(self) -> bool:
        return self.verb in _WRITE_VERBS

    def transaction_contains(self, marker: bytes) -> bool:
        return any(marker in statement for statement in self.transaction)

    def transaction_wrote(self) -> bool:
        return any(
            statement.lstrip()[:7].upper().startswith(_WRITE_VERBS)
            for statement in self.transaction
        )


@dataclass(frozen=True)
class Drop:
    """What one fired drop did."""

    mode: DropMode | None  # None: drop_now()
    packet: Packet | None
    #: First byte of the swallowed reply (``AFTER``): 0x00 OK, 0xff ERR; else None.
    reply: int | None = None

    @property
    def reply_ok(self) -> bool:
        return self.reply == 0x00

    def describe(self) -> str:
        what = "drop_now" if self.mode is None else self.mode.value
        if self.packet is None:
            return what
        sql = self.packet.sql
        text = sql[:60].decode("utf-8", "replace") if sql is not None else "non-query packet"
        return f"{what} packet #{self.packet.index} ({text!r})"


@dataclass
class _Trigger:
    mode: DropMode
    match: Callable[[Packet], bool]


@dataclass
class _Link:
    """One proxied client connection and its upstream connection."""

    ident: int
    client: socket.socket
    upstream: socket.socket
    transaction: list[bytes] = field(default_factory=list)
    swallow: threading.Event = field(default_factory=threading.Event)
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Set by the swallowing pump once the reply was read (or the server closed).
    swallowed: threading.Event = field(default_factory=threading.Event)
    reply: int | None = None

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _loopback(host: str) -> str:
    address = "127.0.0.1" if host == "localhost" else host
    if not ipaddress.ip_address(address).is_loopback:
        raise ValueError(f"the proxy only talks to loopback addresses, not {host!r}")
    return address


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    """Exactly ``size`` bytes, or ``None`` when the peer closed first."""
    chunks: list[bytes] = []
    while size:
        try:
            chunk = sock.recv(size)
        except OSError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class MySQLProxy:
    """A threaded loopback proxy with armable connection drops.

    Use as a context manager; ``url(database_url)`` rewrites a store URL so it
    goes through the proxy. At most one trigger is armed at a time; it fires
    once and disarms itself.
    """

    def __init__(self, upstream_host: str = "127.0.0.1", upstream_port: int = 3306) -> None:
        self.upstream = (_loopback(upstream_host), upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: dict[int, _Link] = {}
        self._next_ident = 0
        self._trigger: _Trigger | None = None
        self._packets = 0
        self._stopping = False
        self._fired_event = threading.Event()
        #: Every drop fired so far, in order.
        self.fired: list[Drop] = []
        #: Refuse new connections (accept, then close at once).
        self.blackout = False
        #: Turn ``blackout`` on as soon as any drop fires.
        self.blackout_after_drop = False
        #: Every COM_QUERY seen since the last ``reset_count`` (for choosing markers).
        self.statements: list[bytes] = []
        self.record_statements = False
        self._accepter = threading.Thread(target=self._accept_loop, daemon=True)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> MySQLProxy:
        self._accepter.start()
        return self

    def close(self) -> None:
        """Stop accepting, then close every connection.

        The listener is shut down (which wakes the blocked ``accept``) and the
        accepting thread joined *before* its descriptor is closed: closing first
        would let a later proxy reuse the descriptor number while this thread
        still accepts on it, silently forwarding that proxy's clients unarmed.
        """
        self._stopping = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        if self._accepter.is_alive():
            self._accepter.join(timeout=60)
            assert not self._accepter.is_alive(), "the proxy's accepter did not stop"
        self._listener.close()
        for link in self._live_links():
            link.close()

    def __enter__(self) -> MySQLProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def url(self, database_url: str) -> str:
        """The same store URL, through this proxy."""
        return (
            make_url(database_url)
            .set(host="127.0.0.1", port=self.port)
            .render_as_string(hide_password=False)
        )

    # -- arming ---------------------------------------------------------------------------

    def arm(self, mode: DropMode, match: Callable[[Packet], bool]) -> None:
        """Drop at the next client packet for which ``match`` is true."""
        with self._lock:
            self._trigger = _Trigger(mode, match)
            self._fired_event.clear()

    def drop_on_commit(
        self, mode: DropMode, *, containing: bytes | None = None, writes_only: bool = True
    ) -> None:
        """Drop at the next COMMIT of a transaction that wrote (and contained ``containing``)."""

        def match(packet: Packet) -> bool:
            if not packet.is_commit:
                return False
            if writes_only and not packet.transaction_wrote():
                return False
            return containing is None or packet.transaction_contains(containing)

        self.arm(mode, match)

    def drop_on_statement(
        self, mode: DropMode, containing: bytes, *, after: bytes | None = None
    ) -> None:
        """Drop at the next statement whose SQL contains ``containing``, optionally only
        in a transaction whose statements so far (this one included) contain ``after``."""

        def match(packet: Packet) -> bool:
            sql = packet.sql
            if sql is None or containing not in sql:
                return False
            return after is None or after in sql or packet.transaction_contains(after)

        self.arm(mode, match)

    def drop_at_packet(self, index: int, mode: DropMode) -> None:
        """Drop at the ``index``-th client packet (1-based) counted since ``reset_count``."""
        self.arm(mode, lambda packet: packet.index == index)

    def disarm(self) -> None:
        with self._lock:
            self._trigger = None

    @property
    def armed(self) -> bool:
        with self._lock:
            return self._trigger is not None

    def reset_count(self) -> None:
        """Restart packet numbering (and the statement record) at 1."""
        with self._lock:
            self._packets = 0
            self.statements = []

    @property
    def packets(self) -> int:
        """Client packets seen since ``reset_count``."""
        with self._lock:
            return self._packets

    def wait_fired(self, timeout: float = 10.0) -> bool:
        return self._fired_event.wait(timeout)

    def drop_now(self) -> int:
        """Close every open connection at once; returns how many were open."""
        links = self._live_links()
        with self._lock:
            self.fired.append(Drop(None, None))
            self._fired_event.set()
            if self.blackout_after_drop:
                self.blackout = True
        for link in links:
            link.close()
        return len(links)

    def wait_for_statement(self, containing: bytes, timeout: float = 10.0) -> bool:
        """Wait until a statement containing ``containing`` was seen (needs
        ``record_statements``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if any(containing in s for s in self.statements):
                    return True
            time.sleep(0.01)
        return False

    # -- internals ------------------------------------------------------------------------

    def _live_links(self) -> list[_Link]:
        with self._lock:
            return [link for link in self._links.values() if not link.closed]

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._stopping:
                client.close()
                return
            if self.blackout:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._next_ident += 1
                link = _Link(self._next_ident, client, upstream)
                self._links[link.ident] = link
            threading.Thread(target=self._client_to_server, args=(link,), daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(link,), daemon=True).start()

    def _forget(self, link: _Link) -> None:
        link.close()
        with self._lock:
            self._links.pop(link.ident, None)

    def _client_to_server(self, link: _Link) -> None:
        try:
            while True:
                header = _recv_exact(link.client, _HEADER)
                if header is None:
                    return
                length = int.from_bytes(header[:3], "little")
                payload = _recv_exact(link.client, length) if length else b""
                if payload is None:
                    return
                packet, trigger = self._observe(link, header[3], payload)
                if trigger is not None:
                    self._fire(link, trigger.mode, header, packet)
                    return
                try:
                    link.upstream.sendall(header + payload)
                except OSError:
                    return
                self._track(link, packet)
        finally:
            self._forget(link)

    def _observe(self, link: _Link, seq: int, payload: bytes) -> tuple[Packet, _Trigger | None]:
        with self._lock:
            self._packets += 1
            packet = Packet(self._packets, link.ident, seq, payload, tuple(link.transaction))
            if self.record_statements and packet.sql is not None:
                self.statements.append(packet.sql)
            trigger = self._trigger
            if trigger is not None and trigger.match(packet):
                self._trigger = None
                return packet, trigger
            return packet, None

    @staticmethod
    def _track(link: _Link, packet: Packet) -> None:
        sql = packet.sql
        if sql is None:
            return
        if packet.ends_transaction:
            link.transaction.clear()
        elif len(link.transaction) < _MAX_TXN_STATEMENTS:
            link.transaction.append(sql)

    def _fire(self, link: _Link, mode: DropMode, header: bytes, packet: Packet) -> None:
        reply: int | None = None
        if mode is DropMode.DURING:
            cut = max(1, len(packet.payload) // 2)
            with contextlib.suppress(OSError):
                link.upstream.sendall(header + packet.payload[:cut])
        elif mode is DropMode.AFTER:
            link.swallow.set()
            try:
                link.upstream.sendall(header + packet.payload)
            except OSError:
                pass
            else:
                link.swallowed.wait(30)
                reply = link.reply
        # Record first, then close: whoever sees the lost connection finds it recorded.
        with self._lock:
            self.fired.append(Drop(mode, packet, reply))
            if self.blackout_after_drop:
                self.blackout = True
            self._fired_event.set()
        link.close()

    def _server_to_client(self, link: _Link) -> None:
        pending = b""
        try:
            while True:
                try:
                    data = link.upstream.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                if not link.swallow.is_set():
                    try:
                        link.client.sendall(data)
                    except OSError:
                        return
                    continue
                # Swallowing: read the first whole reply packet, deliver nothing.
                pending += data
                if len(pending) >= _HEADER:
                    length = int.from_bytes(pending[:3], "little")
                    if len(pending) >= _HEADER + max(length, 1):
                        link.reply = pending[_HEADER] if length else None
                        return
        finally:
            link.swallowed.set()
            if not link.swallow.is_set():
                self._forget(link)  # the server closed: so does the client side
