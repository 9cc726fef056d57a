"""R24: the head row is part of the contract, and ``doctor --repair`` restores what the
log can rebuild (the head row, every derived table and the views that lived in them).

Found in issue 24: with ``ledger_head`` gone, ``status`` advised ``init``, ``init``
created a head at position 0 over the existing events, ``doctor`` said ok, and every
later write failed with CONFLICT. ``doctor --repair`` left missing view tables missing,
and an extra ``NOT NULL`` column on ``ledger_events`` was invisible to ``doctor`` while
every append failed with UNAVAILABLE.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from ledger.log.db import open_database
from tests.support.cli_inprocess import cli_json
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World

#: Every command that opens the store (reads, writes, audits) must refuse it.
COMMANDS = (
    ("status",),
    ("publish",),
    ("view", "integration:a"),
    ("audit", "verify"),
    ("log",),
    ("projections", "rebuild"),
    ("credentials", "issue", "integration:a"),
)


def released(world: World, version: int = 1) -> None:
    bindings = push_closure("integration:a", "sales")
    world.service.apply(
        world.manifest([world.official("sales", world.commit("sales", version))], bindings)
    )


def sql(world: World, statement: str, **params: object) -> None:
    with world.db.write() as conn:
        conn.execute(sa.text(statement), params)


def last_row(world: World) -> tuple[int, bytes]:
    with world.db.read() as conn:
        row = conn.execute(
            sa.text("SELECT position, chain FROM ledger_events ORDER BY position DESC LIMIT 1")
        ).one()
    return int(row[0]), bytes(row[1])


def head_row(world: World) -> tuple[int, bytes] | None:
    with world.db.read() as conn:
        row = conn.execute(sa.text("SELECT position, chain FROM ledger_head")).first()
    return None if row is None else (int(row[0]), bytes(row[1]))


def next_release_applies(world: World) -> None:
    """A real write after the repair: the head row is the one appends extend."""
    manifest = world.manifest(
        [world.official("sales", world.commit("sales", 9))], push_closure("integration:a", "sales")
    )
    code, result = cli_json("--db", world.url, "apply", str(manifest))
    assert code == 0, result
    assert head_row(world) == last_row(world)


def delete_head_row(world: World) -> None:
    sql(world, "DELETE FROM ledger_head")


def head_at_zero(world: World) -> None:
    """What the old ``init`` did after the table was dropped: a head at 0 over the log."""
    sql(world, "UPDATE ledger_head SET position = 0, chain = :c", c=bytes(32))


def head_one_behind(world: World) -> None:
    position, _ = last_row(world)
    with world.db.read() as conn:
        chain = conn.execute(
            sa.text("SELECT chain FROM ledger_events WHERE position = :p"), {"p": position - 1}
        ).scalar_one()
    sql(world, "UPDATE ledger_head SET position = :p, chain = :c", p=position - 1, c=chain)


def head_chain_edited(world: World) -> None:
    sql(world, "UPDATE ledger_head SET chain = :c", c=b"\x01" * 32)


def tail_row_deleted(world: World) -> None:
    """The last event deleted, the head left alone: the head is past the log."""
    position, _ = last_row(world)
    sql(world, "DELETE FROM ledger_events WHERE position = :p", p=position)


HEAD_FAULTS: dict[str, Callable[[World], None]] = {
    "row deleted": delete_head_row,
    "reset to position 0": head_at_zero,
    "one row behind": head_one_behind,
    "chain edited": head_chain_edited,
    "past the last row": tail_row_deleted,
}


@pytest.mark.parametrize("fault", sorted(HEAD_FAULTS))
def test_r24_a_head_row_not_naming_the_last_row_is_refused_by_every_command(
    world: World, fault: str
) -> None:
    released(world)
    HEAD_FAULTS[fault](world)
    before = world.tables()
    code, report = cli_json("--db", world.url, "doctor")
    assert (code, report["ok"]) == (6, False), report
    unsafe = [d for d in report["differences"] if not d["safe"]]
    assert [d["object"] for d in unsafe] == ["ledger_head"], report
    assert unsafe[0]["expected"].endswith("(the last row of ledger_events)")
    assert unsafe[0]["found"].endswith("(run `catalog-ledger doctor --repair`)")
    for args in (("init",), *COMMANDS):
        code, error = cli_json("--db", world.url, *args)
        assert (code, error["error"]) == (6, "INTEGRITY"), (args, error)
        assert "ledger_head" in error["message"], (args, error)
    assert world.tables() == before  # init created no head over the events; nothing written


@pytest.mark.parametrize("fault", sorted(HEAD_FAULTS))
def test_r24_doctor_repair_rebuilds_the_head_row_from_the_log(world: World, fault: str) -> None:
    released(world)
    HEAD_FAULTS[fault](world)
    assert cli_json("--db", world.url, "doctor", "--repair") == (
        0,
        {"ok": True, "differences": []},
    )
    assert head_row(world) == last_row(world)
    code, audit = cli_json("--db", world.url, "audit", "verify")
    if fault == "past the last row":
        # The head now names the log's last row, but the views still hold the lost
        # event: the audit names them, so the lost tail stays visible (`projections
        # rebuild` would align them with the shorter log: see README, schema contract).
        assert (code, audit["details"]["first_problem"]["check"]) == (6, "views"), audit
        assert "does not match the log at the recorded position" in audit["message"]
        return
    assert code == 0, audit
    next_release_applies(world)


def test_r24_a_dropped_head_table_is_integrity_not_run_init_and_repair_restores_it(
    world: World,
) -> None:
    released(world)
    events = last_row(world)
    sql(world, "DROP TABLE ledger_head")
    world.db.engine.dispose()
    before = world.tables()
    code, report = cli_json("--db", world.url, "doctor")
    assert code == 6 and [d["object"] for d in report["differences"]] == ["table ledger_head"]
    for args in (("init",), *COMMANDS):
        code, error = cli_json("--db", world.url, *args)
        assert (code, error["error"]) == (6, "INTEGRITY"), (args, error)
        assert "ledger_head" in error["message"] and "run `catalog-ledger init`" not in str(
            error
        ), (args, error)
    assert world.tables() == before  # init did not create the table (nor a head at 0)
    assert cli_json("--db", world.url, "doctor", "--repair") == (
        0,
        {"ok": True, "differences": []},
    )
    world.db.engine.dispose()
    assert head_row(world) == events
    next_release_applies(world)


def test_r24_doctor_repair_refuses_to_rebuild_the_head_over_a_broken_chain(world: World) -> None:
    released(world)
    sql(world, "DELETE FROM ledger_head")
    sql(world, "UPDATE ledger_events SET state = :s WHERE position = 3", s=b'{"edited": true}')
    before = world.tables()
    code, error = cli_json("--db", world.url, "doctor", "--repair")
    assert (code, error["error"]) == (6, "INTEGRITY"), error
    assert "the log does not verify at position 3 (event_id" in error["message"], error
    assert error["details"]["position"] == 3 and error["details"]["table"] == "ledger_head"
    assert world.tables() == before  # no head row written
    assert head_row(world) is None


def test_r24_init_on_an_empty_log_without_a_head_row_finishes_an_interrupted_init(
    world: World,
) -> None:
    sql(world, "DELETE FROM ledger_head")
    code, info = cli_json("--db", world.url, "init")
    assert (code, info["head_position"]) == (0, 0), info
    assert head_row(world) == (0, bytes(32))


# -- missing derived tables -----------------------------------------------------------------

DERIVED = ("view_credential", "view_installed_pack", "publish_fragment")


def _rows(world: World, table: str) -> list[tuple[object, ...]]:
    """The rows of a view's live version, without the version number (a rebuild moves it)."""
    with world.db.read() as conn:
        rows = conn.execute(sa.text(f"SELECT * FROM {table}")).mappings().all()
    return sorted(tuple((k, v) for k, v in r.items() if k != "view_version") for r in rows)


