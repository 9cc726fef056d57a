"""R22 / R23 (issue 24.3): ``export`` of a damaged store writes every row as stored and exits 6.

For forensics an export must not stop at the first damaged row, nor hide it:
every row is written (the damaged one as stored, with a ``damage`` object naming
the column), then the trailer (so the file is complete), and the command exits 6
with INTEGRITY naming the first damaged position and column — one error
message, no traceback, nothing else on stderr. Each case edits one row of a
real store by hand (``sqlite3`` on SQLite; SQL on MariaDB where the column type
allows the edit) and compares the export with the one taken before the edit:
every other line is byte for byte the same.
"""

from __future__ import annotations

import base64
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from ledger.log.db import open_database
from tests.support.cli_inprocess import cli, cli_json
from tests.support.lifecycle_support import World

#: The damaged row: generation.prepared@1, a known type with a JSON object state.
DAMAGED = 3

Line = dict[str, Any]
#: case -> (SQL editing position 3, column named, message fragment, what the line holds)
Case = tuple[str, str, str, Callable[[Line, Line], bool]]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _state(line: Line) -> bytes:
    return base64.b64decode(line["state_b64"])


SQLITE_CASES: dict[str, Case] = {
    "empty_state": (
        "UPDATE ledger_events SET state = X'' WHERE position = 3",
        "state",
        "is empty",
        lambda got, was: (got["state_b64"], got["state_hex"], got["state"]) == ("", "", None),
    ),
    "truncated_state": (
        "UPDATE ledger_events SET state = substr(state, 1, 20) WHERE position = 3",
        "state",
        "is not JSON",
        lambda got, was: (
            _state(got) == _state(was)[:20] and got["state_hex"] == _state(was)[:20].hex()
        ),
    ),
    "non_json_state": (
        "UPDATE ledger_events SET state = X'ff00fe' WHERE position = 3",
        "state",
        "is not JSON",
        lambda got, was: (got["state_b64"], got["state_hex"]) == (_b64(b"\xff\x00\xfe"), "ff00fe"),
    ),
    "json_array_state": (
        "UPDATE ledger_events SET state = CAST('[1]' AS BLOB) WHERE position = 3",
        "state",
        "is JSON but not an object",
        lambda got, was: got["state"] == [1],
    ),
    "state_stored_as_text": (
        "UPDATE ledger_events SET state = CAST(state AS TEXT) WHERE position = 3",
        "state",
        "is stored as TEXT, not bytes",
        lambda got, was: (got["state_b64"], got["state"]) == (was["state_b64"], was["state"]),
    ),
    "version_stored_as_text": (
        "UPDATE ledger_events SET version = 'one' WHERE position = 3",
        "version",
        "is stored as TEXT, not an integer (stored hex 6f6e65)",
        lambda got, was: got["version"] == "one",
    ),
    "event_id_stored_as_text": (
        "UPDATE ledger_events SET event_id = CAST(event_id AS TEXT) WHERE position = 3",
        "event_id",
        "is stored as TEXT, not bytes (stored hex ",  # random bytes: not UTF-8 text
        lambda got, was: isinstance(got["event_id"], str),
    ),
    "event_id_stored_as_integer": (
        "UPDATE ledger_events SET event_id = 5 WHERE position = 3",
        "event_id",
        "is stored as an INTEGER, not bytes",
        lambda got, was: got["event_id"] == 5,
    ),
    "short_chain": (
        "UPDATE ledger_events SET chain = X'01' WHERE position = 3",
        "chain",
        "is 1 bytes, not 32 (shown in hex)",
        lambda got, was: got["chain"] == "01",
    ),
    "aggregate_id_stored_as_text": (
        "UPDATE ledger_events SET aggregate_id = 'agg' WHERE position = 3",
        "aggregate_id",
        "is stored as TEXT, not bytes (stored hex 616767)",
        lambda got, was: got["aggregate_id"] == "agg",
    ),
    "topic_not_utf8": (
        "UPDATE ledger_events SET topic = X'67656effff' WHERE position = 3",
        "topic",
        "is not UTF-8 (shown with U+FFFD; stored hex 67656effff)",
        lambda got, was: got["topic"] == "gen\ufffd\ufffd" and got["type"] is None,
    ),
    "version_zero": (
        "UPDATE ledger_events SET version = 0 WHERE position = 3",
        "version",
        "is 0, not a version (>= 1)",
        lambda got, was: got["version"] == 0,
    ),
    "null_state": (
        "UPDATE ledger_events SET state = NULL WHERE position = 3",
        "state",
        "is stored as NULL, not bytes",
        lambda got, was: (got["state_b64"], got["state"]) == (None, None),
    ),
}
MARIADB_CASES: dict[str, Case] = {
    "empty_state": (
        "UPDATE ledger_events SET state = '' WHERE position = 3",
        *SQLITE_CASES["empty_state"][1:],
    ),
    "truncated_state": (
        "UPDATE ledger_events SET state = LEFT(state, 20) WHERE position = 3",
        *SQLITE_CASES["truncated_state"][1:],
    ),
    "non_json_state": (
        "UPDATE ledger_events SET state = 0xff00fe WHERE position = 3",
        *SQLITE_CASES["non_json_state"][1:],
    ),
    "short_chain": (
        "UPDATE ledger_events SET chain = 0x01 WHERE position = 3",
        *SQLITE_CASES["short_chain"][1:],
    ),
    "version_zero": SQLITE_CASES["version_zero"],
    "short_aggregate_id": (
        "UPDATE ledger_events SET aggregate_id = 0x0102 WHERE position = 3",
        "aggregate_id",
        "is 2 bytes, not 16 (shown in hex)",
        lambda got, was: got["aggregate_id"] == "0102",
    ),
}


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    """A small SQLite store (one pack installed) and its export before any edit."""
    folder = tmp_path_factory.mktemp("healthy")
    url = f"sqlite:///{folder / 'store.db'}"
    world = World(folder, url)
    try:
        world.apply(world.official("sales", world.commit("sales", 1)))
    finally:
        world.close()
    lines = _exported(url, folder / "export.jsonl")
    assert json.loads(lines[DAMAGED - 1])["type"] == "generation.prepared"
    return folder / "store.db", lines


