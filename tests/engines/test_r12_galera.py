"""The store on the test's own 3-node MariaDB Galera cluster (synchronous multi-primary).

One store, written through every node: one apply per node through the CLI, then
writers on all three nodes at once through the API. Afterwards every node holds
the same gapless log — same head, chain and Merkle root — ``audit verify`` and
``projections verify`` are clean on each, every activation epoch has one winner,
and a lost race (a Galera certification failure surfaces as a deadlock, 1213) was
re-decided inside ``apply``: never UNAVAILABLE, never an internal error (R10-R12).
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from domain.errors import LedgerError
from ledger.api import open_store
from tests.support.cli_inprocess import cli_json
from tests.support.cluster_checks import node_report, one_winner_per_epoch, settle
from tests.support.cluster_support import GaleraCluster, admin
from tests.support.gitrepo import Repo, manifest, official, push_closure, push_pack

PACKS = ("alpha", "beta", "gamma")


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Six releases of three packs: each advances every pack and binds one audience more."""
    work = tmp_path_factory.mktemp("galera-releases")
    repo = Repo(work / "repo")
    out = []
    for version in range(1, 7):
        commit = repo.commit({f"{p}/pack.json": push_pack(p, version) for p in PACKS})
        packs = [official(p, repo.path, commit, f"{p}/pack.json") for p in PACKS]
        bindings = [
            b for n, p in enumerate(PACKS[: 1 + version % 3]) for b in push_closure(f"app:a{n}", p)
        ]
        out.append(manifest(work / f"release-{version}.json", packs, bindings))
    return out


def _store_on(cluster: GaleraCluster, name: str) -> list[str]:
    """A fresh database on the cluster, initialized once (through the first node)."""
    first = cluster.nodes[0]
    cluster.create_database(first.port, name)
    code, init = cli_json("--db", first.url(name), "init")
    assert (code, init["created"]) == (0, True), init
    return [node.url(name) for node in cluster.nodes]


def test_r12_one_apply_per_galera_node_keeps_one_verifiable_chain(
    galera_cluster: GaleraCluster, releases: list[Path]
) -> None:
    urls = _store_on(galera_cluster, "cl_each")
    applied = []
    for url, release in zip(urls, releases, strict=False):
        code, result = cli_json("--db", url, "apply", str(release), "--wait", "30")
        assert code == 0, result
        applied.append(result)
        settle(urls)  # the next node decides on everything written through the previous one
    assert [r["packs"][0]["decision"] for r in applied] == ["install", "advance", "advance"]
    assert [r["catalog"]["revision"] for r in applied] == [1, 2, 3]
    code, published = cli_json("--db", urls[2], "publish")
    assert (code, published["noop"], published["revision"]) == (0, True, 3)

    head = settle(urls)
    reports = [node_report(url) for url in urls]
    assert {r.agreed() for r in reports} == {(head, reports[0].root, reports[0].chain, 3)}
    for report in reports:
        assert report.gapless, report.url
        assert report.epochs == {p: [1, 2, 3] for p in PACKS}
        assert set(report.commands) == {r["command_id"] for r in applied}
    for url in urls:  # the CLI's own audit agrees, node by node
        code, audit = cli_json("--db", url, "audit", "verify")
        assert (code, audit["ok"], audit["size"]) == (0, True, head), audit


