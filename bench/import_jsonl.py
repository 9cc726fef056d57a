"""Import throughput: ``import --jsonl`` of a synthetic export, on SQLite and MariaDB.

Builds a lifecycle log of about ``--events`` events on SQLite, exports it, and
imports the export into a fresh store on each engine, printing events/s for
  load     - reading, checking (event id, chain, type, labels) and inserting every
             line in one transaction (``ledger.store.restore``)
  rebuild  - rebuilding every view afterwards (what ``import`` runs next)
  total    - both, i.e. ``catalog-ledger import --jsonl``
and, as the peer measured in the same run,
  raw load - orjson-parsing every line, base64-decoding its state and inserting the
             same seven columns into an equivalent table with DBAPI executemany, in
             one transaction (no checks, no hashing)
Every run is into a fresh database; after one warm-up run of each, import and raw
load alternate for --repeat rounds; medians. The engine's durability settings are
printed first, SUMMARY lines last.

Usage:
  python -m bench.import_jsonl [--events 200000] [--engines sqlite,mariadb] [--repeat 3]
"""

from __future__ import annotations

import argparse
import base64
import secrets
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from bench.common import DEFAULT_MYSQL, alternate, durability, mysql_connect, mysql_scratch, summary
from bench.rebuild import build_log
from ledger.api import open_store
from ledger.log.db import open_database
from ledger.store.init import init_store
from ledger.store.rebuild import default_workers
from ledger.store.restore import import_jsonl, read_lines

RAW_BATCH = 10_000


def measure(url: str, export: Path) -> tuple[int, float, float]:
    """(events, load seconds, rebuild seconds) of importing ``export`` into ``url``."""
    with open_store(url) as store:
        store.init()
        with export.open("rb") as handle:
            started = time.perf_counter()
            restored = import_jsonl(store.ledger, read_lines(handle, name=str(export)))
            loaded = time.perf_counter()
        store.rebuild()
        rebuilt = time.perf_counter()
    return restored.imported, loaded - started, rebuilt - loaded


def _raw_rows(export: Path) -> Iterator[tuple[Any, ...]]:
    with export.open("rb") as handle:
        for line in handle:
            doc = orjson.loads(line)
            if "trailer" in doc:  # the last line (LOG-FORMAT.md "Trailer"), not an event
                continue
            yield (
                doc["position"],
                bytes.fromhex(doc["aggregate_id"].replace("-", "")),
                doc["version"],
                doc["topic"].encode(),
                base64.b64decode(doc["state_b64"]),
                bytes.fromhex(doc["event_id"]),
                bytes.fromhex(doc["chain"]),
            )