def _exported(url: str, out: Path) -> list[bytes]:
    result = cli("--db", url, "export", "--jsonl", "--out", str(out))
    assert result.code == 0, result.stderr
    return out.read_bytes().splitlines(keepends=True)


def edit_sqlite_log(path: Path, sql: str) -> None:
    """Run one hand edit of a ``ledger_events`` row (a NULL one drops NOT NULL first)."""
    conn = sqlite3.connect(path)
    try:
        if "NULL" in sql:  # NOT NULL forbids it: drop the constraint as a hand edit would
            conn.execute("PRAGMA writable_schema = ON")
            (ddl,) = conn.execute(
                "SELECT sql FROM sqlite_master WHERE name = 'ledger_events'"
            ).fetchone()
            assert "state BLOB NOT NULL" in ddl
            conn.execute(
                "UPDATE sqlite_master SET sql = ? WHERE name = 'ledger_events'",
                (ddl.replace("state BLOB NOT NULL", "state BLOB"),),
            )
            conn.commit()
            conn.close()
            conn = sqlite3.connect(path)
        assert conn.execute(sql).rowcount == 1
        conn.commit()
    finally:
        conn.close()


def _check_damaged_export(url: str, tmp_path: Path, before: list[bytes], case: Case) -> list[bytes]:
    """Export the edited store twice (--json, then human): exit 6 naming position 3 and the
    column; the file holds every row, the others byte for byte as before, and the trailer."""
    _, column, says, holds = case
    out = tmp_path / "damaged.jsonl"
    code, error = cli_json("--db", url, "export", "--jsonl", "--out", str(out))
    events = len(before) - 1
    assert (code, error["error"]) == (6, "INTEGRITY"), error
    assert error["details"] == {
        "position": DAMAGED,
        "field": column,
        "check": "stored",
        "damaged": 1,
        "events": events,
        "out": str(out),
    }, error
    assert error["message"].startswith(f"position {DAMAGED}: {column} {says}"), error
    human = cli("--db", url, "export", "--jsonl", "--out", str(out))
    assert (human.code, human.stdout) == (6, "")
    stderr = human.stderr.splitlines()
    assert stderr[0] == f"error [INTEGRITY]: {error['message']}", human.stderr
    assert all(line.startswith("  ") for line in stderr[1:]), human.stderr  # its details only
    lines = out.read_bytes().splitlines(keepends=True)
    assert len(lines) == len(before)
    for number, (got, was) in enumerate(zip(lines, before, strict=True), start=1):
        if number != DAMAGED and number != len(lines):
            assert got == was, number
    line, was = json.loads(lines[DAMAGED - 1]), json.loads(before[DAMAGED - 1])
    assert line["position"] == DAMAGED and list(line["damage"]) == [column], line
    assert line["damage"][column].startswith(says), line
    assert holds(line, was), line
    trailer, healthy_trailer = json.loads(lines[-1]), json.loads(before[-1])
    expected_root = None if column == "event_id" else healthy_trailer["root"]
    assert trailer == {**healthy_trailer, "damaged": 1, "root": expected_root}, trailer
    return lines