def test_r12_writers_on_every_galera_node_at_once_never_see_unavailable(
    galera_cluster: GaleraCluster, releases: list[Path]
) -> None:
    urls = _store_on(galera_cluster, "cl_race")
    outcomes: list[tuple[str, str]] = []
    failures: list[str] = []
    lock = threading.Lock()

    def writer(url: str, order: list[Path]) -> None:
        with open_store(url) as store:
            for n, release in enumerate(order):
                kind = "publish" if n % 3 == 2 else "apply"
                try:
                    if kind == "publish":
                        result: Any = store.publish()
                    else:
                        result = store.apply(release, wait=300.0, lease_ttl=30.0)
                    outcome = f"{kind}:{'noop' if result['noop'] else 'ok'}"
                except LedgerError as exc:
                    outcome = f"{kind}:{exc.code}"
                    if exc.code != "CONFLICT" or kind == "apply":
                        with lock:
                            failures.append(f"{url} {kind}: {exc.code}: {exc.message}")
                with lock:
                    outcomes.append((url, outcome))

    threads = [
        threading.Thread(target=writer, args=(url, releases[i:] + releases[:i]))
        for i, url in enumerate(urls)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    assert not any(t.is_alive() for t in threads)
    # Every apply converged (applied, or found nothing left to do); a publish may lose its
    # race to an apply's final append (CONFLICT, exit 4), never anything else.
    assert failures == []
    assert len(outcomes) == 3 * len(releases)
    assert sum(1 for _, o in outcomes if o == "apply:ok") >= 3

    head = settle(urls)
    reports = [node_report(url) for url in urls]
    assert len({r.agreed() for r in reports}) == 1, [r.agreed() for r in reports]
    assert reports[0].size == head
    for report in reports:
        assert report.gapless and one_winner_per_epoch(report.epochs), report
        assert report.commands == reports[0].commands


def test_r12_a_command_on_a_node_still_applying_init_waits_for_it(
    galera_cluster: GaleraCluster,
) -> None:
    """Opening a store reads causally (``wsrep_sync_wait``): a command on a node that has
    not yet applied ``init`` waits until it has, instead of finding no schema, or tables
    without their version row (INTEGRITY "schema version: expected 3, found none": the
    race CI lost once). The node is held behind deterministically: FLUSH TABLES WITH READ
    LOCK pauses its applier (and desyncs it, so the cluster does not wait for it)."""
    first, second = galera_cluster.nodes[0], galera_cluster.nodes[1]
    galera_cluster.create_database(first.port, "cl_causal")
    outcome: list[tuple[int, Any]] = []
    with admin(second.port) as hold, hold.cursor() as cur:
        cur.execute("FLUSH TABLES WITH READ LOCK")
        try:
            code, init = cli_json("--db", first.url("cl_causal"), "init")
            assert (code, init["created"]) == (0, True), init
            reader = threading.Thread(
                target=lambda: outcome.append(cli_json("--db", second.url("cl_causal"), "status"))
            )
            reader.start()
            _wait_for_causal_read(cur, reader)  # the command is waiting in its causal read
            assert outcome == []
        finally:
            cur.execute("UNLOCK TABLES")
    reader.join(timeout=60)
    assert not reader.is_alive()
    [(code, status)] = outcome
    assert (code, status) == (0, {"head": 0, "packs": []})


def _wait_for_causal_read(cur: Any, reader: threading.Thread) -> None:
    """Until the node's process list shows the causal read (``SELECT 1``) waiting."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and reader.is_alive():
        cur.execute("SELECT COUNT(*) FROM information_schema.processlist WHERE info = 'SELECT 1'")
        if cur.fetchone()[0]:
            return
        time.sleep(0.05)
    raise AssertionError("the command never waited in a causal read on the lagging node")


def test_r12_a_node_that_cannot_catch_up_within_the_causal_read_timeout_is_unavailable(
    galera_cluster: GaleraCluster,
) -> None:
    """The causal wait is bounded by Galera's ``repl.causal_read_timeout``: past it the
    command is UNAVAILABLE (exit 1) naming the node's lag, not a lock-wait CONFLICT."""
    first, second = galera_cluster.nodes[0], galera_cluster.nodes[1]
    galera_cluster.create_database(first.port, "cl_behind")
    with admin(second.port) as hold, hold.cursor() as cur:
        cur.execute("SELECT @@wsrep_provider_options")
        options = str(cur.fetchone()[0])
        before = re.search(r"repl\.causal_read_timeout = (\S+?);", options)
        assert before is not None, options
        try:
            cur.execute("SET GLOBAL wsrep_provider_options = 'repl.causal_read_timeout=PT1S'")
            cur.execute("FLUSH TABLES WITH READ LOCK")
            code, init = cli_json("--db", first.url("cl_behind"), "init")
            assert (code, init["created"]) == (0, True), init
            code, error = cli_json("--db", second.url("cl_behind"), "status")
        finally:
            cur.execute("UNLOCK TABLES")
            cur.execute(
                "SET GLOBAL wsrep_provider_options = %s",
                (f"repl.causal_read_timeout={before.group(1)}",),
            )
    assert (code, error["error"], error["details"]["retryable"]) == (1, "UNAVAILABLE", True), error
    assert "did not catch up with the cluster" in error["message"], error
