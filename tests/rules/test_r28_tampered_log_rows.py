"""R22 / R28 (issue 24.3): a tampered log row is INTEGRITY naming its position, everywhere.

One small store per engine (a pack installed and bound to an audience, a catalog
published, and a next release of the pack to apply), copied per case. In each copy
one log row is edited by hand (an empty, truncated or non-JSON ``state``, a state
that is a JSON array, a field of the wrong type; on SQLite also a cell stored as
TEXT or INTEGER, and a NULL state) and one command that reads that row runs in
process: ``audit verify``, ``history`` (``--pack`` and ``--audience``), ``log``,
``projections rebuild``, ``apply``, ``publish`` and ``view``. Each one exits 6 with
INTEGRITY naming the edited position, prints that one error message (and its
detail lines) on stderr and nothing else — no traceback, no "closed database", no
log line — and the writing commands append nothing. ``audit verify`` reports the
row as a problem at its position and still runs the byte checks over it.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from ledger.log.db import open_database
from tests.conftest import Server
from tests.rules.test_r22_export_damaged import edit_sqlite_log
from tests.rules.test_r28_view_tampering import _bindings
from tests.support.cli_inprocess import cli, cli_json
from tests.support.lifecycle_support import World

_CLOCK = 1_900_000_000.0

#: case -> the SQL editing the row at ``{p}`` (SQLite).
SQLITE_CASES: dict[str, str] = {
    "empty_state": "UPDATE ledger_events SET state = X'' WHERE position = {p}",
    "truncated_state": "UPDATE ledger_events SET state = substr(state, 1, 20) WHERE position = {p}",
    "non_json_state": "UPDATE ledger_events SET state = X'ff00fe' WHERE position = {p}",
    "json_array_state": "UPDATE ledger_events SET state = CAST('[1]' AS BLOB) WHERE position = {p}",
    "field_of_wrong_type": (
        "UPDATE ledger_events SET state = "
        "CAST(json_set(CAST(state AS TEXT), '$.timestamp', 5) AS BLOB) WHERE position = {p}"
    ),
    "state_stored_as_text": (
        "UPDATE ledger_events SET state = CAST(state AS TEXT) WHERE position = {p}"
    ),
    "state_stored_as_integer": "UPDATE ledger_events SET state = 5 WHERE position = {p}",
    "topic_stored_as_text": (
        "UPDATE ledger_events SET topic = CAST(topic AS TEXT) WHERE position = {p}"
    ),
    "null_state": "UPDATE ledger_events SET state = NULL WHERE position = {p}",
}
#: The edits MariaDB's column types allow (binary and NOT NULL: no TEXT, no NULL).
MARIADB_CASES: dict[str, str] = {
    "empty_state": "UPDATE ledger_events SET state = '' WHERE position = {p}",
    "truncated_state": "UPDATE ledger_events SET state = LEFT(state, 20) WHERE position = {p}",
    "non_json_state": "UPDATE ledger_events SET state = 0xff00fe WHERE position = {p}",
    "json_array_state": "UPDATE ledger_events SET state = '[1]' WHERE position = {p}",
    "field_of_wrong_type": (
        "UPDATE ledger_events SET state = "
        "JSON_SET(CAST(state AS CHAR), '$.timestamp', 5) WHERE position = {p}"
    ),
}
#: command -> the type of the row it is given tampered (the first row of it), its arguments.
COMMANDS: dict[str, tuple[str, list[str]]] = {
    "audit verify": ("generation.prepared@1", ["audit", "verify"]),
    "history --pack": ("generation.prepared@1", ["history", "--pack", "alpha"]),
    "history --audience": ("binding.granted@1", ["history", "--audience", "app:one"]),
    "log": ("generation.prepared@1", ["log"]),
    "projections rebuild": ("generation.prepared@1", ["projections", "rebuild"]),
    "apply": ("generation.prepared@1", ["apply", "{manifest}", "--wait", "0"]),
    "publish": ("catalog.published@2", ["publish"]),
    "view": ("audience_view.published@1", ["view", "app:one"]),
}


@dataclass
class Base:
    """The untampered store: where each type's first row is, and the next release."""

    url: str
    positions: dict[str, int]
    manifest: Path
    copy: Callable[[], AbstractContextManager[str]]


