"""Append throughput: this recorder vs stock ``eventsourcing`` vs raw INSERTs, same run.

Every peer is handed the same ``StoredEvent`` objects (mapped once, outside
the timing), so the figures compare recorders, not mappers:
  ledger  - LedgerRecorder.insert_events (head-row lock, chain, BLAKE3 event ids)
  stock   - eventsourcing's own SQLite application recorder (SQLite only)
  popo    - eventsourcing's in-memory recorder (reference, no durability)
  raw     - DBAPI executemany INSERT of the same bytes into an equivalent table
  eventsourcing-sqlalchemy - the stock recorder of the ``eventsourcing-sqlalchemy``
            package on MariaDB (when it is installed; skipped with the reason if not)
Workloads: single-event commits, and 100-event batches (one commit each).
Every run is on a fresh database. After one warm-up run of each peer, the peers
alternate (ledger, stock, raw, ledger, stock, raw, ...) for --repeat rounds and
each figure is the median; the engine's durability settings are printed first and
one SUMMARY line per headline ratio last.

Usage:
  python -m bench.append [--events 2000] [--repeat 5] [--engines sqlite,mariadb]
                         [--mysql-url mysql+pymysql://root@127.0.0.1:3306/test]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import secrets
import sqlite3
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import AggregateRecorder, InfrastructureFactory, Mapper, StoredEvent

from bench.common import DEFAULT_MYSQL, alternate, durability, mysql_connect, mysql_scratch, summary
from ledger.log.db import open_database
from ledger.log.recorder import LedgerRecorder
from ledger.log.transcoder import OrjsonTranscoder
from ledger.store.init import init_store

BATCH = 100
Events = list[StoredEvent]


class Item(Aggregate):
    @event("Created")
    def __init__(self, name: str, payload: dict[str, Any]) -> None:
        self.name = name
        self.payload = payload


def stored_events(count: int) -> Events:
    mapper: Mapper[Any] = Mapper(transcoder=OrjsonTranscoder())
    out: Events = []
    for i in range(count):
        item = Item(name=f"item-{i}", payload={"n": i, "tags": ["a", "b"], "pad": "x" * 64})
        out.extend(mapper.to_stored_event(e) for e in item.collect_events())
    return out


def _timed_batches(
    insert: Callable[[Sequence[StoredEvent]], object], events: Events, batch: int
) -> float:
    started = time.perf_counter()
    for start in range(0, len(events), batch):
        insert(events[start : start + batch])
    return len(events) / (time.perf_counter() - started)


# -- SQLite -----------------------------------------------------------------------------


def sqlite_ledger(folder: Path, events: Events, batch: int) -> float:
    db = open_database(f"sqlite:///{folder / f'ledger-{secrets.token_hex(4)}.db'}")
    init_store(db)
    recorder = LedgerRecorder(db)
    try:
        return _timed_batches(recorder.insert_events, events, batch)
    finally:
        db.close()


def _stock_recorder(env: dict[str, str]) -> AggregateRecorder:
    factory: InfrastructureFactory[Any] = InfrastructureFactory.construct(env)
    return factory.application_recorder()


def sqlite_stock(folder: Path, events: Events, batch: int) -> float:
    path = folder / f"stock-{secrets.token_hex(4)}.db"
    recorder = _stock_recorder(
        {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "SQLITE_DBNAME": str(path),
            "CREATE_TABLE": "y",
        }
    )
    return _timed_batches(recorder.insert_events, events, batch)


def popo(events: Events, batch: int) -> float:
    recorder = _stock_recorder({"PERSISTENCE_MODULE": "eventsourcing.popo"})
    return _timed_batches(recorder.insert_events, events, batch)


_RAW_DDL = (
    "CREATE TABLE raw_events (position INTEGER PRIMARY KEY, aggregate_id BLOB NOT NULL, "
    "version INTEGER NOT NULL, topic BLOB NOT NULL, state BLOB NOT NULL, "
    "event_id BLOB NOT NULL, chain BLOB NOT NULL, UNIQUE (aggregate_id, version))"
)


def _raw_rows(events: Events) -> list[tuple[Any, ...]]:
    return [
        (
            position,
            UUID(str(e.originator_id)).bytes,
            e.originator_version,
            e.topic.encode(),
            e.state,
            bytes(32),
            bytes(32),
        )
        for position, e in enumerate(events, start=1)
    ]


def sqlite_raw(folder: Path, events: Events, batch: int) -> float:
    path = folder / f"raw-{secrets.token_hex(4)}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(_RAW_DDL)
    rows = _raw_rows(events)

    def insert(chunk: Sequence[tuple[Any, ...]]) -> None:
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO raw_events VALUES (?,?,?,?,?,?,?)", chunk)
        conn.execute("COMMIT")

    rate = _timed_batches(insert, rows, batch)  # type: ignore[arg-type]
    conn.close()
    return rate


def stock_synchronous(folder: Path) -> str:
    path = folder / "probe.db"
    _stock_recorder(
        {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "SQLITE_DBNAME": str(path),
            "CREATE_TABLE": "y",
        }
    )
    conn = sqlite3.connect(path)
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    level = conn.execute("PRAGMA synchronous").fetchone()[0]
    conn.close()
    sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[level]
    return f"journal_mode={mode}, synchronous={sync} (SQLite default, not changed by stock)"


# -- MariaDB ----------------------------------------------------------------------------


def mysql_ledger(url: str, events: Events, batch: int) -> float:
    with mysql_scratch(url) as (scratch_url, _):
        db = open_database(scratch_url)
        try:
            init_store(db)
            return _timed_batches(LedgerRecorder(db).insert_events, events, batch)
        finally:
            db.close()


def mysql_raw(url: str, events: Events, batch: int) -> float:
    with mysql_scratch(url) as (_, name):
        return _mysql_raw(url, name, events, batch)


def _mysql_raw(url: str, name: str, events: Events, batch: int) -> float:
    conn = mysql_connect(url, name)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "CREATE TABLE raw_events (position BIGINT PRIMARY KEY, aggregate_id VARBINARY(16) "
                "NOT NULL, version BIGINT NOT NULL, topic VARBINARY(255) NOT NULL, state LONGBLOB "
                "NOT NULL, event_id VARBINARY(32) NOT NULL, chain VARBINARY(32) NOT NULL, "
                "UNIQUE (aggregate_id, version))"
            )
        conn.autocommit(False)
        rows = _raw_rows(events)

        def insert(chunk: Sequence[tuple[Any, ...]]) -> None:
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO raw_events VALUES (%s,%s,%s,%s,%s,%s,%s)", chunk)
            conn.commit()

        return _timed_batches(insert, rows, batch)  # type: ignore[arg-type]
    finally:
        conn.close()


def esa_available() -> str | None:
    """Why the ``eventsourcing-sqlalchemy`` peer cannot run here, or ``None`` if it can."""
    try:
        version = importlib.metadata.version("eventsourcing-sqlalchemy")
        importlib.import_module("eventsourcing_sqlalchemy")
    except (ImportError, importlib.metadata.PackageNotFoundError) as exc:
        return f"eventsourcing-sqlalchemy is not installed ({exc})"
    stock = importlib.metadata.version("eventsourcing")
    if not stock.startswith("9."):
        return f"eventsourcing-sqlalchemy {version} needs eventsourcing 9, found {stock}"
    return None


def esa_note() -> str:
    """The installed ``eventsourcing-sqlalchemy`` and what it declares it needs."""
    version = importlib.metadata.version("eventsourcing-sqlalchemy")
    wants = [
        r
        for r in importlib.metadata.requires("eventsourcing-sqlalchemy") or []
        if r.lower().startswith(("sqlalchemy ", "sqlalchemy(", "sqlalchemy>", "eventsourcing"))
    ]
    found = ", ".join(
        f"{n} {importlib.metadata.version(n)}" for n in ("eventsourcing", "SQLAlchemy")
    )
    return f"eventsourcing-sqlalchemy {version} (declares {'; '.join(wants)}; running with {found})"


def mysql_esa(url: str, events: Events, batch: int) -> float:
    """``eventsourcing-sqlalchemy``'s application recorder on a fresh MariaDB database."""
    with mysql_scratch(url) as (scratch_url, _):
        recorder = _stock_recorder(
            {
                "PERSISTENCE_MODULE": "eventsourcing_sqlalchemy",
                "SQLALCHEMY_URL": scratch_url,
                "CREATE_TABLE": "y",
            }
        )
        try:
            return _timed_batches(recorder.insert_events, events, batch)
        finally:
            engine = getattr(getattr(recorder, "datastore", None), "engine", None)
            if engine is not None:
                engine.dispose()


