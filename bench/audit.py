"""Audit throughput over a million-event SQLite log, next to its peers in the same run.

Prints events/s for:
  audit chain+merkle   - `audit verify --no-replay --no-views`: every event_id and
                         chain link recomputed from stored bytes, the Merkle root;
                         with the CLI's default workers and with one
  audit with replay    - the same plus lifecycle and catalog replay (`--no-views`)
  raw scan             - SELECT of every row's columns through the DBAPI, no work
  raw hashing          - BLAKE3 of every stored state + SHA-256 leaf of every event_id,
                         from memory (the irreducible hashing of the same bytes)

Usage:
  python -m bench.audit [--events 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

from blake3 import blake3

from bench.rebuild import build_log
from domain.digests import Purpose
from ledger.audit.verify import verify_log
from ledger.log.db import Database, open_database
from ledger.store.init import init_store
from ledger.store.rebuild import default_workers
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = open_database(f"sqlite:///{Path(tmp) / 'audit.db'}")
        init_store(db)
        started = time.perf_counter()
        made = build_log(db, args.events)
        print(
            f"audit benchmark: SQLite (WAL), a log of {made:,} events built in "
            f"{time.perf_counter() - started:.0f} s; median of {args.repeat} runs"
        )
        workers = default_workers()
        parallel, single = (
            f"audit chain+merkle ({workers} workers)",
            "audit chain+merkle (1 worker)",
        )
        replayed = f"audit with replay ({workers} workers)"
        rates: dict[str, list[float]] = {
            parallel: [],
            single: [],
            replayed: [],
            "raw scan": [],
            "raw hashing": [],
        }
        for _ in range(args.repeat):
            rates[parallel].append(audit(db, replay=False, workers=workers))
            rates[single].append(audit(db, replay=False, workers=1))
            rates[replayed].append(audit(db, replay=True, workers=workers))
            scan_rate, rows = raw_scan(db)
            rates["raw scan"].append(scan_rate)
            rates["raw hashing"].append(raw_hashing(rows))
            del rows
        medians = {k: statistics.median(v) for k, v in rates.items()}
        for name, rate in medians.items():
            print(f"  {name:<34} {rate:>12,.0f} events/s")
        chain = medians[parallel]
        print(f"  ratio chain+merkle / raw scan     {chain / medians['raw scan']:6.2f}")
        print(f"  ratio chain+merkle / raw hashing  {chain / medians['raw hashing']:6.2f}")
        db.close()


if __name__ == "__main__":
    main()
