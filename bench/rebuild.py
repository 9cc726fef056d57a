"""Rebuild throughput: all views from position 0, next to peers measured in the same run.

For a synthetic lifecycle log (installs, advances, retirements; every event is
a real domain event appended through the real recorder), prints events/s for:
  rebuild (1 worker)     - `projections rebuild --workers 1 --no-chain-check`: every
                           view replayed and written by one process, then swapped
  rebuild (N workers)    - the same with N view processes (`--workers N`)
  rebuild (default)      - `projections rebuild` as shipped: default workers and the
                           chain check (R22) running in a worker of its own
  raw scan               - SELECT of every log row through the DBAPI, no decoding
  stock decode           - eventsourcing's Mapper + JSONTranscoder turning the same
                           stored events into domain event objects (rows fetched
                           beforehand, untimed: decoding only, no view writing)
The ratios (target: rebuild >= 0.4x raw scan and >= 1.2x stock decode) divide the
1-worker figure, with the chain check off, by the single-threaded peers; the
N-worker and default figures are printed beside them. After a warm-up round, the
project's figures and the peers alternate (A B A B) for --repeat rounds; medians.

Usage:
  python -m bench.rebuild [--events 1000000] [--mysql-events 1000000]
                          [--engines sqlite,mariadb] [--repeat 3] [--workers 2]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eventsourcing.persistence import JSONTranscoder, Mapper, StoredEvent
from eventsourcing.utils import TopicError, register_topic

from bench.common import DEFAULT_MYSQL, alternate, durability, mysql_scratch, summary
from domain.event_types import EVENT_TYPES
from ledger.api import Store
from ledger.log.db import Database, open_database
from ledger.store.init import init_store
from ledger.store.rebuild import default_workers
from ledger.store.runtime import Ledger
from tests.support.history import bulk_history

PACKS_PER_ROUND_EVENTS = 5  # events per pack per advance round
_DECODE_PAGE = 20_000


def build_log(db: Database, events: int) -> int:
    """Append a log of about ``events`` events without inline views (rebuild makes them).

    The fastest building path there is: the real aggregates and recorder, large
    batches, no per-command preflight, no inline views."""
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


def _stock_mapper() -> Mapper[Any]:
    # Stock eventsourcing resolves topics through its registry: name our stored topics
    # there (as it supports for renamed classes), so it decodes the very same rows.
    for t in EVENT_TYPES:
        with contextlib.suppress(TopicError):
            register_topic(t.topic, t.cls)
    return Mapper(transcoder=JSONTranscoder())


def stock_decode(db: Database) -> float:
    """Events/s of ``Mapper.to_domain_event`` over every stored row (page by page: the
    fetching is not timed, so this is the stock library's decoding alone)."""
    ledger = Ledger(db)
    mapper = _stock_mapper()
    decoded, elapsed, page = 0, 0.0, []
    for r in ledger.recorder.iter_rows(batch=_DECODE_PAGE):
        page.append(StoredEvent(r.aggregate_id, r.version, r.topic, r.state))
        if len(page) == _DECODE_PAGE:
            elapsed += _decode(mapper, page)
            decoded += len(page)
            page = []
    elapsed += _decode(mapper, page)
    decoded += len(page)
    return decoded / elapsed


def _decode(mapper: Mapper[Any], page: list[StoredEvent]) -> float:
    started = time.perf_counter()
    for item in page:
        mapper.to_domain_event(item)
    return time.perf_counter() - started


def rebuild(url: str, head: int, workers: int | None, chain_check: bool) -> float:
    """What `catalog-ledger projections rebuild [--workers N] [--no-chain-check]` does."""
    store = Store(url)
    try:
        _ = store.ledger  # opened (schema contract checked) before the clock starts
        started = time.perf_counter()
        store.rebuild(workers=workers, chain_check=chain_check)
        return head / (time.perf_counter() - started)
    finally:
        store.close()


def measure(engine: str, url: str, events: int, repeat: int, workers: int) -> None:
    db = open_database(url)
    init_store(db)
    durability(db, "store")
    started = time.perf_counter()
    head = build_log(db, events)
    print(f"\n{engine}: built a log of {head:,} events in {time.perf_counter() - started:.0f} s")
    default = default_workers()
    one = "rebuild (1 worker, no chain check)"
    many = f"rebuild ({workers} workers, no chain check)"
    shipped = f"rebuild (default: {default} workers, chain check on)"
    peers: dict[str, Callable[[], float]] = {
        one: lambda: rebuild(url, head, 1, False),
        "raw scan": lambda: raw_scan(db),
        "stock decode": lambda: stock_decode(db),
        many: lambda: rebuild(url, head, workers, False),
        shipped: lambda: rebuild(url, head, None, True),
    }
    measured = alternate(peers, repeat, warmup=1)
    db.close()
    medians = {name: m.median for name, m in measured.items()}
    print(f"  (one warm-up round, then {repeat} alternating rounds; medians)")
    for name, rate in medians.items():
        print(f"  {name:<44} {rate:>12,.0f} events/s")
    scan, stock = medians["raw scan"], medians["stock decode"]
    for label, figure in ((one, medians[one]), (many, medians[many])):
        print(f"  {label}: {figure / scan:.2f}x raw scan, {figure / stock:.2f}x stock decode")
    print(f"  {shipped}: {medians[shipped] / scan:.2f}x raw scan")
    common = {"bench": "rebuild", "engine": engine, "unit": "events/s", "events": head}
    summary(
        figure="rebuild all views, chain check off / raw scan",
        workers=1,
        value=medians[one],
        peer="raw scan",
        peer_value=scan,
        target=">=0.4",
        **common,
    )
    summary(
        figure="rebuild all views, chain check off / stock eventsourcing decode",
        workers=1,
        value=medians[one],
        peer="stock eventsourcing decode",
        peer_value=stock,
        target=">=1.2",
        **common,
    )
    summary(
        figure=f"rebuild all views, {workers} workers, chain check off / raw scan",
        workers=workers,
        value=medians[many],
        peer="raw scan",
        peer_value=scan,
        peer_workers=1,
        target=None,
        **common,
    )
    summary(
        figure="rebuild all views, default (chain check on) / raw scan",
        workers=default,
        value=medians[shipped],
        peer="raw scan",
        peer_value=scan,
        peer_workers=1,
        target=None,
        **common,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000, help="SQLite log size")
    parser.add_argument("--mysql-events", type=int, default=1_000_000, help="MariaDB log size")
    parser.add_argument("--engines", default="sqlite,mariadb")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="the parallel figure's workers")
    parser.add_argument("--mysql-url", default=DEFAULT_MYSQL)
    args = parser.parse_args()
    engines = args.engines.split(",")
    if "sqlite" in engines:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'rebuild.db'}"
            measure("sqlite", url, args.events, args.repeat, args.workers)
    if "mariadb" in engines:
        with mysql_scratch(args.mysql_url) as (url, _):
            measure("mariadb", url, args.mysql_events, args.repeat, args.workers)


if __name__ == "__main__":
    main()