@pytest.mark.parametrize("case", sorted(SQLITE_CASES))
def test_r22_export_of_a_damaged_sqlite_store_writes_every_row_verbatim_and_exits_6(
    healthy: tuple[Path, list[bytes]], tmp_path: Path, case: str
) -> None:
    source, before = healthy
    path = tmp_path / "store.db"
    shutil.copy(source, path)
    edit_sqlite_log(path, SQLITE_CASES[case][0])
    _check_damaged_export(f"sqlite:///{path}", tmp_path, before, SQLITE_CASES[case])


@pytest.mark.parametrize("engine_url", ["mariadb"], indirect=True)
def test_r22_export_of_a_damaged_mariadb_store_writes_every_row_verbatim_and_exits_6(
    world: World, tmp_path: Path
) -> None:
    """Every edit the MariaDB column types allow (the columns are binary and NOT NULL, so
    no TEXT and no NULL), one after the other on one store, each undone after its export."""
    world.apply(world.official("sales", world.commit("sales", 1)))
    before = _exported(world.url, tmp_path / "before.jsonl")
    db = open_database(world.url, create=False)
    try:
        with db.read() as conn:
            stored = conn.execute(
                sa.text(
                    "SELECT aggregate_id, version, state, chain FROM ledger_events "
                    "WHERE position = 3"
                )
            ).one()
        for name, case in sorted(MARIADB_CASES.items()):
            with db.write() as conn:
                assert conn.execute(sa.text(case[0])).rowcount == 1, name
            _check_damaged_export(world.url, tmp_path, before, case)
            with db.write() as conn:
                conn.execute(
                    sa.text(
                        "UPDATE ledger_events SET aggregate_id = :a, version = :v, state = :s, "
                        "chain = :c WHERE position = 3"
                    ),
                    {"a": stored[0], "v": stored[1], "s": stored[2], "c": stored[3]},
                )
    finally:
        db.close()
    assert _exported(world.url, tmp_path / "after.jsonl") == before  # undone: exit 0 again


def test_r22_a_damaged_export_to_stdout_is_complete_and_import_refuses_it(
    healthy: tuple[Path, list[bytes]], tmp_path: Path
) -> None:
    source, before = healthy
    path = tmp_path / "store.db"
    shutil.copy(source, path)
    edit_sqlite_log(path, SQLITE_CASES["truncated_state"][0])
    url = f"sqlite:///{path}"
    result = cli("--db", url, "export", "--jsonl")
    assert result.code == 6
    lines = result.stdout.encode().splitlines(keepends=True)
    assert len(lines) == len(before) and json.loads(lines[-1])["damaged"] == 1
    assert result.stderr.startswith(f"error [INTEGRITY]: position {DAMAGED}: state is not JSON")
    out = tmp_path / "damaged.jsonl"
    out.write_bytes(result.stdout.encode())
    target = f"sqlite:///{tmp_path / 'target.db'}"
    assert cli("--db", target, "init").code == 0
    code, refused = cli_json("--db", target, "import", "--jsonl", str(out), "--workers", "1")
    assert (code, refused["error"], refused["details"]) == (
        6,
        "INTEGRITY",
        {"line": DAMAGED, "position": DAMAGED, "check": "event_id"},
    ), refused


def test_r24_export_of_a_store_whose_head_row_is_damaged_is_refused_naming_it(
    healthy: tuple[Path, list[bytes]], tmp_path: Path
) -> None:
    """A head row stored as another type is refused like every head disagreement (R24):
    INTEGRITY naming ledger_head, with the repair to run; nothing is written."""
    source, _ = healthy
    path = tmp_path / "store.db"
    shutil.copy(source, path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE ledger_head SET chain = CAST(chain AS TEXT)")
    conn.commit()
    conn.close()
    out = tmp_path / "export.jsonl"
    code, error = cli_json("--db", f"sqlite:///{path}", "export", "--jsonl", "--out", str(out))
    assert (code, error["error"]) == (6, "INTEGRITY"), error
    (difference,) = error["details"]["differences"]
    assert (difference["object"], difference["safe"]) == ("ledger_head", False), error
    assert "doctor --repair" in difference["found"], error
    assert not out.exists() or out.read_bytes() == b""
