"""What the benchmarks share: the MySQL-family server they measure against."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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