def _chunks(rows: Iterator[tuple[Any, ...]]) -> Iterator[list[tuple[Any, ...]]]:
    chunk: list[tuple[Any, ...]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == RAW_BATCH:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def raw_load_sqlite(folder: Path, export: Path) -> tuple[int, float]:
    """(rows, seconds) of the raw load into a fresh SQLite file (WAL, synchronous=FULL)."""
    conn = sqlite3.connect(folder / f"raw-{secrets.token_hex(4)}.db", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(
            "CREATE TABLE raw_events (position INTEGER PRIMARY KEY, aggregate_id BLOB NOT NULL, "
            "version INTEGER NOT NULL, topic BLOB NOT NULL, state BLOB NOT NULL, "
            "event_id BLOB NOT NULL, chain BLOB NOT NULL, UNIQUE (aggregate_id, version))"
        )
        started = time.perf_counter()
        count = 0
        conn.execute("BEGIN IMMEDIATE")
        for chunk in _chunks(_raw_rows(export)):
            conn.executemany("INSERT INTO raw_events VALUES (?,?,?,?,?,?,?)", chunk)
            count += len(chunk)
        conn.execute("COMMIT")
        return count, time.perf_counter() - started
    finally:
        conn.close()


def raw_load_mysql(url: str, export: Path) -> tuple[int, float]:
    """(rows, seconds) of the raw load into a fresh MariaDB database (InnoDB)."""
    with mysql_scratch(url, "bench_raw_") as (_, name):
        conn = mysql_connect(url, name)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "CREATE TABLE raw_events (position BIGINT PRIMARY KEY, aggregate_id "
                    "VARBINARY(16) NOT NULL, version BIGINT NOT NULL, topic VARBINARY(255) "
                    "NOT NULL, state LONGBLOB NOT NULL, event_id VARBINARY(32) NOT NULL, "
                    "chain VARBINARY(32) NOT NULL, UNIQUE (aggregate_id, version))"
                )
            conn.autocommit(False)
            started = time.perf_counter()
            count = 0
            with conn.cursor() as cur:
                for chunk in _chunks(_raw_rows(export)):
                    cur.executemany("INSERT INTO raw_events VALUES (%s,%s,%s,%s,%s,%s,%s)", chunk)
                    count += len(chunk)
            conn.commit()
            return count, time.perf_counter() - started
        finally:
            conn.close()


@contextmanager
def _target(engine: str, folder: Path, mysql_url: str) -> Iterator[str]:
    if engine == "sqlite":
        path = folder / f"target-{secrets.token_hex(4)}.db"
        try:
            yield f"sqlite:///{path}"
        finally:
            for leftover in folder.glob(path.name + "*"):
                leftover.unlink()
    else:
        with mysql_scratch(mysql_url) as (url, _):
            yield url


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--engines", default="sqlite,mariadb")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mysql-url", default=DEFAULT_MYSQL)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        source = open_database(f"sqlite:///{folder / 'source.db'}")
        init_store(source)
        built = build_log(source, args.events)
        source.close()
        export = folder / "export.jsonl"
        with open_store(f"sqlite:///{folder / 'source.db'}") as store, export.open("w") as out:
            store.export(out)
        size = export.stat().st_size
        print(
            f"export: {built} events, {size / 1e6:.1f} MB; one warm-up run of each, then "
            f"{args.repeat} alternating rounds (import, raw load), medians"
        )
        for engine in args.engines.split(","):
            with _target(engine, folder, args.mysql_url) as url:
                durability(url)
            if engine == "sqlite":
                print("durability (raw load, sqlite): journal_mode=wal, synchronous=FULL")
            else:
                print("durability (raw load, mariadb): the same server, autocommit off")
            loads: list[float] = []
            rebuilds: list[float] = []
            events_seen: list[int] = []

            def ledger_run(
                engine: str = engine,
                events_seen: list[int] = events_seen,
                loads: list[float] = loads,
                rebuilds: list[float] = rebuilds,
            ) -> float:
                with _target(engine, folder, args.mysql_url) as url:
                    events, load, rebuild = measure(url, export)
                events_seen.append(events)
                loads.append(load)
                rebuilds.append(rebuild)
                return events / load

            def raw_run(engine: str = engine) -> float:
                if engine == "sqlite":
                    rows, seconds = raw_load_sqlite(folder, export)
                else:
                    rows, seconds = raw_load_mysql(args.mysql_url, export)
                for leftover in folder.glob("raw-*.db*"):
                    leftover.unlink()
                return rows / seconds

            measured = alternate({"import load": ledger_run, "raw load": raw_run}, args.repeat)
            events = events_seen[-1]
            load = statistics.median(loads[1:])
            rebuild = statistics.median(rebuilds[1:])
            total = statistics.median(a + b for a, b in zip(loads[1:], rebuilds[1:], strict=True))
            raw = measured["raw load"].median
            print(
                f"{engine:8} load {events / load:>9,.0f} ev/s ({load:.2f} s)  "
                f"rebuild {events / rebuild:>9,.0f} ev/s ({rebuild:.2f} s)  "
                f"total {events / total:>9,.0f} ev/s ({total:.2f} s)  "
                f"raw load {raw:>9,.0f} ev/s  load/raw {events / load / raw:.2f}"
            )
            common = {"bench": "import_jsonl", "engine": engine, "workers": 1}
            summary(
                **common,
                figure="import load",
                value=events / load,
                unit="events/s",
                peer="raw load",
                peer_value=raw,
                target=None,
            )
            summary(
                **dict(common, workers=default_workers()),
                figure="import total (load+rebuild, rebuild's default workers)",
                value=events / total,
                unit="events/s",
                peer=None,
                peer_value=None,
                target=None,
            )


if __name__ == "__main__":
    main()
