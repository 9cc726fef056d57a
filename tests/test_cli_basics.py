"""CLI basics: init/log on both engines, exit codes, the --json error shape, no tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.log.application import LedgerApplication
from ledger.log.db import open_database
from tests.cli_support import run_cli
from tests.support import Note


def test_r22_init_is_idempotent_and_log_shows_chain(engine_url: str, tmp_path: Path) -> None:
    first = run_cli("--db", engine_url, "init", "--json")
    assert first.code == 0, first.stdout + first.stderr
    assert first.json()["created"] is True
    assert first.json()["schema_version"] == 2
    again = run_cli("--db", engine_url, "init", "--json")
    assert again.code == 0 and again.json()["created"] is False

    db = open_database(engine_url)
    app = LedgerApplication(db)
    note = Note(name="n")
    note.write(text="t")
    app.save(note)
    db.close()

    shown = run_cli("--db", engine_url, "log", "--json")
    assert shown.code == 0
    doc = shown.json()
    assert doc["head"]["position"] == 2
    assert [e["position"] for e in doc["events"]] == [1, 2]
    assert doc["events"][1]["chain"] == doc["head"]["chain"]
    assert doc["events"][0]["aggregate_id"] == str(note.id)
    assert len(bytes.fromhex(doc["events"][0]["event_id"])) == 32

    window = run_cli("--db", engine_url, "log", "--from", "2", "--limit", "1", "--json").json()
    assert [e["position"] for e in window["events"]] == [2]
    human = run_cli("--db", engine_url, "log")
    assert human.code == 0 and "test.note_written@1" in human.stdout


def test_default_db_is_catalog_db_in_working_directory(tmp_path: Path) -> None:
    result = run_cli("init", cwd=tmp_path)
    assert result.code == 0
    assert (tmp_path / "catalog.db").exists()
    via_env = run_cli(
        "init",
        "--json",
        cwd=tmp_path,
        env={"CATALOG_LEDGER_DB": f"sqlite:///{tmp_path / 'env.db'}"},
    )
    assert via_env.code == 0 and (tmp_path / "env.db").exists()


@pytest.mark.parametrize(
    ("url", "code", "error"),
    [
        ("mysql+pymysql://root@127.0.0.1:1/test", 1, "UNAVAILABLE"),
        ("not a url at all", 3, "INVALID"),
        ("postgresql://u@localhost/x", 3, "INVALID"),
        ("sqlite://", 3, "INVALID"),
        ("sqlite:////proc/catalog.db", 1, "UNAVAILABLE"),
        ("sqlite:////no/such/dir/catalog.db", 1, "UNAVAILABLE"),
    ],
)
def test_unusable_store_gives_typed_error_without_traceback(
    url: str, code: int, error: str
) -> None:
    result = run_cli("--db", url, "init", "--json")
    assert result.code == code
    doc = result.json()
    assert doc["error"] == error
    assert set(doc) == {"error", "message", "details"}
    human = run_cli("--db", url, "init")
    assert human.code == code
    assert f"error [{error}]" in human.stderr


def test_non_database_file_is_invalid_input(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("this is not a database\n" * 100)
    result = run_cli("--db", f"sqlite:///{path}", "log", "--json")
    assert result.code == 3
    assert result.json()["details"]["field"] == "db"
    assert path.read_text().startswith("this is not a database")


def test_log_on_uninitialized_store_says_run_init(tmp_path: Path) -> None:
    result = run_cli("--db", f"sqlite:///{tmp_path / 'fresh.db'}", "log", "--json")
    assert result.code == 3
    assert "catalog-ledger init" in result.json()["message"]


@pytest.mark.parametrize(
    "args",
    [
        ["log", "--from", "0", "--json"],
        ["log", "--limit", "x", "--json"],
        ["nosuch", "--json"],
        ["log", "--json", "--bogus"],
    ],
)
def test_usage_errors_exit_2_with_json_shape(args: list[str], tmp_path: Path) -> None:
    result = run_cli("--db", f"sqlite:///{tmp_path / 'x.db'}", *args)
    assert result.code == 2
    assert result.json()["error"] == "USAGE"


def test_help_everywhere() -> None:
    for args in (["--help"], ["init", "--help"], ["log", "--help"], ["schema", "dump", "--help"]):
        result = run_cli(*args)
        assert result.code == 0 and "Usage:" in result.stdout
