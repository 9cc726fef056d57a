"""What the benchmarks share: the MySQL-family server they measure against, the
engine's durability settings, A B A B alternation of peers and the SUMMARY line."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
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
        # On loopback, no opportunistic TLS: PyMySQL builds a fresh ssl context per
        # connection (the CA store loaded, ~20 ms of CPU each) for nothing.
        ssl_disabled=(u.host or "127.0.0.1") in ("127.0.0.1", "localhost", "::1") or None,
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
    """Wait for a server's /healthz to answer (httpx imported here: only the HTTP
    benches need it, the others run without it)."""
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/healthz", timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit("server did not start")


# -- the honest-bench protocol (issue 18): durability, alternation, one SUMMARY line ------


def summary(**fields: Any) -> dict[str, Any]:
    """Print one ``SUMMARY {json}`` line for a headline figure (``bench.all`` collects them).

    Fields: bench, figure, engine, workers, value, unit, peer, peer_value, ratio, target
    (and optionally peer_workers when the peer ran at another worker count). A missing
    ratio is computed as value / peer_value when both are known.
    """
    row: dict[str, Any] = {key: fields.pop(key, None) for key in SUMMARY_FIELDS}
    row.update(fields)
    if row["ratio"] is None and row["value"] is not None and row["peer_value"]:
        row["ratio"] = row["value"] / row["peer_value"]
    for key in ("value", "peer_value", "ratio"):
        if isinstance(row[key], float):
            row[key] = float(f"{row[key]:.{4 if key == 'ratio' else 6}g}")
    print("SUMMARY " + json.dumps(row), flush=True)
    return row


SUMMARY_FIELDS = (
    "bench",
    "figure",
    "engine",
    "workers",
    "value",
    "unit",
    "peer",
    "peer_value",
    "ratio",
    "target",
)


def target_met(row: dict[str, Any]) -> bool | None:
    """Whether a SUMMARY row meets its target (``>=0.85``, ``<=60``, ``value>=150000``…).

    A bare target applies to the ratio when there is one, else to the value; a
    ``value``/``ratio`` prefix says which. ``None`` when there is no target or figure.
    """
    target = row.get("target")
    if not isinstance(target, str) or not target.strip():
        return None
    match = re.fullmatch(
        r"\s*(value|ratio)?\s*(>=|<=|>|<|≥|≤)\s*([0-9][0-9_,.]*)\s*[a-zA-Z×/%]*\s*", target
    )
    if match is None:
        return None
    which, op, number = match.groups()
    bound = float(number.replace(",", "").replace("_", ""))
    key = which or ("ratio" if row.get("ratio") is not None else "value")
    figure = row.get(key)
    if not isinstance(figure, int | float):
        return None
    if op in (">=", "≥"):
        return figure >= bound
    if op in ("<=", "≤"):
        return figure <= bound
    return figure > bound if op == ">" else figure < bound


def durability(db_or_url: Any, label: str = "ledger") -> dict[str, Any]:
    """The engine's durability settings as the store runs them; printed once, returned.

    SQLite: journal_mode and synchronous of a connection opened by
    ``ledger.log.db.open_database``. MySQL family: innodb_flush_log_at_trx_commit,
    sync_binlog and the isolation of the store's write and read connections.
    ``db_or_url`` is an open ``Database`` (left open) or a store URL (opened, closed).
    """
    from ledger.log.db import Database, open_database

    db = db_or_url if isinstance(db_or_url, Database) else open_database(str(db_or_url))
    try:
        settings: dict[str, Any]
        if db.is_sqlite:
            with db.engine.connect() as conn:
                raw = conn.connection.dbapi_connection
                assert raw is not None
                mode = raw.execute("PRAGMA journal_mode").fetchone()[0]
                level = int(raw.execute("PRAGMA synchronous").fetchone()[0])
            settings = {
                "engine": "sqlite",
                "journal_mode": str(mode),
                "synchronous": _SQLITE_SYNC.get(level, str(level)),
            }
        else:
            isolation = {}
            for name, engine in (("write", db.engine), ("read", db.read_engine)):
                with engine.connect() as conn:
                    isolation[name] = conn.get_isolation_level()
            with db.engine.connect() as conn:
                row = conn.exec_driver_sql(
                    "SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@version"
                ).one()
            settings = {
                "engine": "mariadb",
                "version": str(row[2]),
                "innodb_flush_log_at_trx_commit": int(row[0]),
                "sync_binlog": int(row[1]),
                "isolation_write": isolation["write"],
                "isolation_read": isolation["read"],
            }
    finally:
        if db is not db_or_url:
            db.close()
    shown = ", ".join(f"{k}={v}" for k, v in settings.items() if k != "engine")
    print(f"durability ({label}, {settings['engine']}): {shown}", flush=True)
    return settings


_SQLITE_SYNC = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


@dataclass
class Measured:
    """One peer's samples (after the warm-up) and their median."""

    samples: list[float] = field(default_factory=list)
    warmup: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def alternate(
    peers: dict[str, Callable[[], float]], repeat: int, warmup: int = 1
) -> dict[str, Measured]:
    """Run each peer ``warmup`` times, then ``repeat`` rounds of A B C … A B C …

    Each callable measures once and returns its figure; the result holds every
    sample and the median per peer, in the order of ``peers``.
    """
    out = {name: Measured() for name in peers}
    for _ in range(warmup):
        for name, measure in peers.items():
            out[name].warmup.append(measure())
    for _ in range(max(1, repeat)):
        for name, measure in peers.items():
            out[name].samples.append(measure())
    return out
