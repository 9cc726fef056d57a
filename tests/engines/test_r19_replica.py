"""Readers on an asynchronous MariaDB replica while ``apply`` writes to the primary (R18, R19).

The test owns both servers. The replica is ``read_only`` and the readers reach it
through an account that may only SELECT the store (and watch replication). With
the replica's SQL thread stopped, a reader that needs the primary's newest
revision gets STALE naming the served and the required revision, and a plain
read serves the last revision the replica holds completely — never part of the
next one. Once replication resumes the replica catches up. ``serve`` runs there
(bearer tokens checked, R26), ``/healthz`` and ``/metrics`` show the served revision,
``/healthz`` the replication state and lag, and it never tries to write: the
replica's general log holds no write statement of the reader's account.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from domain.errors import Stale
from domain.identity import Audience
from ledger.log.db import open_database
from ledger.store.replica import replication, writable
from projections.reader import CatalogReader
from tests.support.cli_inprocess import cli_json
from tests.support.cli_support import ServedStore
from tests.support.cluster_support import ReplicaPair, admin, query
from tests.support.gitrepo import Repo, manifest, official, push_closure, push_pack

READER, READER_PASSWORD = "reader", "reader-pw"
AUDIENCE = "app:crm"
#: Statements that write or lock for writing (a denied one is still logged: it was tried).
WRITES = re.compile(
    r"^\s*(INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER|TRUNCATE|RENAME|GRANT|LOCK|SET\s+GLOBAL)"
    r"|FOR\s+UPDATE|LOCK\s+IN\s+SHARE\s+MODE",
    re.IGNORECASE,
)


def _gauge(exposition: str, name: str) -> float:
    """The value of an unlabelled gauge in Prometheus text format."""
    found = re.search(rf"^{name} (\S+)$", exposition, re.MULTILINE)
    assert found is not None, exposition
    return float(found.group(1))


@dataclass
class ReplicatedStore:
    pair: ReplicaPair
    primary: str
    replica: str  # through the SELECT-only account
    releases: list[Path]
    token: str  # the audience's bearer token (R26), issued on the primary
    applied: int = 0

    def apply_next(self) -> int:
        """Apply the next release on the primary; return the revision it published."""
        release = self.releases[self.applied]
        self.applied += 1
        code, result = cli_json("--db", self.primary, "apply", str(release))
        assert code == 0 and result["catalog"]["published"], result
        return int(result["catalog"]["revision"])

    def view(self, *args: str) -> tuple[int, dict[str, object]]:
        code, doc = cli_json("--db", self.replica, "view", AUDIENCE, *args)
        return code, doc

    def reader_statements(self) -> list[str]:
        rows = query(
            self.pair.replica.port,
            "SELECT CONVERT(argument USING utf8mb4) FROM mysql.general_log "
            "WHERE user_host LIKE %s AND command_type IN ('Query', 'Execute')",
            (f"{READER}[{READER}]%",),
        )
        return [str(r[0]) for r in rows]


@pytest.fixture(scope="module")
def store(
    replica_pair: ReplicaPair, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ReplicatedStore]:
    """A store initialized on the primary, replicated, with four releases to apply."""
    work = tmp_path_factory.mktemp("replica")
    repo = Repo(work / "repo")
    releases = []
    for version in range(1, 5):
        commit = repo.commit({"sales/pack.json": push_pack("sales", version)})
        releases.append(
            manifest(
                work / f"release-{version}.json",
                [official("sales", repo.path, commit, "sales/pack.json")],
                push_closure(AUDIENCE, "sales"),
            )
        )
    pair = replica_pair
    pair.create_reader(READER, READER_PASSWORD, "cl")
    # Every statement the replica receives from now on is in mysql.general_log.
    query(pair.replica.port, "SET GLOBAL general_log = 1")
    pair.create_database(pair.primary.port, "cl")
    primary = pair.primary.url("cl")
    code, init = cli_json("--db", primary, "init")
    assert code == 0 and init["created"], init
    code, credential = cli_json("--db", primary, "credentials", "issue", AUDIENCE)
    assert code == 0, credential
    pair.wait_caught_up()
    replica = pair.replica.url("cl", user=READER, password=READER_PASSWORD)
    yield ReplicatedStore(pair, primary, replica, releases, credential["token"])


def test_r19_replica_behind_its_primary_is_stale_and_serves_the_last_complete_revision(
    store: ReplicatedStore,
) -> None:
    served = store.apply_next()
    store.pair.wait_caught_up()
    code, before = store.view()
    assert (code, before["revision"]) == (0, served)

    store.pair.pause()  # STOP SLAVE SQL_THREAD: the replica falls behind
    try:
        required = store.apply_next()
        assert required == served + 1
        code, stale = store.view("--min-revision", str(required))
        assert (code, stale["error"]) == (5, "STALE")
        assert stale["details"] == {
            "axis": "revision",
            "required_revision": required,
            "served_revision": served,
        }
        # A plain read serves the last revision the replica holds, complete and verified.
        code, plain = store.view()
        assert (code, plain) == (0, before)
        replica_db = open_database(store.replica, create=False)
        try:
            reader = CatalogReader(replica_db)
            runtime = reader.view(Audience.parse(AUDIENCE))
            assert runtime.to_json() == before
            with pytest.raises(Stale) as info:
                reader.view(Audience.parse(AUDIENCE), min_revision=required)
            assert info.value.details["served_revision"] == served
        finally:
            replica_db.close()
    finally:
        store.pair.resume()
    store.pair.wait_caught_up()
    code, caught_up = store.view("--min-revision", str(required))
    assert (code, caught_up["revision"]) == (0, required)
    code, on_primary = cli_json("--db", store.primary, "view", AUDIENCE)
    assert (code, caught_up) == (0, on_primary)


def test_r19_serve_on_a_replica_through_a_select_only_account_never_writes(
    store: ReplicatedStore,
) -> None:
    served = store.apply_next()
    store.pair.wait_caught_up()
    server = ServedStore(store.replica, auth=True)  # bearer tokens checked there too (R26)
    token = store.token
    started = time.monotonic()
    try:
        health = server.client.get("/healthz").json()
        assert health["catalog_revision"] == served
        assert health["writes"] is False
        assert health["replication"] == {
            "io_running": True,
            "sql_running": True,
            "seconds_behind_primary": 0,
            "last_error": None,
        }
        first = server.view(AUDIENCE, token=token)
        assert (first.status_code, first.json().get("revision")) == (200, served), first.text
        exposition = server.client.get("/metrics").text
        assert _gauge(exposition, "catalog_ledger_replication_running") == 1
        assert _gauge(exposition, "catalog_ledger_replication_lag_seconds") == 0

        store.pair.pause()
        try:
            required = store.apply_next()
            assert required == served + 1
            stale = server.view(AUDIENCE, token=token, min_revision=required)
            assert stale.status_code == 409
            assert stale.json()["details"] == {
                "axis": "revision",
                "required_revision": required,
                "served_revision": served,
            }
            plain = server.view(AUDIENCE, token=token)
            assert (plain.status_code, plain.json()) == (200, first.json())
            health = server.client.get("/healthz").json()
            assert health["catalog_revision"] == served
            assert health["replication"]["sql_running"] is False
            assert health["replication"]["seconds_behind_primary"] is None
            metrics = server.client.get("/metrics")
            assert metrics.status_code == 200
            assert _gauge(metrics.text, "catalog_ledger_catalog_revision") == served
            assert _gauge(metrics.text, "catalog_ledger_replication_running") == 0
            assert not re.search(r"^catalog_ledger_replication_lag_seconds ", metrics.text, re.M)
        finally:
            store.pair.resume()
        store.pair.wait_caught_up()
        fresh = server.view(AUDIENCE, token=token, min_revision=required)
        assert (fresh.status_code, fresh.json()["revision"]) == (200, required)
        health = server.client.get("/healthz")
        assert health.status_code == 200
        assert health.json()["catalog_revision"] == required
        assert health.json()["replication"]["sql_running"] is True
        # Long enough for a catch-up follower (every second) to have run twice, had it
        # been started: its SELECT ... FOR UPDATE would be in the log below.
        time.sleep(max(0.0, started + 2.5 - time.monotonic()))
    finally:
        server.close()

    statements = store.reader_statements()
    assert any("view_catalog_grant" in s for s in statements)  # the log saw the reads
    assert [s for s in statements if WRITES.search(s)] == []


def test_r19_only_a_writable_server_and_an_updating_account_count_as_writable(
    store: ReplicatedStore,
) -> None:
    pair = store.pair
    with admin(pair.primary.port) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")  # this account exists on the primary only
        cur.execute("CREATE USER 'peek'@'127.0.0.1' IDENTIFIED BY 'peek-pw'")
        cur.execute("GRANT SELECT ON `cl`.* TO 'peek'@'127.0.0.1'")
    cases = {
        "root on the primary": pair.primary.url("cl"),
        "SELECT-only on the primary": pair.primary.url("cl", user="peek", password="peek-pw"),
        "root on the read_only replica": pair.replica.url("cl"),
        "SELECT-only on the replica": store.replica,
    }
    found = {}
    for case, url in cases.items():
        db = open_database(url, create=False)
        try:
            found[case] = (writable(db), replication(db) is not None)
        finally:
            db.close()
    assert found == {
        "root on the primary": (True, False),
        "SELECT-only on the primary": (False, False),
        "root on the read_only replica": (False, True),
        "SELECT-only on the replica": (False, True),
    }
