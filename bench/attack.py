"""Slow clients for `serve` (issue 25.1): connections whose request headers never finish.

``SlowClients(host, port, count)`` keeps ``count`` connections open against a server
from one thread. Each sends the start of a request (``GET /healthz HTTP/1.1`` and a
``Host`` header), then one more header byte every ``trickle`` seconds, and never
the blank line that would end its headers (the "slowloris" attack). A connection
the server drops is opened again at once, so the server is under the same pressure
for as long as the attack lasts. Loopback only: it is a test and benchmark tool.

Used by the bounded serving test (tests/e2e/test_r26_serve_limits.py) and by
``bench.http``'s ``/healthz`` p99 under attack.
"""

from __future__ import annotations

import errno
import selectors
import socket
import threading
import time
from types import TracebackType

_START = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def fresh_healthz(
    port: int, *, host: str = "127.0.0.1", timeout: float = 2.0
) -> tuple[int | None, float]:
    """One ``GET /healthz`` on a new connection: (its status, or ``None`` when there was
    no answer within ``timeout`` seconds; seconds from connect to the status line)."""
    started = time.monotonic()
    head = b""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(max(0.01, timeout - (time.monotonic() - started)))
            sock.sendall(_HEALTHZ)
            while b"\r\n" not in head:
                chunk = sock.recv(256)
                if not chunk:
                    break
                head += chunk
    except OSError:
        return None, time.monotonic() - started
    parts = head.split(b" ")
    status = int(parts[1]) if head.startswith(b"HTTP/1.1 ") and parts[1].isdigit() else None
    return status, time.monotonic() - started


class SlowClients:
    """``count`` never-finishing requests against ``host:port``, reopened when dropped."""

    def __init__(self, host: str, port: int, count: int, *, trickle: float = 1.0) -> None:
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError(f"slow clients attack loopback only, not {host!r}")
        self.address = (host, port)
        self.count = count
        self.trickle = trickle
        #: Connections opened (the first ``count`` and every reconnection).
        self.opened = 0
        #: Connections the server closed or refused.
        self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow-clients", daemon=True)
        self._selector = selectors.DefaultSelector()

    def __enter__(self) -> SlowClients:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def wait_connected(self, timeout: float = 10.0) -> None:
        """Return once every connection has been opened once (or ``timeout`` passed)."""
        deadline = time.monotonic() + timeout
        while self.opened < self.count and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _open(self) -> None:
        sock = socket.socket(socket.AF_INET6 if ":" in self.address[0] else socket.AF_INET)
        sock.setblocking(False)
        code = sock.connect_ex(self.address)
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self.dropped += 1
            return
        self.opened += 1
        # Written once connected: the start of a request, then a byte now and then.
        self._selector.register(sock, selectors.EVENT_WRITE, [_START, time.monotonic()])

    def _close(self, sock: socket.socket) -> None:
        self._selector.unregister(sock)
        sock.close()
        self.dropped += 1

    def _run(self) -> None:
        try:
            for _ in range(self.count):
                self._open()
            while not self._stop.is_set():
                now = time.monotonic()
                for key, events in self._selector.select(timeout=0.05):
                    sock: socket.socket = key.fileobj  # type: ignore[assignment]
                    if events & selectors.EVENT_READ:
                        try:
                            data = sock.recv(4096)
                        except OSError:
                            data = b""
                        if not data:  # dropped by the server (or refused): again
                            self._close(sock)
                            continue
                    if events & selectors.EVENT_WRITE and key.data[0]:
                        try:
                            sent = sock.send(key.data[0])
                        except OSError:
                            self._close(sock)
                            continue
                        key.data[0] = key.data[0][sent:]
                        if not key.data[0]:  # now wait, reading only (to see a drop)
                            self._selector.modify(sock, selectors.EVENT_READ, [b"", now])
                # A byte of header now and then, never the end of the headers.
                for key in list(self._selector.get_map().values()):
                    pending, last = key.data
                    if not pending and now - last >= self.trickle:
                        self._selector.modify(
                            key.fileobj, selectors.EVENT_READ | selectors.EVENT_WRITE, [b"a", now]
                        )
                for _ in range(self.count - len(self._selector.get_map())):
                    self._open()
        finally:
            for key in list(self._selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            self._selector.close()
