"""`apply` end to end: a release through the real CommandService and store, SQLite and MariaDB.

Two releases, each timed from reading the manifest to the published revision
(resolve, preflight, lease, prepare, final append, inline views):
  full    - a release of --packs packs into a fresh store (one git commit of the
            packs; one audience per pack with 10 bindings)
  one     - a release that changes 1 pack among --among, after those --among packs
            were applied and published (each round changes another pack)
Beside each, the peer measured in the same run: the recorder alone
(``LedgerRecorder.insert_events``) appending as many events as the release
appended, in one call, into a fresh store of the same engine. After one warm-up
run of each, apply and recorder alternate for --repeat rounds; medians. The
SUMMARY ratio is apply seconds / recorder seconds, as for every time figure (how
many times appending the release's events alone apply costs; 1.0 is the floor).

Usage:
  python -m bench.apply [--packs 100] [--among 1000] [--engines sqlite,mariadb] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.append import stored_events
from bench.common import DEFAULT_MYSQL, alternate, durability, mysql_scratch, summary
from bench.publish import (
    COMPONENTS,
    PER_AUDIENCE,
    audience_bindings,
    official_pack,
    pack_document,
)
from ledger.commands.service import CommandService
from ledger.log.db import Database, open_database
from ledger.log.recorder import LedgerRecorder
from ledger.store.init import init_store
from ledger.store.runtime import Ledger
from tests.support.gitrepo import Repo


def pack_files(packs: range, release: int = 0, changed: int | None = None) -> dict[str, bytes]:
    """The pack documents; ``changed`` (if any) carries ``release`` in one payload."""
    files = {}
    for n in packs:
        doc = pack_document(n)
        if n == changed:
            doc["components"][0]["payload"]["release"] = release
        files[f"pack-{n:05d}/pack.json"] = json.dumps(doc).encode()
    return files


def write_manifest(path: Path, repo: Path, revisions: dict[int, str]) -> Path:
    """A release of the packs in ``revisions`` (pack -> commit), one audience per pack."""
    bindings = [b for n in revisions for b in audience_bindings(n, n)]
    manifest = {
        "packs": [official_pack(n, repo, commit) for n, commit in revisions.items()],
        "bindings": bindings,
    }
    path.write_text(json.dumps(manifest))
    return path


@contextlib.contextmanager
def fresh_store(engine: str, folder: Path, mysql_url: str) -> Iterator[Database]:
    """An initialized, empty store on ``engine``; removed after."""
    with contextlib.ExitStack() as stack:
        if engine == "sqlite":
            path = folder / f"store-{secrets.token_hex(4)}.db"
            url = f"sqlite:///{path}"
            stack.callback(_remove, folder, path.name)
        else:
            url, _ = stack.enter_context(mysql_scratch(mysql_url))
        db = open_database(url)
        stack.callback(db.close)
        init_store(db)
        yield db


def _remove(folder: Path, name: str) -> None:
    for leftover in folder.glob(name + "*"):
        leftover.unlink()


def timed_apply(db: Database, manifest: Path) -> tuple[float, int]:
    """(seconds, events appended) of one ``apply`` (published) through the CommandService."""
    ledger = Ledger(db)
    before = ledger.recorder.head().position
    started = time.perf_counter()
    result = CommandService(ledger).apply(manifest)
    elapsed = time.perf_counter() - started
    if result["noop"]:
        raise SystemExit("the benchmark release was a no-op")
    return elapsed, ledger.recorder.head().position - before


def timed_recorder(engine: str, folder: Path, mysql_url: str, count: int) -> float:
    """Seconds for the recorder alone to append ``count`` events in one call (fresh store)."""
    events = stored_events(count)
    with fresh_store(engine, folder, mysql_url) as db:
        recorder = LedgerRecorder(db)
        started = time.perf_counter()
        recorder.insert_events(events)
        return time.perf_counter() - started


def measure_engine(engine: str, args: argparse.Namespace, folder: Path) -> None:
    repo = Repo(folder / f"repo-{engine}")
    base = repo.commit(pack_files(range(max(args.packs, args.among))))
    appended: dict[str, int] = {}

    def recorder_peer(name: str) -> Callable[[], float]:
        return lambda: timed_recorder(engine, folder, args.mysql_url, appended[name])

    # -- a release of --packs packs into a fresh store ---------------------------------
    full_manifest = write_manifest(
        folder / f"full-{engine}.json", repo.path, dict.fromkeys(range(args.packs), base)
    )

    def full_run() -> float:
        with fresh_store(engine, folder, args.mysql_url) as db:
            seconds, events = timed_apply(db, full_manifest)
        appended["full"] = events
        return seconds

    full = alternate({"apply": full_run, "recorder": recorder_peer("full")}, args.repeat)

    # -- a release changing 1 pack among --among (after applying --among) --------------
    revisions = dict.fromkeys(range(args.among), base)
    with fresh_store(engine, folder, args.mysql_url) as db:
        started = time.perf_counter()
        timed_apply(db, write_manifest(folder / f"among-{engine}.json", repo.path, revisions))
        setup = time.perf_counter() - started
        release = [0]

        def one_run() -> float:
            release[0] += 1
            n = (release[0] * 7919) % args.among
            changed = repo.commit(pack_files(range(n, n + 1), release[0], changed=n))
            path = folder / f"one-{engine}-{release[0]}.json"
            seconds, events = timed_apply(
                db, write_manifest(path, repo.path, {**revisions, n: changed})
            )
            revisions[n] = changed
            appended["one"] = events
            return seconds

        one = alternate({"apply": one_run, "recorder": recorder_peer("one")}, args.repeat)

    print(f"  setup: {args.among} packs applied and published in {setup:.1f} s")
    rows = (
        (f"release of {args.packs} packs (fresh store)", full, appended["full"]),
        (f"release changing 1 pack among {args.among}", one, appended["one"]),
    )
    for figure, measured, events in rows:
        ours, peer = measured["apply"].median, measured["recorder"].median
        spread = ", ".join(f"{v:.3f}" for v in measured["apply"].samples)
        print(
            f"  {figure:<44} apply {ours:8.3f} s [{spread}]  recorder alone, {events} events: "
            f"{peer:8.4f} s  apply/recorder {ours / peer:7.1f}"
        )
        summary(
            bench="apply",
            figure=figure,
            engine=engine,
            workers=1,
            value=ours,
            unit="s",
            peer=f"recorder alone ({events} events)",
            peer_value=peer,
            target=None,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--packs", type=int, default=100)
    parser.add_argument("--among", type=int, default=1000)
    parser.add_argument("--engines", default="sqlite,mariadb")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mysql-url", default=DEFAULT_MYSQL)
    args = parser.parse_args()
    print(
        f"apply benchmark: packs of {COMPONENTS} components, one audience of {PER_AUDIENCE} "
        f"bindings per pack; one warm-up run of each, then {args.repeat} alternating rounds "
        "(apply, recorder alone), medians"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for engine in args.engines.split(","):
            print(f"\n{engine}")
            with fresh_store(engine, folder, args.mysql_url) as db:
                durability(db)
            measure_engine(engine, args, folder)


if __name__ == "__main__":
    main()
