"""R26 serving under hostile load (issue 25.1): runtime reads stay answerable while slow
clients attack ``serve``.

A header deadline closes requests whose headers never finish, idle keep-alive
connections close after their timeout, and a connection cap below the descriptor
limit closes the connection that has waited longest for a request to make room for a
new one: so a fresh ``/healthz`` is 200 (never 503) under ``ulimit -n 256`` with 300
slow clients, and ``accept()`` neither spins nor floods stderr.

Real ``catalog-ledger serve`` processes on loopback (the descriptor limit and the
event loop are the point), on SQLite: nothing here depends on the engine.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from bench.attack import SlowClients, fresh_healthz
from ledger.http.limits import default_max_connections
from ledger.http.settings import HEADER_TIMEOUT, KEEP_ALIVE_TIMEOUT
from tests.support.cli_inprocess import cli_json
from tests.support.cli_support import SCRIPT, free_port

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


class Server:
    """``catalog-ledger serve --no-auth`` on loopback, optionally under ``ulimit -n``."""

    def __init__(
        self, url: str, folder: Path, options: Sequence[str] = (), nofile: int | None = None
    ) -> None:
        self.port = free_port()
        self.stderr_path = folder / f"serve-{self.port}.stderr"
        command = [str(SCRIPT), "--db", url, "serve", "--port", str(self.port), "--no-auth"]
        command += options
        if nofile is not None:  # as an operator would: `ulimit -n N` in the shell, then exec
            command = ["sh", "-c", f'ulimit -n {int(nofile)} && exec "$@"', "sh", *command]
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if healthz(self.port, timeout=0.5)[0] == 200:
                return
            time.sleep(0.1)
        self.close()
        raise AssertionError(f"server did not start: {self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def healthz(port: int, *, timeout: float = 2.0) -> tuple[int | None, float]:
    """One ``GET /healthz`` on a fresh connection: (status or None, seconds taken)."""
    return fresh_healthz(port, timeout=timeout)


def read_response(sock: socket.socket) -> bytes:
    """One whole response on a keep-alive connection (head and ``Content-Length`` body),
    however the server splits its writes; its status line is returned."""
    sock.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(4096)
        assert chunk, f"closed after {data!r}"
        body += chunk
    assert len(body) == length, "more than one response"
    return head.split(b"\r\n", 1)[0]


def closed_after(sock: socket.socket, *, trickle: float | None, limit: float) -> float:
    """Seconds until the server closes ``sock`` (a header byte every ``trickle``
    seconds meanwhile, if given); fails after ``limit`` seconds."""
    started = time.monotonic()
    sock.settimeout(trickle or limit)
    while time.monotonic() - started < limit:
        try:
            data = sock.recv(4096)
        except TimeoutError:
            if trickle is not None:
                sock.sendall(b"a")
            continue
        except ConnectionResetError:
            return time.monotonic() - started
        if not data:
            return time.monotonic() - started
    raise AssertionError(f"the server kept the connection open for {limit} s")


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    code, answer = cli_json("--db", url, "init")
    assert code == 0, answer
    return url


@pytest.fixture
def server_factory(store_url: str, tmp_path: Path) -> Iterator[Any]:
    started: list[Server] = []

    def start(options: Sequence[str] = (), nofile: int | None = None) -> Server:
        server = Server(store_url, tmp_path, options, nofile)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()
        assert "Traceback" not in server.stderr()


@pytest.mark.parametrize(
    "options",
    [
        (),  # the defaults: a cap of 160 below `ulimit -n 256`
        # A cap the descriptors cannot honour: accept() fails with EMFILE, and neither
        # spins nor floods the log.
        ("--max-connections", "1000"),
    ],
    ids=["default-cap", "cap-above-the-descriptor-limit"],
)
def test_r26_healthz_is_200_within_2_s_while_300_slow_clients_attack_under_ulimit_256(
    server_factory: Any, options: tuple[str, ...]
) -> None:
    server = server_factory(options, nofile=256)
    assert healthz(server.port)[0] == 200
    answers: list[tuple[int | None, float]] = []
    with SlowClients("127.0.0.1", server.port, 300) as attack:
        attack.wait_connected()
        assert attack.opened >= 300
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            answers.append(healthz(server.port, timeout=2.0))
            time.sleep(0.25)
        dropped = attack.dropped
    # Every fresh connection was answered 200 (not 503, not a timeout) within 2 s.
    assert len(answers) >= 8
    assert [status for status, _ in answers] == [200] * len(answers), answers
    assert max(seconds for _, seconds in answers) < 2.0, answers
    # The cap was reached: slow clients were closed to make room (and came back).
    assert dropped > 0
    size = server.stderr_path.stat().st_size
    assert size < 1_000_000, (size, server.stderr()[-2000:])
    if options:  # EMFILE was met, and reported, rate-limited
        reports = server.stderr().count("accept() failed")
        assert 1 <= reports <= 2, server.stderr()[-2000:]
    # And it still serves once the attack is over.
    assert healthz(server.port)[0] == 200


def test_r26_a_request_whose_headers_never_finish_is_closed_at_the_header_timeout(
    server_factory: Any,
) -> None:
    server = server_factory(("--header-timeout", "0.5", "--keep-alive-timeout", "30"))
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(PARTIAL)
        # A byte every 0.1 s would reset a keep-alive timer; the header deadline holds.
        seconds = closed_after(sock, trickle=0.1, limit=5)
    assert 0.4 <= seconds < 2.0, seconds
    # A keep-alive connection gets a new deadline for each request, from its response.
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        for _ in range(3):
            sock.sendall(REQUEST)
            assert read_response(sock) == b"HTTP/1.1 200 OK"
            time.sleep(0.3)  # within the deadline, twice over: still open
        sock.sendall(PARTIAL)
        seconds = closed_after(sock, trickle=0.1, limit=5)
    assert 0.1 <= seconds < 2.0, seconds


def test_r26_a_header_block_over_16_kib_is_400_and_closed(server_factory: Any) -> None:
    # The size limit beside the time limit (h11's, as README says): no buffering forever.
    server = server_factory()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(PARTIAL + b"a" * (17 * 1024))
        sock.settimeout(5)
        assert sock.recv(4096).startswith(b"HTTP/1.1 400 ")
        assert closed_after(sock, trickle=None, limit=5) < 5


def test_r26_an_idle_keep_alive_connection_is_closed_at_the_keep_alive_timeout(
    server_factory: Any,
) -> None:
    server = server_factory(("--keep-alive-timeout", "0.5"))
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(REQUEST)
        assert read_response(sock) == b"HTTP/1.1 200 OK"
        seconds = closed_after(sock, trickle=None, limit=5)
    assert 0.4 <= seconds < 2.0, seconds


def test_r26_at_the_cap_the_connection_waiting_longest_is_closed_for_a_new_one(
    server_factory: Any,
) -> None:
    server = server_factory(("--max-connections", "3", "--header-timeout", "60"))
    slow = []
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(PARTIAL)
        slow.append(sock)
        time.sleep(0.1)  # accepted in this order
    try:
        # A fresh connection is served, not refused: the oldest slow one made room.
        assert healthz(server.port)[0] == 200
        assert closed_after(slow[0], trickle=None, limit=2) < 2
        for sock in slow[1:]:
            sock.settimeout(0.3)
            with pytest.raises(TimeoutError):  # still open, still waiting
                sock.recv(1)
    finally:
        for sock in slow:
            sock.close()


def test_r26_serve_limits_are_options_with_defaults_from_the_descriptor_limit(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    assert (default_max_connections(256), default_max_connections(1024)) == (160, 832)
    assert default_max_connections(10**7) == 10_000
    assert default_max_connections(16) == 1
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: calls.append(kwargs))
    serve = ("--db", store_url, "serve", "--port", "0", "--no-auth")
    code, listening = cli_json(*serve)
    assert code == 0, listening
    assert listening["max_connections"] == default_max_connections()
    assert (listening["header_timeout"], listening["keep_alive_timeout"]) == (
        HEADER_TIMEOUT,
        KEEP_ALIVE_TIMEOUT,
    )
    (kwargs,) = calls
    assert kwargs["loop"] == "ledger.http.limits:guarded_loop"
    assert kwargs["timeout_keep_alive"] == KEEP_ALIVE_TIMEOUT
    assert "limit_concurrency" not in kwargs  # uvicorn's cap answers 503: not used
    code, listening = cli_json(
        *serve, "--max-connections", "7", "--header-timeout", "2.5", "--keep-alive-timeout", "1"
    )
    assert code == 0 and listening["max_connections"] == 7, listening
    assert (listening["header_timeout"], listening["keep_alive_timeout"]) == (2.5, 1.0)
    for bad in (
        ("--max-connections", "0"),
        ("--header-timeout", "0"),
        ("--header-timeout", "-1"),
        ("--keep-alive-timeout", "0"),
        ("--keep-alive-timeout", "soon"),
    ):
        code, error = cli_json(*serve, *bad)
        assert (code, error["error"]) == (2, "USAGE"), (bad, error)
        assert bad[0] in error["message"], error
    assert len(calls) == 2