def _build(tmp: Path, url: str) -> tuple[dict[str, int], Path]:
    world = World(tmp, url, holder="t", clock=lambda: _CLOCK, lease_wait=0.0)
    try:
        bindings = _bindings({"app:one": ["alpha"]})
        world.service.apply(
            world.manifest([world.official("alpha", world.commit("alpha", 1))], bindings)
        )
        nxt = world.manifest([world.official("alpha", world.commit("alpha", 2))], bindings)
        with world.db.read() as conn:
            rows = conn.execute(
                sa.text("SELECT position, topic FROM ledger_events ORDER BY position")
            )
            positions: dict[str, int] = {}
            for position, topic in rows:
                positions.setdefault(bytes(topic).decode(), int(position))
    finally:
        world.close()
    assert cli("--db", url, "audit", "verify").code == 0  # the base is clean
    return positions, nxt


@pytest.fixture(scope="module")
def sqlite_base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    tmp = tmp_path_factory.mktemp("tampered-sqlite")
    source = tmp / "base.db"
    positions, manifest = _build(tmp, f"sqlite:///{source}")
    copies = iter(range(1, 10**6))

    @contextmanager
    def copy() -> Iterator[str]:
        path = tmp / f"copy-{next(copies)}.db"
        shutil.copyfile(source, path)
        try:
            yield f"sqlite:///{path}"
        finally:
            for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                leftover.unlink(missing_ok=True)

    return Base(f"sqlite:///{source}", positions, manifest, copy)


@pytest.fixture(scope="module")
def mariadb_base(tmp_path_factory: pytest.TempPathFactory, mysql_server: Server) -> Iterator[Base]:
    """One store, edited in place and put back after each case (every command refuses
    a tampered row and writes nothing, which each case asserts; a copy per case costs
    a second on MariaDB)."""
    tmp = tmp_path_factory.mktemp("tampered-mariadb")
    with mysql_server.scratch() as url:
        positions, manifest = _build(tmp, url)
        columns = "position, aggregate_id, version, topic, state, event_id, chain"
        db = open_database(url, create=False)
        with db.read() as conn:
            saved = conn.exec_driver_sql(f"SELECT {columns} FROM ledger_events").all()

        @contextmanager
        def copy() -> Iterator[str]:
            try:
                yield url
            finally:
                with db.write() as conn:
                    conn.exec_driver_sql("DELETE FROM ledger_events")
                    conn.exec_driver_sql(
                        f"INSERT INTO ledger_events ({columns}) VALUES "
                        "(%s, %s, %s, %s, %s, %s, %s)",
                        [tuple(r) for r in saved],
                    )

        try:
            yield Base(url, positions, manifest, copy)
        finally:
            db.close()


def _edit_sqlite(url: str, sql: str) -> None:
    edit_sqlite_log(Path(url.removeprefix("sqlite:///")), sql)


def _edit_mariadb(url: str, sql: str) -> None:
    db = open_database(url, create=False)
    try:
        with db.write() as conn:
            assert conn.execute(sa.text(sql)).rowcount == 1
    finally:
        db.close()


def _head(url: str) -> int:
    db = open_database(url, create=False)
    try:
        with db.read() as conn:
            return int(conn.execute(sa.text("SELECT position FROM ledger_head")).scalar_one())
    finally:
        db.close()


def _check(base: Base, command: str, case: str, sql: str, edit: Callable[[str, str], None]) -> None:
    """Edit the row ``command`` reads, run ``command`` (--json, then human): INTEGRITY
    naming the position, one message on stderr, nothing appended."""
    topic, args = COMMANDS[command]
    position = base.positions[topic]
    argv = [a.replace("{manifest}", str(base.manifest)) for a in args]
    with base.copy() as url:
        edit(url, sql.format(p=position))
        head = _head(url)
        code, error = cli_json("--db", url, *argv)
        assert (code, error["error"]) == (6, "INTEGRITY"), error
        if command == "audit verify":
            _check_audit(error["details"], position, case)
        else:
            assert error["details"]["position"] == position, error
            assert f"position {position}" in error["message"], error
        human = cli("--db", url, *argv)
        assert (human.code, human.stdout) == (6, ""), human
        lines = human.stderr.splitlines()
        assert lines[0] == f"error [INTEGRITY]: {error['message']}", human.stderr
        assert all(line.startswith("  ") for line in lines[1:]), human.stderr  # details only
        assert "closed database" not in human.stderr and "Traceback" not in human.stderr
        assert _head(url) == head  # nothing appended (apply, publish) or swapped in


