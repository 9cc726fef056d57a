"""`apply` at catalog scale (issue 27, R30): a release through the real CommandService
and store, SQLite and MariaDB, at each catalog size N of --among.

Per engine and per N, each release timed from reading the manifest to the published
revision (resolve, preflight, lease, prepare, final append, inline views):
  first   - the first release: N packs into a fresh store (one git commit of the packs;
            one audience per pack with 10 bindings), each run in a fresh child process
            whose peak RSS (ru_maxrss, as the wrapper of ``bench.publish.child`` reads
            it) is the release's own, shown beside its RSS before the apply. Its peer:
            the recorder alone (``LedgerRecorder.insert_events``) appending as many
            events as the release appended, in one call, into a fresh store.
  one     - the 1-pack release among N: one pack's payload changed in git, the full
            manifest of N packs written and applied, after the N packs were applied
            and published (the store of the last first-release run; each round changes
            another pack). Beside it the head-lock hold of its appends (R30): from
            locking the head row to the commit, the longest and the sum over the
            appends of one apply (``LedgerRecorder.head_lock_holds``).
  noop    - the no-op re-apply among N: the 1-pack release's manifest applied again
            (expected a no-op: result["noop"]; anything else stops the bench).
  parse   - the manifest-parse peer: ``load_manifest`` of that same manifest alone
            (parse and validate, no git, no store).
  peer    - the recorder alone appending as many events as the 1-pack release did.
After one warm-up run of each, the peers alternate for --repeat rounds (first,
recorder; then one, noop, parse, recorder); medians. --packs is gone: the first release
of each N replaces it.

Then the growth exponents log(t2/t1)/log(N2/N1) between consecutive N and from the
smallest to the largest N (1-pack release, no-op, lock hold, first release), and the
bounds of issue 27, each PASS or MISS with its margin (bound - value):
  1-pack release(Nmax) <= 1.5 one(Nmin) + 1.5 (parse(Nmax) - parse(Nmin)); the same
  for the no-op; lock hold(Nmax) <= 2 lock hold(Nmin) (the longest append of one
  apply); first(Nmax)/first(Nmin) <= (Nmax log Nmax)/(Nmin log Nmin), 112 literally
  for 250 -> 16000.
Every figure and bound is a SUMMARY line (a bound's target is ``value<=bound``).

Usage:
  python -m bench.apply [--among 250,1000,4000,16000] [--engines sqlite,mariadb]
                        [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import secrets
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.append import stored_events
from bench.common import (
    DEFAULT_MYSQL,
    Measured,
    alternate,
    durability,
    mysql_scratch,
    summary,
)
from bench.publish import (
    COMPONENTS,
    PER_AUDIENCE,
    audience_bindings,
    child,
    official_pack,
    pack_document,
)
from ledger.commands.service import CommandService
from ledger.log.db import Database, open_database
from ledger.log.recorder import LedgerRecorder
from ledger.sources.resolve import load_manifest
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
def fresh_url(engine: str, folder: Path, mysql_url: str) -> Iterator[str]:
    """The URL of an initialized, empty store on ``engine``; removed after."""
    with contextlib.ExitStack() as stack:
        if engine == "sqlite":
            path = folder / f"store-{secrets.token_hex(4)}.db"
            url = f"sqlite:///{path}"
            stack.callback(_remove, folder, path.name)
        else:
            url, _ = stack.enter_context(mysql_scratch(mysql_url))
        db = open_database(url)
        try:
            init_store(db)
        finally:
            db.close()
        yield url


@contextlib.contextmanager
def fresh_store(engine: str, folder: Path, mysql_url: str) -> Iterator[Database]:
    """An initialized, empty store on ``engine``, open; removed after."""
    with fresh_url(engine, folder, mysql_url) as url:
        db = open_database(url)
        try:
            yield db
        finally:
            db.close()


def _remove(folder: Path, name: str) -> None:
    for leftover in folder.glob(name + "*"):
        leftover.unlink()


@dataclass
class Applied:
    """One apply: its seconds, the events it appended, whether it was a no-op, and the
    head-lock hold of its appends (longest, sum, how many appends)."""

    seconds: float
    events: int
    noop: bool
    hold_max: float
    hold_sum: float
    appends: int


def timed_apply(db: Database, manifest: Path) -> Applied:
    """One ``apply`` (published) through the CommandService, in this process."""
    ledger = Ledger(db)
    before = ledger.recorder.head().position
    holds = ledger.recorder.head_lock_holds
    holds.reset()
    started = time.perf_counter()
    result = CommandService(ledger).apply(manifest)
    elapsed = time.perf_counter() - started
    events = ledger.recorder.head().position - before
    return Applied(elapsed, events, result["noop"], holds.longest, holds.total, holds.count)


# The first release runs in a fresh interpreter (started by bench.publish's wrapper, so
# its peak RSS is its own): it opens the store, applies, prints what ``Applied`` holds
# and its RSS before the apply.
_FIRST_RELEASE = """
import json, resource, sys, time
from pathlib import Path
from ledger.commands.service import CommandService
from ledger.log.db import open_database
from ledger.store.runtime import Ledger
db = open_database(sys.argv[1])
ledger = Ledger(db)
before = ledger.recorder.head().position
ready_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
result = CommandService(ledger).apply(Path(sys.argv[2]))
seconds = time.perf_counter() - started
holds = ledger.recorder.head_lock_holds
events = ledger.recorder.head().position - before
db.close()
print(json.dumps({"seconds": seconds, "events": events, "noop": result["noop"],
                  "hold_max": holds.longest, "hold_sum": holds.total,
                  "appends": holds.count, "ready_kib": ready_kib}))
