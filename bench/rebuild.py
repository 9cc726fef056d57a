"""Rebuild throughput: all views from position 0, next to peers measured in the same run.

For a synthetic lifecycle log (installs, advances, retirements; every event is
a real domain event appended through the real recorder), prints events/s for:
  rebuild       - `projections rebuild` of every view (replay + write + swap)
  raw scan      - SELECT of every log row through the DBAPI, no decoding
  stock decode  - eventsourcing's Mapper + JSONTranscoder turning the same stored
                  events into domain event objects (no view writing at all)
and the ratios rebuild/stock decode and rebuild/raw scan.

Usage:
  python -m bench.rebuild [--events 1000000] [--mysql-events 100000]
                          [--engines sqlite,mariadb] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from eventsourcing.persistence import JSONTranscoder, Mapper, StoredEvent
from eventsourcing.utils import Environment, TopicError, register_topic

from bench.common import DEFAULT_MYSQL, mysql_scratch
from domain.event_types import EVENT_TYPES
from ledger.log.db import Database, open_database
from ledger.store.init import init_store
from ledger.store.rebuild import default_workers, process_builder
from ledger.store.runtime import Ledger
from tests.history import bulk_history

PACKS_PER_ROUND_EVENTS = 5  # events per pack per advance round


def build_log(db: Database, events: int) -> int:
    """Append a log of about ``events`` events without inline views (rebuild makes them)."""
    ledger = Ledger(db)
    ledger.recorder.inline_hooks.clear()
    rounds = 10
    packs = max(1, events // (4 + (rounds - 1) * PACKS_PER_ROUND_EVENTS))
    return bulk_history(ledger, packs=packs, rounds=rounds, components=2, batch_events=10_000)


def raw_scan(db: Database) -> float:
    started = time.perf_counter()
    with db.read() as conn:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        cursor.execute(
            "SELECT position, aggregate_id, version, topic, state, event_id, chain "
            "FROM ledger_events ORDER BY position"
        )
        count = 0
        while True:
            rows = cursor.fetchmany(10_000)
            if not rows:
                break
            count += len(rows)
        cursor.close()
    return count / (time.perf_counter() - started)


def stock_decode(db: Database) -> float:
    ledger = Ledger(db)
    stored: list[StoredEvent] = [
        StoredEvent(r.aggregate_id, r.version, r.topic, r.state)
        for r in ledger.recorder.iter_rows(batch=20_000)
    ]
    transcoder = JSONTranscoder()
    mapper: Mapper[Any] = Mapper(transcoder=transcoder)
    # Stock eventsourcing resolves topics through its registry: name our stored topics
    # there (as it supports for renamed classes), so it decodes the very same rows.
    for t in EVENT_TYPES:
        with contextlib.suppress(TopicError):
            register_topic(t.topic, t.cls)
    started = time.perf_counter()
    for item in stored:
        mapper.to_domain_event(item)
    return len(stored) / (time.perf_counter() - started)


def rebuild(db: Database, url: str, workers: int) -> tuple[float, int]:
    """What `catalog-ledger projections rebuild` does (same builder, same workers)."""
    ledger = Ledger(db)
    head = ledger.recorder.head().position
    started = time.perf_counter()
    ledger.runner.rebuild(db, builder=process_builder(url), workers=workers)
    return head / (time.perf_counter() - started), head


def measure(label: str, url: str, events: int, repeat: int) -> None:
    db = open_database(url)
    init_store(db)
    started = time.perf_counter()
    made = build_log(db, events)
    print(f"\n{label}: built a log of {made:,} events in {time.perf_counter() - started:.0f} s")
    workers = default_workers()
    rates: dict[str, list[float]] = {
        f"rebuild ({workers} workers)": [],
        "rebuild (1 worker)": [],
        "raw scan": [],
        "stock decode": [],
    }
    for _ in range(repeat):
        rates[f"rebuild ({workers} workers)"].append(rebuild(db, url, workers)[0])
        rates["rebuild (1 worker)"].append(rebuild(db, url, 1)[0])
        rates["raw scan"].append(raw_scan(db))
        rates["stock decode"].append(stock_decode(db))
    db.close()
    medians = {k: statistics.median(v) for k, v in rates.items()}
    for name, rate in medians.items():
        print(f"  {name:<22} {rate:>12,.0f} events/s  (median of {repeat})")
    best = medians[f"rebuild ({workers} workers)"]
    print(f"  ratio rebuild / stock decode {best / medians['stock decode']:>8.2f}")
    print(f"  ratio rebuild / raw scan     {best / medians['raw scan']:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--mysql-events", type=int, default=100_000)
    parser.add_argument("--engines", default="sqlite,mariadb")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--mysql-url",
        default=DEFAULT_MYSQL,
    )
    args = parser.parse_args()
    engines = args.engines.split(",")
    _ = Environment  # stock eventsourcing is imported for its Mapper/JSONTranscoder
    if "sqlite" in engines:
        with tempfile.TemporaryDirectory() as tmp:
            measure(
                "SQLite (WAL, synchronous=FULL)",
                f"sqlite:///{Path(tmp) / 'rebuild.db'}",
                args.events,
                args.repeat,
            )
    if "mariadb" in engines:
        with mysql_scratch(args.mysql_url) as (url, _):
            measure("MariaDB", url, args.mysql_events, args.repeat)


if __name__ == "__main__":
    main()
