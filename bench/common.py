"""What the benchmarks share: the MySQL-family server they measure against."""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pymysql
from sqlalchemy.engine import make_url

DEFAULT_MYSQL = os.environ.get(
    "CATALOG_LEDGER_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test"
)


def mysql_connect(
    url: str, database: str | None = None, *, connect_timeout: int = 10
) -> pymysql.connections.Connection[Any]:
    """An autocommit PyMySQL connection to the server of ``url`` (its database ignored)."""
    u = make_url(url)
    return pymysql.connect(
        host=u.host or "127.0.0.1",
        port=u.port or 3306,
        user=u.username or "root",
        password=u.password or "",
        database=database,
        autocommit=True,
        charset="utf8mb4",
        connect_timeout=connect_timeout,
    )


@contextmanager
def mysql_scratch(url: str, prefix: str = "bench_") -> Iterator[tuple[str, str]]:
    """A throwaway database on the server of ``url``: (its URL, its name); dropped after."""
    name = prefix + secrets.token_hex(5)
    with mysql_connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False), name
    finally:
        with mysql_connect(url) as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(base: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/healthz", timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit("server did not start")
