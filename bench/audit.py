"""Audit throughput over a million-event SQLite log, next to its peers in the same run.

Prints events/s for:
  audit chain+merkle   - `audit verify --no-replay --no-views`: every event_id and
                         chain link recomputed from stored bytes, the Merkle root;
                         with one worker and with --workers
  audit with replay    - the same plus lifecycle and catalog replay (`--no-views`),
                         with --workers (and one worker with --replay-single)
  raw scan             - SELECT of every row's columns through the DBAPI, no work
                         (one worker: the peer of every ratio; a ratio whose figure ran
                         with more workers says so in its SUMMARY line)
  raw hashing          - BLAKE3 of every stored state + SHA-256 leaf of every event_id,
                         from memory (the irreducible hashing of the same bytes)
After one warm-up run of each, the figures alternate for --repeat rounds; medians.

Usage:
  python -m bench.audit [--events 1000000] [--repeat 3] [--workers 2] [--replay-single]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

from blake3 import blake3

from bench.common import alternate, durability, summary
from bench.rebuild import build_log
from domain.digests import Purpose
from ledger.audit.verify import verify_log
from ledger.log.db import Database, open_database
from ledger.store.init import init_store
from ledger.store.runtime import Ledger


def raw_scan(db: Database) -> tuple[float, list[tuple[bytes, bytes]]]:
    ledger = Ledger(db)
    started = time.perf_counter()
    kept = []
    with db.read() as conn:
        for row in ledger.recorder.scan_full(conn):
            kept.append((row[4], row[5]))
    return len(kept) / (time.perf_counter() - started), kept


def raw_hashing(rows: list[tuple[bytes, bytes]]) -> float:
    base = blake3(derive_key_context=Purpose.EVENT_ID.value)
    started = time.perf_counter()
    for state, event_id in rows:
        h = base.copy()
        h.update(state)
        h.digest()
        hashlib.sha256(b"\x00" + event_id).digest()
    return len(rows) / (time.perf_counter() - started)


def audit(db: Database, *, replay: bool, workers: int) -> float:
    ledger = Ledger(db)
    started = time.perf_counter()
    report = verify_log(ledger, replay=replay, views=False, workers=workers)
    elapsed = time.perf_counter() - started
    if not report.ok:
        raise SystemExit(f"the benchmark log does not verify: {report.first()}")
    return report.size / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="the parallel figures' workers")
    parser.add_argument(
        "--replay-single", action="store_true", help="also time replay with one worker"
    )
    args = parser.parse_args()
    workers = args.workers
    with tempfile.TemporaryDirectory() as tmp:
        db = open_database(f"sqlite:///{Path(tmp) / 'audit.db'}")
        init_store(db)
        durability(db)
        started = time.perf_counter()
        made = build_log(db, args.events)
        print(
            f"audit benchmark: SQLite, a log of {made:,} events built in "
            f"{time.perf_counter() - started:.0f} s; one warm-up run of each, then "
            f"{args.repeat} alternating rounds, medians"
        )
        single, parallel = (
            "audit chain+merkle (1 worker)",
            f"audit chain+merkle ({workers} workers)",
        )
        replayed = f"audit with replay ({workers} workers)"
        replayed1 = "audit with replay (1 worker)"
        hashing: list[float] = []

        def scan() -> float:
            rate, rows = raw_scan(db)
            hashing.append(raw_hashing(rows))
            return rate

        peers = {
            single: lambda: audit(db, replay=False, workers=1),
            "raw scan (1 worker)": scan,
            parallel: lambda: audit(db, replay=False, workers=workers),
            replayed: lambda: audit(db, replay=True, workers=workers),
        }
        if args.replay_single:
            peers[replayed1] = lambda: audit(db, replay=True, workers=1)
        measured = alternate(peers, repeat=args.repeat)
        medians = {k: m.median for k, m in measured.items()}
        medians["raw hashing (1 worker)"] = statistics.median(hashing[1:] or hashing)
        for name, rate in medians.items():
            print(f"  {name:<34} {rate:>12,.0f} events/s")
        scan_rate = medians["raw scan (1 worker)"]
        print(
            f"  ratio chain+merkle 1 worker / raw scan 1 worker     "
            f"{medians[single] / scan_rate:6.2f}"
        )
        print(
            f"  ratio chain+merkle {workers} workers / raw scan 1 worker    "
            f"{medians[parallel] / scan_rate:6.2f}"
        )
        print(
            f"  ratio chain+merkle 1 worker / raw hashing 1 worker  "
            f"{medians[single] / medians['raw hashing (1 worker)']:6.2f}"
        )
        common = {"bench": "audit", "engine": "sqlite", "unit": "events/s"}
        summary(
            **common,
            figure="verify with lifecycle+catalog replay",
            workers=workers,
            value=medians[replayed],
            peer="raw scan",
            peer_workers=1,
            peer_value=scan_rate,
            target="value>=150000",
        )
        if args.replay_single:
            summary(
                **common,
                figure="verify with lifecycle+catalog replay",
                workers=1,
                value=medians[replayed1],
                peer="raw scan",
                peer_value=scan_rate,
                target=None,
            )
        summary(
            **common,
            figure="chain+Merkle",
            workers=1,
            value=medians[single],
            peer="raw scan",
            peer_value=scan_rate,
            target=">=0.45",
        )
        summary(
            **common,
            figure="chain+Merkle",
            workers=workers,
            value=medians[parallel],
            peer="raw scan",
            peer_workers=1,
            peer_value=scan_rate,
            target=None,
        )
        db.close()


if __name__ == "__main__":
    main()
