"""Import throughput: ``import --jsonl`` of a synthetic export, on SQLite and MariaDB.

Builds a lifecycle log of about ``--events`` events on SQLite, exports it, and
imports the export into a fresh store on each engine, printing events/s for
  load     - reading, checking (event id, chain, type, labels) and inserting every
             line in one transaction (``ledger.store.restore``)
  rebuild  - rebuilding every view afterwards (what ``import`` runs next)
  total    - both, i.e. ``catalog-ledger import --jsonl``

Usage:
  python -m bench.import_jsonl [--events 200000] [--engines sqlite,mariadb]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

from bench.common import DEFAULT_MYSQL, mysql_scratch
from bench.rebuild import build_log
from ledger.api import open_store
from ledger.log.db import open_database
from ledger.store.init import init_store
from ledger.store.restore import import_jsonl, read_lines


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--engines", default="sqlite,mariadb")
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
        print(f"export: {built} events, {size / 1e6:.1f} MB")
        for engine in args.engines.split(","):
            with contextlib.ExitStack() as stack:
                if engine == "sqlite":
                    url = f"sqlite:///{folder / 'target.db'}"
                else:
                    url, _ = stack.enter_context(mysql_scratch(DEFAULT_MYSQL))
                events, load, rebuild = measure(url, export)
            print(
                f"{engine:8} load {events / load:>9,.0f} ev/s ({load:.1f} s)  "
                f"rebuild {events / rebuild:>9,.0f} ev/s ({rebuild:.1f} s)  "
                f"total {events / (load + rebuild):>9,.0f} ev/s ({load + rebuild:.1f} s)"
            )


if __name__ == "__main__":
    main()
