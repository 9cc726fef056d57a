"""R24: the declared schema is a contract; drift is found, named, and fails closed."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.cli_inprocess import cli_json
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World


def _sqlite_rebuild(url: str, table: str, edit: tuple[str, str]) -> None:
    """SQLite cannot ALTER a constraint or a column type: rebuild the table, edited."""
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        (sql,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        changed = re.sub(edit[0], edit[1], sql)
        assert changed != sql
        conn.executescript(
            f"ALTER TABLE {table} RENAME TO old_{table};"
            f"{changed};"
            f"INSERT INTO {table} SELECT * FROM old_{table};"
            f"DROP TABLE old_{table};"
        )
    finally:
        conn.close()


def drop_unique_key(world: World) -> None:
    if world.url.startswith("sqlite"):
        _sqlite_rebuild(world.url, "ledger_events", (r",\s*CONSTRAINT uq_\w+ UNIQUE \([^)]*\)", ""))
    else:
        with world.db.write() as conn:
            conn.exec_driver_sql(
                "ALTER TABLE ledger_events DROP INDEX uq_ledger_events_aggregate_version"
            )


def binary_to_text(world: World) -> None:
    if world.url.startswith("sqlite"):
        _sqlite_rebuild(world.url, "ledger_events", (r"topic BLOB", "topic TEXT"))
    else:
        with world.db.write() as conn:
            conn.exec_driver_sql("ALTER TABLE ledger_events MODIFY topic VARCHAR(255) NOT NULL")


def bump_schema_version(world: World) -> None:
    """A version newer than this program knows (a later release's store)."""
    with world.db.write() as conn:
        conn.execute(
            sa.text("UPDATE ledger_meta SET value = :v WHERE name = :n"),
            {"v": b"4", "n": b"schema_version"},
        )


DRIFT = {
    "unique key ledger_events(aggregate_id, version)": drop_unique_key,
    "column ledger_events.topic": binary_to_text,
    "schema version": bump_schema_version,
}


def released(world: World) -> None:
    bindings = push_closure("integration:a", "sales")
    world.service.apply(
        world.manifest([world.official("sales", world.commit("sales", 1))], bindings)
    )


def test_r24_a_healthy_store_has_no_differences(world: World) -> None:
    released(world)
    assert cli_json("--db", world.url, "doctor") == (0, {"ok": True, "differences": []})


@pytest.mark.parametrize("difference", sorted(DRIFT))
def test_r24_unsafe_drift_fails_every_command_closed_and_writes_nothing(
    world: World, difference: str
) -> None:
    released(world)
    DRIFT[difference](world)
    before = world.tables()
    code, report = cli_json("--db", world.url, "doctor")
    assert code == 6 and report["ok"] is False
    assert [d["object"] for d in report["differences"] if not d["safe"]] == [difference]
    manifest = world.manifest(
        [world.official("sales", world.commit("sales", 2))], push_closure("integration:a", "sales")
    )
    for args in (
        ("init",),
        ("status",),
        ("apply", str(manifest)),
        ("publish",),
        ("view", "integration:a"),
        ("audit", "verify"),
        ("log",),
        ("projections", "rebuild"),
    ):
        code, error = cli_json("--db", world.url, *args)
        assert (code, error["error"]) == (6, "INTEGRITY"), (args, error)
        assert difference in error["message"], (args, error)
    assert world.tables() == before


def test_r24_a_missing_secondary_index_is_safe_and_repaired(world: World) -> None:
    released(world)
    with world.db.write() as conn:
        conn.exec_driver_sql(
            "DROP INDEX ix_view_pack_generation_0"
            + ("" if world.url.startswith("sqlite") else " ON view_pack_generation")
        )
    code, report = cli_json("--db", world.url, "doctor")
    assert code == 0 and report["ok"] is True
    assert report["differences"] == [
        {
            "object": "index ix_view_pack_generation_0 on view_pack_generation",
            "expected": "present",
            "found": "missing",
            "safe": True,
        }
    ]
    assert cli_json("--db", world.url, "status")[0] == 0  # safe: commands still run
    assert cli_json("--db", world.url, "doctor", "--repair") == (
        0,
        {"ok": True, "differences": []},
    )


def test_r24_healthz_reports_the_schema_contract(world: World) -> None:
    from fastapi.testclient import TestClient

    from ledger.api import Store
    from ledger.http.app import create_app

    released(world)
    with world.db.write() as conn:
        conn.exec_driver_sql(
            "DROP INDEX ix_view_pack_generation_0"
            + ("" if world.url.startswith("sqlite") else " ON view_pack_generation")
        )
    store = Store(world.url)
    with TestClient(create_app(store.opener())) as client:
        health = client.get("/healthz")
        assert health.status_code == 200 and health.json()["schema_ok"] is True
        assert [d["object"] for d in health.json()["schema_differences"]] == [
            "index ix_view_pack_generation_0 on view_pack_generation"
        ]
    drop_unique_key(world)
    with TestClient(create_app(store.opener())) as client:
        health = client.get("/healthz")
        assert health.status_code == 503 and health.json()["schema_ok"] is False
        assert "unique key ledger_events(aggregate_id, version)" in [
            d["object"] for d in health.json()["schema_differences"] if not d["safe"]
        ]
    store.close()


def _store_version(world: World, value: object) -> None:
    """Write ``ledger_meta.schema_version`` as ``value`` behind the store's back: a str on
    SQLite is stored as TEXT (the column's BLOB affinity keeps what it is given)."""
    if world.url.startswith("sqlite"):
        conn = sqlite3.connect(world.url.removeprefix("sqlite:///"))
        with conn:
            conn.execute(
                "UPDATE ledger_meta SET value = ? WHERE name = ?", (value, b"schema_version")
            )
        conn.close()
        return
    with world.db.write() as c:
        c.execute(
            sa.text("UPDATE ledger_meta SET value = :v WHERE name = :n"),
            {"v": value, "n": b"schema_version"},
        )


@pytest.mark.parametrize("value", [b"two", b"2.0", b"-1", b"\xff\xfe"])
def test_r24_a_non_integer_schema_version_is_integrity_naming_the_field(
    world: World, value: bytes
) -> None:
    released(world)
    _store_version(world, value)
    before = world.tables()
    for args in (("status",), ("init",), ("migrate",), ("audit", "verify"), ("log",)):
        code, error = cli_json("--db", world.url, *args)
        assert (code, error["error"]) == (6, "INTEGRITY"), (args, error)
        assert "ledger_meta.schema_version" in error["message"], (args, error)
        assert "view row" not in error["message"] and "rebuild" not in error["message"]
    code, report = cli_json("--db", world.url, "doctor")
    assert code == 6 and [d["object"] for d in report["differences"]] == [
        "ledger_meta.schema_version"
    ]
    assert world.tables() == before


def test_r24_a_schema_version_stored_as_text_is_integrity_naming_the_field(
    sqlite_url: str, tmp_path: Path
) -> None:
    world = World(tmp_path, sqlite_url)
    try:
        released(world)
        _store_version(world, "2")  # the right number, the wrong storage class
        for args in (("status",), ("init",), ("migrate",), ("doctor",)):
            code, error = cli_json("--db", world.url, *args)
            if args == ("doctor",):
                found = error["differences"][0]["found"]
                assert code == 6 and found.startswith("a str value '2'"), error
                continue
            assert (code, error["error"]) == (6, "INTEGRITY"), (args, error)
            assert "ledger_meta.schema_version" in error["message"], error
            assert "a str value '2', where the schema declares binary" in error["message"], error
            assert "view row" not in error["message"], error
    finally:
        world.close()