def mysql_durability(url: str) -> str:
    with mysql_connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@version")
        flush, sync_binlog, version = cur.fetchone()
    return f"{version}: innodb_flush_log_at_trx_commit={flush}, sync_binlog={sync_binlog}"


# -- report -----------------------------------------------------------------------------

STOCK = "stock eventsourcing SQLite recorder"
POPO = "stock eventsourcing POPO (reference)"
RAW = "raw executemany"
ESA = "eventsourcing-sqlalchemy"
Peer = Callable[[Events, int], float]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=2000, help="single-event commits per run")
    parser.add_argument(
        "--batch-events", type=int, default=None, help="events per batched run (5x --events)"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--engines", default="sqlite,mariadb")
    parser.add_argument("--mysql-url", default=DEFAULT_MYSQL)
    parser.add_argument("--no-esa", action="store_true", help="skip eventsourcing-sqlalchemy")
    args = parser.parse_args()
    engines = args.engines.split(",")
    batch_events = args.batch_events or args.events * 5
    print(
        f"append benchmark: {args.events} single-event commits / {batch_events} batched events "
        f"per run; one warm-up run of each peer, then {args.repeat} alternating rounds, medians"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "sqlite" in engines:
            print("\nSQLite")
            durability(f"sqlite:///{folder / 'durability.db'}", "ledger")
            print(f"durability (stock, sqlite): {stock_synchronous(folder)}")
            print("durability (raw, sqlite): journal_mode=wal, synchronous=FULL")
            rates = _report_engine(
                {
                    "ledger": lambda it, b: sqlite_ledger(folder, it, b),
                    STOCK: lambda it, b: sqlite_stock(folder, it, b),
                    POPO: popo,
                    RAW: lambda it, b: sqlite_raw(folder, it, b),
                },
                args.events,
                batch_events,
                args.repeat,
            )
            _summaries("sqlite", rates, {RAW: (">=0.85", ">=0.85"), STOCK: (">=1.0", None)})
        if "mariadb" in engines:
            print("\nMariaDB")
            with mysql_scratch(args.mysql_url) as (scratch, _):
                durability(scratch, "ledger")
            print(f"durability (raw, mariadb): {mysql_durability(args.mysql_url)}, autocommit off")
            peers: dict[str, Peer] = {
                "ledger": lambda it, b: mysql_ledger(args.mysql_url, it, b),
                RAW: lambda it, b: mysql_raw(args.mysql_url, it, b),
            }
            why = "--no-esa" if args.no_esa else esa_available()
            if why is None:
                print(
                    f"durability ({ESA}, mariadb): the same server, SQLAlchemy default "
                    f"isolation (REPEATABLE READ); {esa_note()}"
                )
                peers[ESA] = lambda it, b: mysql_esa(args.mysql_url, it, b)
            else:
                print(f"skipped peer {ESA}: {why}")
            rates = _report_engine(peers, args.events, batch_events, args.repeat)
            _summaries("mariadb", rates, {RAW: (">=0.85", ">=0.75"), ESA: (None, None)})


def _report_engine(
    peers: dict[str, Peer], events: int, batch_events: int, repeat: int
) -> dict[str, dict[str, float]]:
    """Median events/s per workload label and peer, the peers alternating."""
    out: dict[str, dict[str, float]] = {}
    for label, batch, count in (
        ("single-event commits", 1, events),
        (f"{BATCH}-event batches", BATCH, batch_events),
    ):
        workload = stored_events(count)
        measured = alternate(
            {name: functools.partial(fn, workload, batch) for name, fn in peers.items()},
            repeat=repeat,
        )
        out[label] = {name: m.median for name, m in measured.items()}
        print(f"  {label} ({count} events, median of {repeat} after a warm-up):")
        for name, m in measured.items():
            spread = ", ".join(f"{v:,.0f}" for v in m.samples)
            print(f"    {name:<40} {m.median:>12,.0f} events/s   [{spread}]")
        ours = out[label]["ledger"]
        for name in peers:
            if name not in ("ledger", POPO):
                print(f"    ratio ledger / {name:<34} {ours / out[label][name]:>6.2f}")
    return out


def _summaries(
    engine: str,
    rates: dict[str, dict[str, float]],
    targets: dict[str, tuple[str | None, str | None]],
) -> None:
    """SUMMARY lines: batches and single commits against each peer (batch, single target)."""
    for label, index in ((f"{BATCH}-event batches", 0), ("single-event commits", 1)):
        for peer, target in targets.items():
            if peer not in rates[label]:
                continue
            if index == 1 and peer not in (RAW,):
                continue
            summary(
                bench="append",
                figure=label,
                engine=engine,
                workers=1,
                value=rates[label]["ledger"],
                unit="events/s",
                peer=peer,
                peer_value=rates[label][peer],
                target=target[index],
            )


if __name__ == "__main__":
    main()
