"""R30 on the test's own 3-node Galera cluster: one-pack releases racing on every node
conflict no more in a catalog of 4,000 packs than in one of 250 (make campaign).

For each catalog size N (``CATALOG_LEDGER_R30_SIZES``, default ``250,4000``) a fresh
database gets the bench's catalog (``bench.apply``: N packs of 20 components, one
audience of 10 bindings per pack) applied once through the first node. Then 3
writers, one process per node, each apply ``CATALOG_LEDGER_R30_RELEASES`` (default 8)
releases of one pack each, the packs of different writers disjoint.

A release manifest names its one pack and no ``bindings``: ``apply`` leaves every
pack a manifest omits alone, but ``bindings``, when present, is the complete set
(``publisher.planning.plan_bindings``): a manifest naming one pack's bindings would
revoke every other audience's. Without the key the current bindings stay, and the
changed pack's own are re-bound to its new generation in the same release (R14), so
writers never revert each other: every release must advance its pack, re-bind its
10 bindings and revoke or grant none, and publish one revision.

Conflicts are Galera's own count of lost races: the deltas of
``wsrep_local_cert_failures`` plus ``wsrep_local_bf_aborts`` over the writers' run,
summed over the three nodes, per release. "Do not grow" means

    conflicts per release at the largest N <= conflicts per release at the smallest N + SLACK

with SLACK = 0.5 conflicts per release. Both figures are small counts over a few
dozen releases whose races depend on how 2 shared cores schedule 3 servers and
3 writers: one conflict more or less moves a figure by 1/releases (0.04 with 24), and
a lost race is retried inside ``apply`` at the cost of one more round. A release whose
conflicts followed the catalog (a write set, a lock or a certification window that
grew with N) would cost more at 16 times the packs than half a conflict per release;
scheduling noise does not.

Afterwards every node audits identical: ``audit verify`` on each gives the same size,
chain and Merkle root; each node's log is gapless with one winner per activation
epoch; every node serves the same catalog revision (1 + releases) and content digest.
Releases, apply's own retries (rounds re-decided after a lost race or a busy lease)
and conflicts are printed with a table (run with ``-s``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.apply import pack_files, write_manifest
from bench.publish import PER_AUDIENCE, official_pack
from ledger.api import open_store
from projections.reader import CatalogReader
from tests.support.cli_inprocess import cli_json
from tests.support.cluster_checks import node_report, one_winner_per_epoch, settle
from tests.support.cluster_support import GaleraCluster, query, status_value
from tests.support.gitrepo import Repo

ROOT = Path(__file__).resolve().parents[2]
SIZES = [int(n) for n in os.environ.get("CATALOG_LEDGER_R30_SIZES", "250,4000").split(",")]
RELEASES = int(os.environ.get("CATALOG_LEDGER_R30_RELEASES", "8"))
SLACK = 0.5
WRITERS = 3
#: Spreads each writer's packs over the catalog (a prime: a bijection modulo any N it
#: does not divide, so the writers' packs are distinct).
_STRIDE = 7919
_WSREP = ("wsrep_local_cert_failures", "wsrep_local_bf_aborts")


@dataclass
class Run:
    """One catalog size: its releases as the writers saw them, and Galera's counters."""

    packs: int
    setup_seconds: float
    wall_seconds: float
    outcomes: list[dict[str, Any]]
    conflicts: int
    cert_failures: int
    bf_aborts: int

    @property
    def releases(self) -> int:
        return sum(1 for o in self.outcomes if o["code"] == 0)

    @property
    def per_release(self) -> float:
        return self.conflicts / max(self.releases, 1)

    def retries(self) -> dict[str, int]:
        """apply's own rounds after the first: after a lost race for the log (``lost``), or
        waiting for the writer lease (``lease``: held, or its taking lost); ``outer``: a
        CONFLICT that escaped apply's budget and was retried with the same command id."""
        rounds = sum(o["attempts"] - 1 for o in self.outcomes)
        lost = sum(o["lost"] for o in self.outcomes)
        return {
            "rounds": rounds,
            "lost": lost,
            "lease": rounds - lost,
            "outer": sum(o["outer"] for o in self.outcomes),
        }