def test_r24_doctor_repair_restores_every_missing_derived_table_and_rebuilds_its_view(
    world: World,
) -> None:
    released(world)
    assert cli_json("--db", world.url, "credentials", "issue", "integration:a")[0] == 0
    assert cli_json("--db", world.url, "publish")[0] == 0
    code, served = cli_json("--db", world.url, "view", "integration:a")
    assert code == 0
    kept = {t: _rows(world, t) for t in ("view_credential", "view_installed_pack")}
    assert all(kept.values()), kept  # the views had rows to lose
    for table in DERIVED:
        sql(world, f"DROP TABLE {table}")
    world.db.engine.dispose()
    code, report = cli_json("--db", world.url, "doctor")
    missing = sorted(d["object"] for d in report["differences"])
    assert missing == sorted(f"table {t}" for t in DERIVED), report
    assert cli_json("--db", world.url, "doctor", "--repair") == (
        0,
        {"ok": True, "differences": []},
    )
    world.db.engine.dispose()
    assert {t: _rows(world, t) for t in kept} == kept  # rebuilt from the log
    assert cli_json("--db", world.url, "projections", "verify")[0] == 0
    assert cli_json("--db", world.url, "view", "integration:a") == (0, served)
    assert cli_json("--db", world.url, "credentials", "list")[1]["credentials"]
    next_release_applies(world)
    assert cli_json("--db", world.url, "publish")[0] == 0


