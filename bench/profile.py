"""Where the time goes: a cProfile of one hot path, its top functions printed.

The benches say how fast; this says what bounds it. Each path runs once unprofiled
(a warm-up, whose wall time is printed) and once under cProfile on the same data;
the top functions by own time (``--sort tottime``, the default) or by cumulative
time are printed. cProfile inflates many small Python calls, so read the shares,
not the absolute seconds. SQLite only (a fresh store in a temporary directory).

Paths:
  rebuild  - ``projections rebuild --workers 1 --no-chain-check`` over a synthetic log
  audit    - ``audit verify`` with lifecycle and catalog replay, one worker
  append   - the recorder appending 100-event batches (no inline views)
  publish  - an incremental publish after one pack of a --scale x catalog changed (the
             parent published incrementally: its fragments kept)
  apply    - a release changing 1 pack among --packs (default 4,000), the catalog applied
             and published first (R30)

Usage:
  python -m bench.profile {rebuild,audit,append,publish,apply} [--events 200000] [--scale 4]
                          [--packs 4000]
                          [--top 15] [--sort tottime|cumulative] [--out FILE.prof]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.append import stored_events
from bench.publish import change_one_pack, setup
from bench.rebuild import build_log
from ledger.api import Store
from ledger.audit.verify import verify_log
from ledger.commands.service import CommandService
from ledger.log.db import open_database
from ledger.log.recorder import LedgerRecorder
from ledger.store.init import init_store
from ledger.store.runtime import Ledger


def _log(folder: Path, events: int) -> str:
    url = f"sqlite:///{folder / 'log.db'}"
    db = open_database(url)
    try:
        init_store(db)
        started = time.perf_counter()
        head = build_log(db, events)
        print(f"built a log of {head:,} events in {time.perf_counter() - started:.0f} s")
    finally:
        db.close()
    return url


def rebuild(folder: Path, args: argparse.Namespace) -> Callable[[], object]:
    store = Store(_log(folder, args.events))
    return lambda: store.rebuild(workers=1, chain_check=False)


def audit(folder: Path, args: argparse.Namespace) -> Callable[[], object]:
    ledger = Ledger(open_database(_log(folder, args.events)))
    return lambda: verify_log(ledger, replay=True, views=False, workers=1)


def append(folder: Path, args: argparse.Namespace) -> Callable[[], object]:
    events = stored_events(args.events)
    stores = []
    for n in range(2):  # the warm-up's store and the profiled one, initialized untimed
        db = open_database(f"sqlite:///{folder / f'append-{n}.db'}")
        init_store(db)
        stores.append(db)

    def run() -> None:
        db = stores.pop(0)
        try:
            recorder = LedgerRecorder(db)
            for start in range(0, len(events), 100):
                recorder.insert_events(events[start : start + 100])
        finally:
            db.close()

    return run


def publish(folder: Path, args: argparse.Namespace) -> Callable[[], object]:
    url, _ = setup(folder, args.scale)
    change_one_pack(folder, url, pack=0)  # published below: its fragments are kept
    change_one_pack(folder, url, pack=1)
    source = folder / "catalog.db"
    runs = iter(range(1_000_000))

    def run() -> None:
        copy = folder / f"run-{next(runs)}.db"
        shutil.copyfile(source, copy)
        db = open_database(f"sqlite:///{copy}")
        try:
            result = CommandService(Ledger(db)).publish()
            assert result["published"], result
        finally:
            db.close()

    return run


def apply(folder: Path, args: argparse.Namespace) -> Callable[[], object]:
    """A release changing one pack among --packs, after those were applied and published
    (each run changes another pack: the warm-up's and the profiled one)."""
    from bench.apply import pack_files, timed_apply, write_manifest
    from tests.support.gitrepo import Repo

    repo = Repo(folder / "repo")
    revisions = dict.fromkeys(range(args.packs), repo.commit(pack_files(range(args.packs))))
    db = open_database(f"sqlite:///{folder / 'apply.db'}")
    init_store(db)
    timed_apply(db, write_manifest(folder / "first.json", repo.path, revisions))
    runs = iter(range(1, 1_000_000))

    def run() -> None:
        release = next(runs)
        n = (release * 7919) % args.packs
        revisions[n] = repo.commit(pack_files(range(n, n + 1), release, changed=n))
        applied = timed_apply(db, write_manifest(folder / f"{release}.json", repo.path, revisions))
        assert not applied.noop

    return run


PATHS = {
    "rebuild": rebuild,
    "audit": audit,
    "append": append,
    "publish": publish,
    "apply": apply,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("path", choices=sorted(PATHS))
    parser.add_argument("--events", type=int, default=None, help="log size (default 200000)")
    parser.add_argument("--scale", type=int, default=4, help="publish: catalog scale")
    parser.add_argument("--packs", type=int, default=4000, help="apply: catalog size")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--sort", choices=["tottime", "cumulative"], default="tottime")
    parser.add_argument("--out", default=None, help="also write the raw profile here")
    args = parser.parse_args()
    if args.events is None:
        args.events = 20_000 if args.path == "append" else 200_000
    with tempfile.TemporaryDirectory() as tmp:
        run = PATHS[args.path](Path(tmp), args)
        started = time.perf_counter()
        run()
        print(f"{args.path}: {time.perf_counter() - started:.2f} s unprofiled (warm-up)")
        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.runcall(run)
        print(f"{args.path}: {time.perf_counter() - started:.2f} s under cProfile")
        if args.out:
            profile.dump_stats(args.out)
        pstats.Stats(profile).strip_dirs().sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