def _counters(cluster: GaleraCluster) -> dict[str, int]:
    """Galera's lost-race counters, each summed over the nodes."""
    return {k: sum(int(status_value(n.port, k) or 0) for n in cluster.nodes) for k in _WSREP}


def _writer_packs(size: int) -> list[list[int]]:
    """Writer i's packs: disjoint from every other writer's, spread over the catalog."""
    assert math.gcd(_STRIDE, size) == 1 and size >= WRITERS * RELEASES
    return [[((WRITERS * k + i) * _STRIDE) % size for k in range(RELEASES)] for i in range(WRITERS)]


def _one_pack_manifest(path: Path, repo: Path, pack: int, commit: str) -> str:
    """A release of ``pack`` alone, without ``bindings``: every other pack and every
    binding stays; the pack's own bindings are re-bound to its new generation (R14)."""
    path.write_text(json.dumps({"packs": [official_pack(pack, repo, commit)]}))
    return str(path)


def run_size(cluster: GaleraCluster, work: Path, size: int) -> tuple[Run, list[str]]:
    """Apply a catalog of ``size`` packs once, then race one-pack releases on every node."""
    work.mkdir(parents=True)
    name = f"r30_{size}"
    first = cluster.nodes[0]
    cluster.create_database(first.port, name)
    urls = [node.url(name) for node in cluster.nodes]
    code, init = cli_json("--db", urls[0], "init")
    assert code == 0, init

    repo = Repo(work / "repo")
    base = repo.commit(pack_files(range(size)))
    catalog = write_manifest(work / "catalog.json", repo.path, dict.fromkeys(range(size), base))
    started = time.monotonic()
    with open_store(urls[0]) as store:
        applied = store.apply(catalog, wait=600.0)
    setup_seconds = time.monotonic() - started
    assert applied["catalog"]["revision"] == 1, applied["catalog"]
    settle(urls, timeout=300)

    procs = []
    for i, packs in enumerate(_writer_packs(size)):
        manifests = []
        for k, pack in enumerate(packs):
            commit = repo.commit(pack_files(range(pack, pack + 1), 1 + k, changed=pack))
            manifests.append(
                _one_pack_manifest(work / f"w{i}-r{k + 1}.json", repo.path, pack, commit)
            )
        config = {
            "url": urls[i],
            "manifests": manifests,
            "prefix": f"{name}-w{i + 1}",
            "wait": 600.0,
            "lease_ttl": 30.0,
            "out": str(work / f"writer-{i}.jsonl"),
        }
        path = work / f"writer-{i}.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        procs.append(path)

    before = _counters(cluster)
    started = time.monotonic()
    running = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.release_worker", str(path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in procs
    ]
    try:
        problems = []
        for proc in running:
            _, err = proc.communicate(timeout=3600)
            if proc.returncode != 0 or "Traceback" in err:
                problems.append(f"writer exited {proc.returncode}: {err[-2000:]}")
        assert problems == []
    finally:
        for proc in running:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    wall = time.monotonic() - started
    after = _counters(cluster)
    outcomes = [
        json.loads(line)
        for i in range(WRITERS)
        for line in (work / f"writer-{i}.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    cert, bf = (after[k] - before[k] for k in _WSREP)
    run = Run(size, setup_seconds, wall, outcomes, cert + bf, cert, bf)
    return run, urls


def check_releases(run: Run) -> None:
    """Every release advanced its one pack, re-bound its bindings, reverted nothing."""
    assert len(run.outcomes) == WRITERS * RELEASES
    failed = [o for o in run.outcomes if o["code"] != 0]
    assert failed == []
    revisions = []
    for o in run.outcomes:
        result = o["result"]
        assert not result["noop"] and not result["replayed"], o
        assert [p["decision"] for p in result["packs"]] == ["advance"], o
        bindings = result["bindings"]
        assert (len(bindings["granted"]), len(bindings["revoked"])) == (0, 0), o
        assert len(bindings["rebound"]) == PER_AUDIENCE, o
        assert {b["pack"] for b in bindings["rebound"]} == {result["packs"][0]["pack"]}, o
        assert result["catalog"]["published"], o
        revisions.append(result["catalog"]["revision"])
    # One revision per release, each published once, on top of the catalog's first.
    assert sorted(revisions) == list(range(2, 2 + len(run.outcomes)))


def lost_races(run: Run, failed: list[str]) -> str:
    """Which phases failed in apply's rounds, and why the log says candidates were
    refused (``generation.failed`` reasons, the store's own record of a lost race)."""
    phases = Counter(f for o in run.outcomes for f in o.get("failures", []))
    reasons = Counter(reason[:120] for reason in failed)
    return f"failed phases {dict(phases)}; failed generations {dict(reasons)}"


def check_nodes(urls: list[str], run: Run) -> tuple[int, str, list[str]]:
    """Every node audits identical and serves the same revision and content digest; the
    reasons of its failed generations (the same on every node)."""
    head = settle(urls, timeout=300)
    reports = [node_report(url) for url in urls]
    assert len({r.agreed() for r in reports}) == 1, [r.agreed() for r in reports]
    changed = {o["result"]["packs"][0]["pack"] for o in run.outcomes}
    for report in reports:
        assert report.gapless and one_winner_per_epoch(report.epochs), report.url
        assert len(report.epochs) == run.packs
        assert {p for p, e in report.epochs.items() if e == [1, 2]} == changed
        assert report.failed == reports[0].failed
    audits = []
    for url in urls:  # the CLI's own audit, node by node
        code, audit = cli_json("--db", url, "audit", "verify")
        assert (code, audit["ok"], audit["size"]) == (0, True, head), audit
        audits.append((audit["size"], audit["chain"], audit["root"]))
    assert len(set(audits)) == 1, audits
    heads = set()
    for url in urls:
        with open_store(url) as store:
            served = CatalogReader(store.ledger.db).head()
        heads.add((served.revision, served.content_digest))
    assert len(heads) == 1, heads
    revision, digest = heads.pop()
    assert revision == 1 + run.releases
    return revision, digest, reports[0].failed


def phase_seconds(run: Run) -> str:
    """Mean seconds per release in each phase of apply (summed over its rounds)."""
    total: dict[str, float] = {}
    for o in run.outcomes:
        for name, seconds in o.get("phases", {}).items():
            total[name] = total.get(name, 0.0) + seconds
    n = max(len(run.outcomes), 1)
    return ", ".join(f"{name} {seconds / n:.2f}" for name, seconds in sorted(total.items()))


def table(runs: list[Run]) -> str:
    lines = [
        f"{'N':>6} {'releases':>8} {'conflicts':>9} {'(cert+bf)':>9} {'per release':>11} "
        f"{'retries':>7} {'lost':>4} {'lease':>5} {'setup s':>8} {'wall s':>7} {'s/release':>9}"
    ]
    for r in runs:
        t = r.retries()
        lines.append(
            f"{r.packs:>6} {r.releases:>8} {r.conflicts:>9} "
            f"{f'{r.cert_failures}+{r.bf_aborts}':>9} {r.per_release:>11.3f} "
            f"{t['rounds']:>7} {t['lost']:>4} {t['lease']:>5} {r.setup_seconds:>8.1f} "
            f"{r.wall_seconds:>7.1f} {r.wall_seconds / max(r.releases, 1):>9.2f}"
        )
    return "\n".join(lines)


@pytest.mark.campaign
def test_r30_one_pack_releases_on_every_galera_node_conflict_no_more_in_a_larger_catalog(
    galera_cluster: GaleraCluster, tmp_path: Path
) -> None:
    assert len(SIZES) >= 2 and sorted(SIZES) == SIZES
    runs = []
    for size in SIZES:
        run, urls = run_size(galera_cluster, tmp_path / f"n{size}", size)
        check_releases(run)
        revision, digest, failed = check_nodes(urls, run)
        runs.append(run)
        print(
            f"\n[r30 galera N={size}] releases {run.releases}, retries {run.retries()}, "
            f"conflicts {run.conflicts} (cert failures {run.cert_failures}, bf aborts "
            f"{run.bf_aborts}), revision {revision} digest {digest[:16]}... on every node; "
            f"mean s per release by phase: {phase_seconds(run)}; {lost_races(run, failed)}"
        )
        query(galera_cluster.nodes[0].port, f"DROP DATABASE `r30_{size}`")
    print(f"\n[r30 galera] {WRITERS} writers x {RELEASES} one-pack releases\n{table(runs)}")
    smallest, largest = runs[0], runs[-1]
    assert largest.per_release <= smallest.per_release + SLACK, table(runs)