def _check_audit(details: dict[str, Any], position: int, case: str) -> None:
    """The row is a problem at its position, and the byte checks ran over it."""
    problems = details["problems"]
    assert isinstance(problems, list)
    first = details["first_problem"]
    assert isinstance(first, dict) and first["position"] == position, details
    at = {p["check"] for p in problems if p["position"] == position}
    assert {"event_id", "chain"} <= set(details["checks"])
    # The views' replay reads the row too: where it cannot decode it, that is a problem
    # of the views check at the same position (not a crash).
    if case == "field_of_wrong_type":
        assert at == {"event_id"}, problems  # valid JSON: its bytes betray it
    elif case == "state_stored_as_text":
        assert at == {"stored", "views"}, problems  # the same bytes: id and chain hold
        assert first["message"] == "state is stored as TEXT, not bytes (state_b64 holds its bytes)"
    elif case == "topic_stored_as_text":
        # The same bytes again; the views' replay filters topics in SQL, where TEXT is
        # not the BLOB it is compared with: it never sees the row, and its views differ.
        assert at == {"stored"}, problems
        assert str(first["message"]).startswith("topic is stored as TEXT, not bytes"), first
        assert any(p["check"] == "views" and p["position"] is None for p in problems)
    else:
        assert at == {"stored", "event_id", "views"}, problems  # damaged, and tampered


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("case", sorted(SQLITE_CASES))
def test_r28_a_tampered_log_row_is_integrity_naming_its_position_sqlite(
    sqlite_base: Base, command: str, case: str
) -> None:
    _check(sqlite_base, command, case, SQLITE_CASES[case], _edit_sqlite)


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("case", sorted(MARIADB_CASES))
def test_r28_a_tampered_log_row_is_integrity_naming_its_position_mariadb(
    mariadb_base: Base, command: str, case: str
) -> None:
    _check(mariadb_base, command, case, MARIADB_CASES[case], _edit_mariadb)


def test_r28_the_untampered_copies_pass_every_command(sqlite_base: Base) -> None:
    """The baseline: on an unedited copy each command succeeds (so the failures above are
    the edits' doing), and apply and publish have work to do."""
    for command, (_, args) in sorted(COMMANDS.items()):
        argv = [a.replace("{manifest}", str(sqlite_base.manifest)) for a in args]
        with sqlite_base.copy() as url:
            head = _head(url)
            result = cli("--db", url, *argv, "--json")
            assert result.code == 0, (command, result.stdout, result.stderr)
            json.loads(result.stdout)
            if command == "apply":
                assert _head(url) > head


#: case -> the edit of every ``view_pack_component`` row, what the error's details name.
VIEW_CELL_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "fact_stored_as_text": (
        "UPDATE view_pack_component SET fact = CAST(fact AS TEXT)",
        {"pack": "alpha", "kind": "callout_profile", "key": "erp"},
    ),
    "fact_stored_as_integer": (
        "UPDATE view_pack_component SET fact = 7",
        {"pack": "alpha", "kind": "callout_profile", "key": "erp"},
    ),
    # Random digest bytes as TEXT are not UTF-8: the driver refuses to read the cell.
    "fact_digest_stored_as_text": (
        "UPDATE view_pack_component SET fact_digest = CAST(fact_digest AS TEXT)",
        {"column": "fact_digest"},
    ),
}


@pytest.mark.parametrize("case", sorted(VIEW_CELL_CASES))
def test_r28_a_fact_cell_of_another_type_is_integrity_for_view(
    sqlite_base: Base, case: str
) -> None:
    sql, named = VIEW_CELL_CASES[case]
    with sqlite_base.copy() as url:
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            assert conn.execute(sql).rowcount >= 1
            conn.commit()
        finally:
            conn.close()
        code, error = cli_json("--db", url, "view", "app:one")
        assert (code, error["error"]) == (6, "INTEGRITY"), error
        assert named.items() <= error["details"].items(), error
        human = cli("--db", url, "view", "app:one")
        assert (human.code, human.stdout) == (6, "")
        lines = human.stderr.splitlines()
        assert lines[0] == f"error [INTEGRITY]: {error['message']}", human.stderr
        assert all(line.startswith("  ") for line in lines[1:]), human.stderr