"""


def timed_recorder(engine: str, folder: Path, mysql_url: str, count: int) -> float:
    """Seconds for the recorder alone to append ``count`` events in one call (fresh store)."""
    events = stored_events(count)
    with fresh_store(engine, folder, mysql_url) as db:
        recorder = LedgerRecorder(db)
        started = time.perf_counter()
        recorder.insert_events(events)
        return time.perf_counter() - started


@dataclass
class AtN:
    """The medians at one catalog size ``n`` (seconds; RSS in MiB)."""

    n: int
    first: float
    first_events: int
    first_peer: float
    first_hold: float
    peak_mib: float
    ready_mib: float
    one: float
    one_events: int
    one_peer: float
    hold_max: float
    hold_sum: float
    appends: int
    noop: float
    noop_events: int
    parse: float


def median_of(samples: list[Any], key: str) -> float:
    """The median of one field over the measured runs (the first, the warm-up, left out)."""
    values = [s[key] if isinstance(s, dict) else getattr(s, key) for s in samples[1:]]
    return float(statistics.median(values))


class Releases:
    """The 1-pack releases of one bench run: each changes another pack's payload in git
    (a counter shared by every engine and size, so no payload repeats)."""

    def __init__(self, repo: Repo) -> None:
        self.repo = repo
        self.count = 0

    def change(self, n: int) -> tuple[int, str]:
        """(pack, commit) of a new payload for one pack among ``n``."""
        self.count += 1
        pack = (self.count * 7919) % n
        return pack, self.repo.commit(pack_files(range(pack, pack + 1), self.count, changed=pack))


def measure_n(
    engine: str, n: int, args: argparse.Namespace, folder: Path, releases: Releases, base: str
) -> AtN:
    """Every figure at catalog size ``n`` on ``engine``."""
    repo = releases.repo.path
    revisions = dict.fromkeys(range(n), base)
    full = write_manifest(folder / f"first-{engine}-{n}.json", repo, revisions)
    firsts: list[dict[str, Any]] = []
    appended = [0]  # the events of the last first release: the recorder's count
    kept: list[tuple[contextlib.ExitStack, str]] = []  # the last first-release run's store

    def first_run() -> float:
        stack = contextlib.ExitStack()
        try:
            url = stack.enter_context(fresh_url(engine, folder, args.mysql_url))
            doc = child(_FIRST_RELEASE, url, str(full))
        except BaseException:
            stack.close()
            raise
        for old, _ in kept:
            old.close()
        kept[:] = [(stack, url)]
        if doc["noop"]:
            raise SystemExit(f"the first release of {n} packs was a no-op")
        firsts.append(doc)
        appended[0] = int(doc["events"])
        return float(doc["seconds"])

    def recorder_run() -> float:
        return timed_recorder(engine, folder, args.mysql_url, appended[0])

    try:
        first = alternate({"apply": first_run, "recorder": recorder_run}, args.repeat)
        db = open_database(kept[-1][1])
        try:
            ones, noops, among = _among(db, engine, n, args, folder, releases, revisions)
        finally:
            db.close()
    finally:
        for old, _ in kept:
            old.close()
    last = ones[-1]
    return AtN(
        n=n,
        first=first["apply"].median,
        first_events=appended[0],
        first_peer=first["recorder"].median,
        first_hold=median_of(firsts, "hold_max"),
        peak_mib=median_of(firsts, "peak_mib"),
        ready_mib=median_of(firsts, "ready_kib") / 1024,
        one=among["one"].median,
        one_events=last.events,
        one_peer=among["recorder"].median,
        hold_max=median_of(ones, "hold_max"),
        hold_sum=median_of(ones, "hold_sum"),
        appends=last.appends,
        noop=among["noop"].median,
        noop_events=noops[-1].events,
        parse=among["parse"].median,
    )


def _among(
    db: Database,
    engine: str,
    n: int,
    args: argparse.Namespace,
    folder: Path,
    releases: Releases,
    revisions: dict[int, str],
) -> tuple[list[Applied], list[Applied], dict[str, Measured]]:
    """The 1-pack release, the no-op re-apply, the manifest parse and the recorder
    alone, alternating, on ``db`` where the ``n`` packs of ``revisions`` are applied."""
    ones: list[Applied] = []
    noops: list[Applied] = []
    manifest: list[Path] = []

    def one_run() -> float:
        pack, commit = releases.change(n)
        revisions[pack] = commit
        path = folder / f"one-{engine}-{n}-{releases.count}.json"
        write_manifest(path, releases.repo.path, revisions)
        for old in manifest:
            old.unlink()
        manifest[:] = [path]
        applied = timed_apply(db, path)
        if applied.noop:
            raise SystemExit(f"the release changing pack {pack} among {n} was a no-op")
        ones.append(applied)
        return applied.seconds

    def noop_run() -> float:
        applied = timed_apply(db, manifest[0])
        if not applied.noop:
            raise SystemExit(f"re-applying the release among {n} was not a no-op")
        noops.append(applied)
        return applied.seconds

    def parse_run() -> float:
        started = time.perf_counter()
        load_manifest(manifest[0])
        return time.perf_counter() - started

    def recorder_run() -> float:
        return timed_recorder(engine, folder, args.mysql_url, ones[-1].events)

    peers = {"one": one_run, "noop": noop_run, "parse": parse_run, "recorder": recorder_run}
    return ones, noops, alternate(peers, args.repeat)


# -- the report ------------------------------------------------------------------------


def report_n(engine: str, at: AtN) -> None:
    """The figures at one N: printed, and one SUMMARY line each."""
    n = at.n
    print(
        f"  N={n:<6} first release {at.first:8.3f} s ({at.first_events} events; recorder "
        f"alone {at.first_peer:.4f} s; longest lock hold {at.first_hold * 1e3:.2f} ms; "
        f"peak RSS {at.peak_mib:.0f} MiB, {at.ready_mib:.0f} MiB before the apply)"
    )
    print(
        f"  {'':<8} 1-pack release {at.one:8.3f} s ({at.one_events} events in {at.appends} "
        f"appends; recorder alone {at.one_peer:.4f} s) head-lock hold longest "
        f"{at.hold_max * 1e3:.2f} ms, sum {at.hold_sum * 1e3:.2f} ms"
    )
    print(
        f"  {'':<8} no-op re-apply {at.noop:8.3f} s ({at.noop_events} events); manifest "
        f"parse alone {at.parse:.4f} s"
    )
    rows: list[tuple[str, float, str, str | None, float | None]] = [
        (
            f"first release of {n} packs (fresh store)",
            at.first,
            "s",
            f"recorder alone ({at.first_events} events)",
            at.first_peer,
        ),
        (
            f"first release of {n} packs: peak RSS",
            at.peak_mib,
            "MiB",
            "RSS before the apply",
            at.ready_mib,
        ),
        (
            f"release changing 1 pack among {n}",
            at.one,
            "s",
            f"recorder alone ({at.one_events} events)",
            at.one_peer,
        ),
        (
            f"head-lock hold, longest append of the 1-pack release among {n}",
            at.hold_max,
            "s",
            None,
            None,
        ),
        (
            f"head-lock hold, sum over the 1-pack release's appends among {n}",
            at.hold_sum,
            "s",
            None,
            None,
        ),
        (f"no-op re-apply among {n}", at.noop, "s", f"manifest parse alone ({n} packs)", at.parse),
    ]
    for figure, value, unit, peer, peer_value in rows:
        summary(
            bench="apply",
            figure=figure,
            engine=engine,
            workers=1,
            value=value,
            unit=unit,
            peer=peer,
            peer_value=peer_value,
            target=None,
        )


def growth(t1: float, t2: float, n1: int, n2: int) -> float:
    """The exponent k of t ~ N^k between two sizes."""
    return math.log(t2 / t1) / math.log(n2 / n1)


def n_log_n_bound(n1: int, n2: int) -> float:
    """The first release's bound t(n2)/t(n1): (n2 log n2)/(n1 log n1); 112 for 250 -> 16000
    as issue 27 writes it."""
    if (n1, n2) == (250, 16000):
        return 112.0
    return (n2 * math.log(n2)) / (n1 * math.log(n1))


GROWTH = (
    ("1-pack release", "one"),
    ("no-op re-apply", "noop"),
    ("head-lock hold (longest)", "hold_max"),
    ("first release", "first"),
)


def report_scaling(engine: str, results: list[AtN]) -> None:
    """The growth exponents and the bounds of issue 27 between the smallest and the
    largest N."""
    if len(results) < 2:
        return
    pairs = list(itertools.pairwise(results))
    if len(results) > 2:
        pairs.append((results[0], results[-1]))
    print(f"  growth exponents log(t2/t1)/log(N2/N1) ({engine}):")
    print("  " + " " * 26 + "".join(f"{f'{a.n}->{b.n}':>14}" for a, b in pairs))
    for label, key in GROWTH:
        cells = []
        for a, b in pairs:
            t1, t2 = getattr(a, key), getattr(b, key)
            cells.append(f"{growth(t1, t2, a.n, b.n):14.2f}" if t1 > 0 and t2 > 0 else f"{'-':>14}")
        print(f"  {label:<26}" + "".join(cells))
    low, high = results[0], results[-1]
    span = f"{low.n} -> {high.n}"
    print(f"  bounds of issue 27 ({engine}, {span} packs):")
    bounds = [
        (
            f"1-pack release among {high.n}",
            high.one,
            1.5 * low.one + 1.5 * (high.parse - low.parse),
            f"1.5 x {low.one:.4f} + 1.5 x ({high.parse:.4f} - {low.parse:.4f})",
            "s",
        ),
        (
            f"no-op re-apply among {high.n}",
            high.noop,
            1.5 * low.noop + 1.5 * (high.parse - low.parse),
            f"1.5 x {low.noop:.4f} + 1.5 x ({high.parse:.4f} - {low.parse:.4f})",
            "s",
        ),
        (
            f"head-lock hold (longest) among {high.n}",
            high.hold_max,
            2 * low.hold_max,
            f"2 x {low.hold_max:.6f}",
            "s",
        ),
        (
            f"first release t({high.n})/t({low.n})",
            high.first / low.first,
            n_log_n_bound(low.n, high.n),
            f"({high.n} log {high.n})/({low.n} log {low.n})",
            "x",
        ),
    ]
    for figure, value, bound, formula, unit in bounds:
        verdict = "PASS" if value <= bound else "MISS"
        print(
            f"    {verdict} {figure:<40} {value:10.4f} {unit} <= {bound:10.4f} {unit} "
            f"= {formula}  margin {bound - value:+.4f} {unit}"
        )
        summary(
            bench="apply",
            figure=f"bound: {figure} ({span})",
            engine=engine,
            workers=1,
            value=value,
            unit=unit,
            peer="bound",
            peer_value=bound,
            target=f"value<={bound:.9f}",
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--among", default="250,1000,4000,16000")
    parser.add_argument("--engines", default="sqlite,mariadb")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mysql-url", default=DEFAULT_MYSQL)
    args = parser.parse_args()
    sizes = sorted({int(n) for n in args.among.split(",")})
    if not sizes or sizes[0] < 1:
        parser.error("--among takes catalog sizes >= 1, e.g. 250,1000")
    print(
        f"apply benchmark at N = {', '.join(map(str, sizes))} packs: packs of {COMPONENTS} "
        f"components, one audience of {PER_AUDIENCE} bindings per pack; one warm-up run of "
        f"each, then {args.repeat} alternating rounds (first release, recorder alone; "
        "1-pack release, no-op, manifest parse, recorder alone), medians",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        repo = Repo(folder / "repo")
        base = repo.commit(pack_files(range(sizes[-1])))
        releases = Releases(repo)
        for engine in args.engines.split(","):
            print(f"\n{engine}")
            with fresh_store(engine, folder, args.mysql_url) as db:
                durability(db)
            results = []
            for n in sizes:
                results.append(measure_n(engine, n, args, folder, releases, base))
                report_n(engine, results[-1])
            report_scaling(engine, results)


if __name__ == "__main__":
    main()
