"""View-read latency and throughput: Python reader and HTTP vs a raw indexed SELECT.

Catalog: the publisher benchmark's base size (250 packs x 20 components, 1,000
audiences, 10,000 bindings), applied and published. Measured in one run, on
random audiences:
  raw SELECT    - one indexed SELECT of the same rows (an audience's grants joined
                  with their facts, physical tables, live version known), DBAPI
  reader        - CatalogReader.view: one statement, fail-closed checks, fact and
                  audience digests recomputed (cached by exact stored input); the
                  process GC is tuned as `catalog-ledger serve` tunes it
Prints p50/p99 latency, reads/s, the cache hit rate and the reader/raw p99 ratios,
warm (the reader's cache of verified views) and cold (none). HTTP under load is
`bench.http`.

Proven reads (R29): `catalog-ledger serve --no-auth` (one worker) on loopback, with a
catalog-log checkpoint stored as `catalog-ledger cosign` stores it (signed by a fresh
log key, cosigned by three fresh witness keys). ``--http-workers`` client threads, each
with its own keep-alive connection, read random audiences' views (``--http-audiences``):
plain, then with ``?proof=1``, in alternating blocks after a warm-up that reads every
audience both ways once (the steady state: verified views and bundles cached). The
proven reads send ``since_size`` as a client that accepted an earlier head does
(``?proof=1&since_size=N``, N the checkpoint's size minus 1, or the size itself for a
log of one revision), so each answer carries the ``consistency`` member too. The catalog
here is published once: N is the size, and the member's proof is empty (its bytes and
its cache lookup are measured, not a longer proof; those are cached the same way). Prints
the p50/p99 of each and the proven/plain ratio of the medians of block p99s (issue 28:
at most 2).

Usage:
  python -m bench.read [--engines sqlite,mariadb] [--reads 5000] [--repeat 4]
                       [--http-reads 4000] [--http-workers 4] [--http-audiences 200]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import DEFAULT_MYSQL, durability, mysql_scratch, summary
from domain.identity import Audience
from ledger.commands.service import CommandService
from ledger.http.app import tune_gc_for_serving
from ledger.log.db import Database, open_database
from ledger.store.runtime import Ledger
from projections.reader import CatalogReader
from projections.state import load_states

CLI = str(Path(sys.executable).with_name("catalog-ledger"))


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(label: str, samples: list[float], elapsed: float) -> float:
    p50, p99 = percentile(samples, 0.50) * 1000, percentile(samples, 0.99) * 1000
    print(
        f"  {label:<34} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms   "
        f"{len(samples) / elapsed:9,.0f} reads/s"
    )
    return p99


@contextmanager
def raw_select(db: Database) -> Iterator[Callable[[str, str], Any]]:
    """The same rows the reader returns, in one indexed statement (no checks).

    Autocommit, as the reader's statements run: a DBAPI connection left inside a
    transaction would hold metadata locks, and the scratch database's DROP would wait
    for them forever. The connection is closed on leaving the block."""
    with db.read() as conn:
        states = load_states(conn)
    grant_v, comp_v = states["catalog"].live_version, states["pack_component"].live_version
    p = "?" if db.is_sqlite else "%s"
    key = '"key"' if db.is_sqlite else "`key`"
    sql = (
        f"SELECT g.pack, g.kind, g.{key}, g.credential_set, g.install_id, c.fact, "
        f"c.fact_digest FROM view_catalog_grant g JOIN view_pack_component c "
        f"ON c.view_version = {comp_v} AND c.pack = g.pack AND c.install_id = g.install_id "
        f"AND c.kind = g.kind AND c.{key} = g.{key} "
        f"WHERE g.view_version = {grant_v} AND g.audience_kind = {p} AND g.audience_id = {p} "
        f"AND g.to_revision = {2**62}"
    )
    raw = db.engine.raw_connection()
    if not db.is_sqlite:  # sqlite3 opens no transaction for a SELECT
        raw.dbapi_connection.autocommit(True)  # type: ignore[union-attr]

    def run(kind: str, ident: str) -> Any:
        cursor = raw.cursor()
        cursor.execute(sql, (kind.encode(), ident.encode()))
        rows = cursor.fetchall()
        cursor.close()
        return rows

    try:
        yield run
    finally:
        raw.close()


def timed(fn: Callable[[], Any], count: int) -> tuple[list[float], float]:
    samples = []
    started = time.perf_counter()
    for _ in range(count):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return samples, time.perf_counter() - started


def measure(label: str, url: str, folder: Path, args: argparse.Namespace) -> None:
    from bench.publish import setup_store

    sizes = setup_store(folder, url, 1)
    db = open_database(url)
    CommandService(Ledger(db)).publish()
    audiences = [f"workload-{a:06d}" for a in range(sizes["audiences"])]
    rng = random.Random(7)
    print(
        f"\n{label}: {sizes['audiences']} audiences, {sizes['bindings']} bindings, "
        f"{sizes['packs']} packs"
    )
    durability(db)
    reader = CatalogReader(db)
    tune_gc_for_serving()  # as `catalog-ledger serve` does, for both peers alike
    cold = CatalogReader(db, cache_size=0)  # no serving cache: every read runs the statement
    with raw_select(db) as raw:
        for a in audiences:  # warm-up: every audience once, for each (the steady state)
            raw("integration", a)
            reader.view(Audience.of("integration", a))
            cold.view(Audience.of("integration", a))
        reader.hits = reader.misses = 0
        # Alternating blocks (raw, warm, cold, raw, warm, cold, ...): medians of block p99s.
        peers: dict[str, Callable[[], Any]] = {
            "raw": lambda: raw("integration", rng.choice(audiences)),
            "warm": lambda: reader.view(Audience.of("integration", rng.choice(audiences))),
            "cold": lambda: cold.view(Audience.of("integration", rng.choice(audiences))),
        }
        samples: dict[str, list[float]] = {name: [] for name in peers}
        p99s: dict[str, list[float]] = {name: [] for name in peers}
        for _ in range(args.repeat):
            for name, fn in peers.items():
                got, _ = timed(fn, args.reads // args.repeat)
                samples[name].extend(got)
                p99s[name].append(percentile(got, 0.99))
    raw_p99, reader_p99, cold_p99 = (statistics.median(p99s[n]) * 1000 for n in peers)
    report("raw indexed SELECT (DBAPI)", samples["raw"], sum(samples["raw"]))
    report("Python reader, warm cache", samples["warm"], sum(samples["warm"]))
    report("Python reader, cold (no cache)", samples["cold"], sum(samples["cold"]))
    print(f"  cache hit rate (warm reader)       {reader.cache_hit_rate():7.1%}")
    print(
        f"  ratio reader p99 / raw p99         {reader_p99 / raw_p99:7.2f}  (median of block p99s)"
    )
    print(f"  ratio cold p99 / raw p99           {cold_p99 / raw_p99:7.2f}")
    engine = "sqlite" if db.is_sqlite else "mariadb"
    for figure, p99 in (("reader p99, warm cache", reader_p99), ("reader p99, cold", cold_p99)):
        summary(
            bench="read",
            figure=figure,
            engine=engine,
            workers=1,
            value=p99,
            unit="ms",
            peer="raw indexed SELECT p99",
            peer_value=raw_p99,
            target="<=1.5" if "warm" in figure else None,
        )
    db.close()
    proven_reads(url, audiences[: args.http_audiences], engine, args)


def store_cosigned_checkpoint(url: str) -> int:
    """What one `catalog-ledger cosign` run stores, with three in-process witnesses
    (C2SP tlog-cosignature ``cosignature/v1``) and a fresh log key; the catalog log's
    size it cosigned."""
    from domain.notes import Checkpoint, SignerKey, WitnessSigner
    from ledger.api import Store, catalog_origin
    from ledger.audit.cosign import CosignPolicy, Witness, cosign

    keys = {f"http://w{n}.invalid": WitnessSigner.generate(f"w{n}") for n in range(3)}
    witnesses = tuple(Witness(key.verifier, url) for url, key in keys.items())

    def add_checkpoint(url: str, note: str, old: int, proof: Any) -> list[str]:
        return [keys[url].cosign(Checkpoint.parse(note).text(), int(time.time()))]

    signer = SignerKey.generate("bench-log")
    with Store(url) as store:
        origin = catalog_origin(store.ledger)
        policy = CosignPolicy(origin, (signer.verifier,), witnesses, 2, 3600)
        result = cosign(store.ledger, origin=origin, signer=signer, policy=policy,
                        add_checkpoint=add_checkpoint)  # fmt: skip
    return result["size"]


def proven_reads(url: str, audiences: list[str], engine: str, args: argparse.Namespace) -> None:
    """Plain against ``?proof=1`` view reads over HTTP (module docstring)."""
    import threading
    from urllib.parse import quote

    import httpx

    from bench.common import free_port, wait_http

    size = store_cosigned_checkpoint(url)
    # What a client that accepted an earlier head asks (module docstring).
    proven = {"proof": "1", "since_size": str(size - 1 if size > 1 else size)}
    port = free_port()
    command = [CLI, "--db", url, "serve", "--no-auth", "--port", str(port),
               "--log-level", "warning"]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    paths = [f"/v1/audiences/integration/{quote(a, safe='')}/view" for a in audiences]
    try:
        wait_http(base)
        clients = [httpx.Client(base_url=base, timeout=30) for _ in range(args.http_workers)]
        for path in paths:  # warm-up: every audience both ways (the steady state)
            for params in ({}, proven):
                answer = clients[0].get(path, params=params)
                if answer.status_code != 200:
                    raise SystemExit(f"{path} {params}: {answer.status_code} {answer.text}")

        def block(params: dict[str, str]) -> list[float]:
            per = args.http_reads // args.repeat // args.http_workers
            out: list[float] = []
            lock = threading.Lock()

            def worker(http: httpx.Client, seed: int) -> None:
                rng = random.Random(seed)
                mine = []
                for _ in range(per):
                    path = rng.choice(paths)
                    t = time.perf_counter()
                    answer = http.get(path, params=params)
                    mine.append(time.perf_counter() - t)
                    if answer.status_code != 200:
                        raise SystemExit(f"{path}: {answer.status_code}")
                with lock:
                    out.extend(mine)

            threads = [threading.Thread(target=worker, args=(c, n)) for n, c in enumerate(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return out

        peers = {"plain": {}, "proven": proven}
        samples: dict[str, list[float]] = {name: [] for name in peers}
        p99s: dict[str, list[float]] = {name: [] for name in peers}
        for _ in range(args.repeat):  # alternating blocks: plain, proven, plain, ...
            for name, params in peers.items():
                got = block(params)
                samples[name].extend(got)
                p99s[name].append(percentile(got, 0.99))
        for http in clients:
            http.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    plain_p99, proven_p99 = (statistics.median(p99s[n]) * 1000 for n in peers)
    print(f"  HTTP, {args.http_workers} client threads, one serve worker, "
          f"{len(paths)} audiences, proven with since_size={proven['since_size']} "
          f"(checkpoint size {size}):")  # fmt: skip
    report("HTTP plain view", samples["plain"], sum(samples["plain"]))
    report("HTTP proven view (+since_size)", samples["proven"], sum(samples["proven"]))
    print(
        f"  ratio proven p99 / plain p99       {proven_p99 / plain_p99:7.2f}  "
        "(median of block p99s)"
    )
    summary(
        bench="read",
        figure="proven read p99 (?proof=1&since_size)",
        engine=engine,
        workers=args.http_workers,
        value=proven_p99,
        unit="ms",
        peer="plain read p99",
        peer_value=plain_p99,
        target="<=2",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="sqlite,mariadb")
    parser.add_argument("--reads", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=4, help="Alternating blocks per reader.")
    parser.add_argument("--http-reads", type=int, default=4000, help="Proven and plain, each.")
    parser.add_argument("--http-workers", type=int, default=4, help="HTTP client threads.")
    parser.add_argument("--http-audiences", type=int, default=200)
    parser.add_argument(
        "--mysql-url",
        default=DEFAULT_MYSQL,
    )
    args = parser.parse_args()
    print(
        "read benchmark: latency per view read, percentiles over "
        f"{args.reads} reads (reader warm and cold, raw)"
    )
    engines = args.engines.split(",")
    if "sqlite" in engines:
        with tempfile.TemporaryDirectory() as tmp:
            measure("SQLite (WAL)", f"sqlite:///{Path(tmp) / 'read.db'}", Path(tmp), args)
    if "mariadb" in engines:
        with mysql_scratch(args.mysql_url) as (url, _), tempfile.TemporaryDirectory() as tmp:
            measure("MariaDB", url, Path(tmp), args)


if __name__ == "__main__":
    main()
