"""Append throughput: this recorder vs stock ``eventsourcing`` vs raw INSERTs, same run.

Every peer is handed the same ``StoredEvent`` objects (mapped once, outside
the timing), so the figures compare recorders, not mappers:
  ledger  - LedgerRecorder.insert_events (head-row lock, chain, BLAKE3 event ids)
  stock   - eventsourcing's own SQLite application recorder (SQLite only)
  popo    - eventsourcing's in-memory recorder (reference, no durability)
  raw     - DBAPI executemany INSERT of the same bytes into an equivalent table
Workloads: single-event commits, and 100-event batches (one commit each).
Each figure is the median of --repeat runs, each on a fresh database.

Usage:
  python -m bench.append [--events 2000] [--repeat 5] [--engines sqlite,mariadb]
                         [--mysql-url mysql+pymysql://root@127.0.0.1:3306/test]
"""

from __future__ import annotations

import argparse
import secrets
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import AggregateRecorder, InfrastructureFactory, Mapper, StoredEvent

from bench.common import DEFAULT_MYSQL, mysql_connect, mysql_scratch
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


def mysql_durability(url: str) -> str:
    with mysql_connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@version")
        flush, sync_binlog, version = cur.fetchone()
    return f"{version}: innodb_flush_log_at_trx_commit={flush}, sync_binlog={sync_binlog}"


# -- report -----------------------------------------------------------------------------


def median_rate(
    measure: Callable[[Events, int], float], events: Events, batch: int, repeat: int
) -> float:
    return statistics.median(measure(events, batch) for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--engines", default="sqlite,mariadb")
    parser.add_argument(
        "--mysql-url",
        default=DEFAULT_MYSQL,
    )
    args = parser.parse_args()
    engines = args.engines.split(",")
    print(f"append benchmark: {args.events} events per run, median of {args.repeat} runs")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "sqlite" in engines:
            print(
                f"\nSQLite (ledger: WAL, synchronous=FULL; stock: {stock_synchronous(folder)};"
                " raw: WAL, synchronous=FULL)"
            )
            _report_engine(
                {
                    "ledger": lambda it, b: sqlite_ledger(folder, it, b),
                    "stock eventsourcing SQLite recorder": lambda it, b: sqlite_stock(
                        folder, it, b
                    ),
                    "stock eventsourcing POPO (reference)": popo,
                    "raw executemany": lambda it, b: sqlite_raw(folder, it, b),
                },
                args.events,
                args.repeat,
                stock="stock eventsourcing SQLite recorder",
            )
        if "mariadb" in engines:
            print(
                f"\nMariaDB ({mysql_durability(args.mysql_url)}; stock eventsourcing has no "
                "MySQL recorder)"
            )
            _report_engine(
                {
                    "ledger": lambda it, b: mysql_ledger(args.mysql_url, it, b),
                    "raw executemany": lambda it, b: mysql_raw(args.mysql_url, it, b),
                },
                args.events,
                args.repeat,
                stock=None,
            )


def _report_engine(
    peers: dict[str, Callable[[Events, int], float]], events: int, repeat: int, stock: str | None
) -> None:
    for label, batch in (("single-event commits", 1), (f"{BATCH}-event batches", BATCH)):
        count = events if batch == 1 else events * 5
        workload = stored_events(count)
        rates = {name: median_rate(fn, workload, batch, repeat) for name, fn in peers.items()}
        print(f"  {label} ({count} events):")
        for name, rate in rates.items():
            print(f"    {name:<40} {rate:>12,.0f} events/s")
        ours = rates["ledger"]
        print(f"    ratio ledger / raw executemany       {ours / rates['raw executemany']:>12.2f}")
        if stock is not None:
            print(f"    ratio ledger / stock eventsourcing   {ours / rates[stock]:>12.2f}")


if __name__ == "__main__":
    main()
