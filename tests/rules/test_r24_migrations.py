"""R24: numbered schema migrations, run under the migration lock, never touch an event byte.

A store at an older schema version is refused with MIGRATION_REQUIRED (exit 5)
by every command but the read-only audit ones, until ``catalog-ledger migrate``
brings it to this program's version. The 0.1 golden store is the real case:
it is schema version 1 and migrates to 2 with its audit root, log and views
unchanged.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from ledger.api import Store
from ledger.log.tables import SCHEMA_VERSION
from ledger.store.migrations import STEPS
from tests.conformance.test_r23_golden_v0 import (
    EXPECTED,
    GOLDEN,
    expected_view_rows,
    live_rows,
    without_payload_hashes,
)
from tests.support.cli_inprocess import cli, cli_json
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World

STEP_2 = {"version": 2, "summary": STEPS[0].summary}
STEP_3 = {"version": 3, "summary": STEPS[1].summary}


def _sha(path: Path) -> str:
    """A digest of every schema object and row (opening switches the file to WAL
    mode, which changes header bytes but no content)."""
    conn = sqlite3.connect(path)
    try:
        return hashlib.sha256("\n".join(conn.iterdump()).encode()).hexdigest()
    finally:
        conn.close()


@pytest.fixture
def golden_copy(tmp_path: Path) -> Path:
    shutil.copy(GOLDEN / "store.db", tmp_path / "store.db")
    return tmp_path / "store.db"


def as_version_1(world: World) -> None:
    """Turn a current store back into what schema version 1 declared (the 0.1 schema)."""
    with world.db.write() as conn:
        conn.exec_driver_sql("DROP TABLE ledger_lease")
        conn.exec_driver_sql("DROP TABLE ledger_checkpoint")
        conn.execute(
            sa.text("UPDATE ledger_meta SET value = :v WHERE name = :n"),
            {"v": b"1", "n": b"schema_version"},
        )
    world.db.engine.dispose()


def released(world: World) -> None:
    world.service.apply(
        world.manifest(
            [world.official("sales", world.commit("sales", 1))],
            push_closure("integration:a", "sales"),
        )
    )


def test_r24_every_schema_version_has_one_numbered_step() -> None:
    assert [s.version for s in STEPS] == list(range(2, SCHEMA_VERSION + 1))
    assert SCHEMA_VERSION == 3


def test_r24_golden_v0_store_is_refused_until_migrated_and_audit_reads_it(
    golden_copy: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{golden_copy}"
    before = _sha(golden_copy)
    release = tmp_path / "release.json"
    release.write_text('{"packs": []}', encoding="utf-8")
    for args in (
        ("init",),
        ("status",),
        ("view", "integration:billing-reader"),
        ("apply", str(release)),
        ("publish",),
        ("projections", "rebuild"),
        ("projections", "status"),
        ("lease", "status"),
    ):
        code, error = cli_json("--db", url, *args)
        assert (code, error["error"]) == (5, "MIGRATION_REQUIRED"), (args, error)
        assert "catalog-ledger migrate" in error["message"], args
        assert error["details"]["found"] == 1 and error["details"]["expected"] == 3
    # The read-only audit commands read every schema version this release knows.
    code, report = cli_json("--db", url, "audit", "verify")
    assert code == 0 and report["root"] == EXPECTED["audit_verify"]["root"]
    assert cli_json("--db", url, "log", "--limit", "100000") == (0, EXPECTED["log"])
    assert cli("--db", url, "export", "--jsonl").code == 0
    assert cli_json("--db", url, "history", "--pack", "sales")[0] == 0
    assert (
        cli("--db", url, "audit", "checkpoint").stdout.splitlines()[1:3]
        == (EXPECTED["checkpoint"].splitlines()[1:3])
    )
    code, doctor = cli_json("--db", url, "doctor")
    assert code == 5 and doctor["ok"] is False
    assert doctor["differences"] == [
        {
            "object": "schema version",
            "expected": "3",
            "found": "1 (run `catalog-ledger migrate`)",
            "safe": False,
        },
        # Safe differences that `migrate`, like `init`, restores: publication's index by
        # pack and the publisher's kept fragments (derived data).
        {
            "object": "index ix_view_audience_binding_0 on view_audience_binding",
            "expected": "present",
            "found": "missing",
            "safe": True,
        },
        # The audience map's nodes (R28), derived from the log.
        {
            "object": "table view_audience_map",
            "expected": "present",
            "found": "missing",
            "safe": True,
        },
        {
            "object": "table view_audience_map_pending",
            "expected": "present",
            "found": "missing",
            "safe": True,
        },
        {
            "object": "table publish_fragment",
            "expected": "present",
            "found": "missing",
            "safe": True,
        },
    ]
    assert _sha(golden_copy) == before  # nothing was written by any of it


def test_r24_migrating_the_golden_v0_store_keeps_its_root_log_and_views(
    golden_copy: Path,
) -> None:
    url = f"sqlite:///{golden_copy}"
    before = _sha(golden_copy)
    dry = cli_json("--db", url, "migrate", "--dry-run")
    assert dry == (0, {"from": 1, "to": 3, "applied": [STEP_2, STEP_3], "dry_run": True})
    assert _sha(golden_copy) == before  # a dry run changes nothing
    assert cli_json("--db", url, "migrate") == (
        0,
        {"from": 1, "to": 3, "applied": [STEP_2, STEP_3], "dry_run": False},
    )
    assert cli_json("--db", url, "migrate") == (
        0,
        {"from": 3, "to": 3, "applied": [], "dry_run": False},
    )
    code, report = cli_json("--db", url, "audit", "verify")
    want = EXPECTED["audit_verify"]
    assert code == 0 and (report["size"], report["root"], report["chain"]) == (
        want["size"],
        want["root"],
        want["chain"],
    )
    assert cli_json("--db", url, "log", "--limit", "100000") == (0, EXPECTED["log"])
    assert live_rows(url) == expected_view_rows()
    assert cli_json("--db", url, "status") == (0, EXPECTED["status"])
    for audience, per in EXPECTED["views"].items():
        code, live = cli_json("--db", url, "view", audience)
        assert (code, without_payload_hashes(live)) == (per["live"]["code"], per["live"]["out"])
    assert cli_json("--db", url, "doctor") == (0, {"ok": True, "differences": []})


def test_r24_migrate_on_each_engine_keeps_every_event_byte(world: World) -> None:
    released(world)
    as_version_1(world)
    events_before = world.tables()["ledger_events"]
    code, error = cli_json("--db", world.url, "status")
    assert (code, error["error"]) == (5, "MIGRATION_REQUIRED")
    code, audit_before = cli_json("--db", world.url, "audit", "verify")
    assert code == 0
    assert cli_json("--db", world.url, "migrate")[1]["applied"] == [STEP_2, STEP_3]
    tables = world.tables()
    assert tables["ledger_events"] == events_before
    assert "ledger_lease" in tables
    code, audit_after = cli_json("--db", world.url, "audit", "verify")
    assert code == 0 and audit_after["root"] == audit_before["root"]
    assert cli_json("--db", world.url, "status")[0] == 0
    # The migrated store takes writes again, with the lease's coordination row.
    world.service.apply(
        world.manifest(
            [world.official("sales", world.commit("sales", 2))],
            push_closure("integration:a", "sales"),
        )
    )
    assert len(world.tables()["ledger_lease"]) == 1


def test_r24_many_processes_migrating_at_once_apply_each_step_once(world: World) -> None:
    released(world)
    as_version_1(world)
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def migrate() -> None:
        try:
            with Store(world.url) as store:
                start.wait()
                results.append(dict(store.migrate()))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(len(r["applied"]) for r in results) == [0, 0, 0, 2]
    assert cli_json("--db", world.url, "doctor") == (0, {"ok": True, "differences": []})


@pytest.mark.parametrize("stored", [b"4", b"0", b"two"])
def test_r24_migrate_refuses_to_downgrade_or_guess(world: World, stored: bytes) -> None:
    released(world)
    with world.db.write() as conn:
        conn.execute(
            sa.text("UPDATE ledger_meta SET value = :v WHERE name = :n"),
            {"v": stored, "n": b"schema_version"},
        )
    before = world.tables()
    for args in (("migrate",), ("migrate", "--dry-run"), ("status",), ("audit", "verify")):
        code, error = cli_json("--db", world.url, *args)
        assert (code, error["error"]) == (6, "INTEGRITY"), (args, error)
        named = (
            "ledger_meta.schema_version"  # not a version number: the field is named
            if not stored.isdigit()
            else f"schema version {stored.decode()!r}"
            if args[0] == "migrate"
            else f"schema version: expected 3, found {stored.decode()}"
        )
        assert named in error["message"], (args, error)
    assert world.tables() == before