def test_r24_init_rebuilds_a_view_whose_table_was_lost(world: World) -> None:
    released(world)
    kept = _rows(world, "view_installed_pack")
    sql(world, "DROP TABLE view_installed_pack")
    world.db.engine.dispose()
    assert cli_json("--db", world.url, "init")[0] == 0
    world.db.engine.dispose()
    assert _rows(world, "view_installed_pack") == kept
    assert cli_json("--db", world.url, "projections", "verify")[0] == 0


# -- extra columns --------------------------------------------------------------------------


def add_events_column(world: World, declaration: str) -> None:
    """``ALTER TABLE ledger_events ADD COLUMN``; SQLite refuses NOT NULL without a default
    there, so the table is rebuilt with the column (existing rows get 0)."""
    if not world.url.startswith("sqlite") or "NOT NULL" not in declaration:
        sql(world, f"ALTER TABLE ledger_events ADD COLUMN {declaration}")
        return
    conn = sqlite3.connect(world.url.removeprefix("sqlite:///"))
    try:
        (create,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'ledger_events'"
        ).fetchone()
        edited = create.replace("chain BLOB NOT NULL,", f"chain BLOB NOT NULL, {declaration},")
        assert edited != create
        conn.executescript(
            "ALTER TABLE ledger_events RENAME TO old_events;"
            f"{edited};"
            "INSERT INTO ledger_events SELECT *, 0 FROM old_events;"
            "DROP TABLE old_events;"
        )
    finally:
        conn.close()


def test_r24_an_extra_not_null_column_without_default_on_ledger_events_is_unsafe(
    world: World,
) -> None:
    released(world)
    add_events_column(world, "extra INTEGER NOT NULL")
    world.db.engine.dispose()
    before = world.tables()
    code, report = cli_json("--db", world.url, "doctor")
    assert code == 6, report
    (difference,) = report["differences"]
    assert difference == {
        "object": "column ledger_events.extra",
        "expected": "absent",
        "found": "present, NOT NULL without a default: every insert into ledger_events fails",
        "safe": False,
    }
    manifest = world.manifest(
        [world.official("sales", world.commit("sales", 2))], push_closure("integration:a", "sales")
    )
    code, error = cli_json("--db", world.url, "apply", str(manifest))
    assert (code, error["error"]) == (6, "INTEGRITY"), error  # was exit 1 UNAVAILABLE
    assert "column ledger_events.extra" in error["message"], error
    assert world.tables() == before


@pytest.mark.parametrize("declaration", ["extra INTEGER NULL", "extra INTEGER NOT NULL DEFAULT 7"])
def test_r24_an_extra_column_inserts_can_leave_out_stays_a_safe_difference(
    world: World, declaration: str
) -> None:
    released(world)
    add_events_column(world, declaration)
    world.db.engine.dispose()
    code, report = cli_json("--db", world.url, "doctor")
    assert (code, report["ok"]) == (0, True), report
    assert report["differences"] == [
        {
            "object": "column ledger_events.extra",
            "expected": "absent",
            "found": "present (nullable or with a default: inserts still work)",
            "safe": True,
        }
    ]
    next_release_applies(world)


def test_r24_a_missing_head_row_over_an_empty_log_names_init(world: World) -> None:
    sql(world, "DELETE FROM ledger_head")
    code, error = cli_json("--db", world.url, "status")
    assert (code, error["error"]) == (6, "INTEGRITY"), error
    assert "ledger_head" in error["message"] and "run `catalog-ledger init`" in error["message"]


def test_r24_a_head_row_of_another_type_is_unsafe_and_doctor_repair_restores_it(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Found by a hostile pass: a head position stored as text made every command, doctor
    included, an internal error; it is an unsafe difference that --repair rebuilds."""
    world = World(tmp_path, sqlite_url)
    world.apply(world.official("sales", world.commit("sales", 1)))
    head = world.head()
    world.close()
    with open_database(sqlite_url).write() as conn:
        conn.execute(sa.text("UPDATE ledger_head SET position = 'abc'"))
    code, status = cli_json("--db", sqlite_url, "status")
    assert (code, status["error"]) == (6, "INTEGRITY"), status
    code, doctor = cli_json("--db", sqlite_url, "doctor")
    assert doctor["ok"] is False and any(
        d["object"] == "ledger_head" and not d["safe"] for d in doctor["differences"]
    ), (code, doctor)
    code, repaired = cli_json("--db", sqlite_url, "doctor", "--repair")
    assert code == 0, repaired
    code, status = cli_json("--db", sqlite_url, "status")
    assert code == 0, status
    code, verified = cli_json("--db", sqlite_url, "audit", "verify")
    assert (code, verified["size"]) == (0, head), verified
