"""The library's settings cannot change what is stored or how it is read (R23, R22).

``eventsourcing`` configures applications from the process environment and builds
mappers with ``InfrastructureFactory.mapper()``. The log format v1 is fixed
(``schema/LOG-FORMAT.md``): the mapper is buildable the library's way, refuses a
compressor or cipher (either would change the stored bytes), and snapshotting and the
aggregate cache stay off whatever the environment says.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from eventsourcing.compressor import ZlibCompressor
from eventsourcing.utils import Environment

from domain.errors import InvalidInput
from ledger.log.application import LedgerApplication, LedgerFactory
from ledger.log.db import Database, open_database
from ledger.log.mapper import LogMapper
from ledger.log.recorder import LedgerRecorder
from ledger.log.transcoder import OrjsonTranscoder
from ledger.store.follow import LedgerLog
from ledger.store.init import init_store
from tests.support.notes import Note

CIPHER_KEY = "m3Rm0xMu3GYxAWnU8/ZGdSHnFBZaGGhXjtqUP3+WZ6o="  # a random AES-256 key, base64


@pytest.fixture
def sqlite_db(sqlite_url: str) -> Iterator[Database]:
    """One engine is enough where the database is not the point (the mapper's bytes)."""
    database = open_database(sqlite_url)
    init_store(database)
    yield database
    database.close()


def _factory(db: Database, env: dict[str, str]) -> LedgerFactory:
    return LedgerFactory(Environment("CatalogLedger", env), LedgerRecorder(db))


def _note_events() -> list[object]:
    note = Note(name="n é")
    note.write(text="line 1")
    return list(note.collect_events())


def test_r23_factory_builds_the_log_mapper_with_identical_stored_bytes(
    sqlite_db: Database,
) -> None:
    db = sqlite_db
    direct = LogMapper(OrjsonTranscoder())
    for built in (
        _factory(db, {}).mapper(transcoder=OrjsonTranscoder(), mapper_class=LogMapper),
        _factory(db, {"MAPPER_TOPIC": "ledger.log.mapper:LogMapper"}).mapper(
            transcoder=OrjsonTranscoder()
        ),
    ):
        assert type(built) is LogMapper
        for event in _note_events():
            stored, expected = built.to_stored_event(event), direct.to_stored_event(event)  # type: ignore[arg-type]
            assert (stored.topic, stored.state) == (expected.topic, expected.state)
            assert stored.topic.startswith("test.note_")
            assert built.to_domain_event(stored) == event


@pytest.mark.parametrize(
    ("env", "field", "setting"),
    [
        (
            {"COMPRESSOR_TOPIC": "eventsourcing.compressor:ZlibCompressor"},
            "compressor",
            "COMPRESSOR_TOPIC",
        ),
        ({"CIPHER_KEY": CIPHER_KEY}, "cipher", "CIPHER_TOPIC or CIPHER_KEY"),
        (
            {"CIPHER_TOPIC": "eventsourcing.cipher:AESCipher", "CIPHER_KEY": CIPHER_KEY},
            "cipher",
            "CIPHER_TOPIC or CIPHER_KEY",
        ),
    ],
)
def test_r23_factory_mapper_with_compressor_or_cipher_is_refused_naming_it(
    sqlite_db: Database, env: dict[str, str], field: str, setting: str
) -> None:
    with pytest.raises(InvalidInput) as info:
        _factory(sqlite_db, env).mapper(transcoder=OrjsonTranscoder(), mapper_class=LogMapper)
    assert (info.value.exit_code, info.value.field) == (3, field)
    assert "log format v1" in info.value.message
    assert f"unset {setting}" in info.value.message


def test_r23_log_mapper_refuses_a_compressor_given_directly() -> None:
    with pytest.raises(InvalidInput) as info:
        LogMapper(OrjsonTranscoder(), compressor=ZlibCompressor())
    assert info.value.details == {"field": "compressor", "given": "ZlibCompressor"}


def test_r23_follower_given_a_cipher_in_env_is_refused_before_reading(
    db: Database, engine_url: str
) -> None:
    with pytest.raises(InvalidInput) as info:
        LedgerLog({"CATALOG_LEDGER_DB": engine_url, "CIPHER_KEY": CIPHER_KEY})
    assert info.value.field == "cipher"


def test_r23_cipher_and_compressor_in_the_process_environment_change_nothing(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger's own application reads no library setting from ``os.environ``: the
    stored state stays the canonical, uncompressed, unencrypted JSON of log format v1."""
    monkeypatch.setenv("CIPHER_KEY", CIPHER_KEY)
    monkeypatch.setenv("COMPRESSOR_TOPIC", "eventsourcing.compressor:ZlibCompressor")
    LedgerApplication(db).save(Note(name="plain"))
    (row,) = LedgerRecorder(db).iter_rows()
    state = orjson.loads(row.state)
    assert state["name"] == "plain"
    assert row.state == OrjsonTranscoder().encode(state)


@pytest.mark.parametrize(
    "variable", ["IS_SNAPSHOTTING_ENABLED", "CATALOGLEDGER_IS_SNAPSHOTTING_ENABLED"]
)
def test_r22_snapshotting_in_the_environment_is_pinned_off(
    db: Database, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "y")
    monkeypatch.setenv("AGGREGATE_CACHE_MAXSIZE", "100")
    app = LedgerApplication(db)
    note = Note(name="n")
    for line in range(3):
        note.write(text=f"line {line}")
    app.save(note)
    assert app.snapshots is None
    assert app.repository.cache is None
    got: Note = app.repository.get(note.id)
    assert (got.version, got.lines) == (4, ["line 0", "line 1", "line 2"])


def test_r22_snapshotting_asked_for_in_env_is_pinned_off(db: Database, engine_url: str) -> None:
    app = LedgerApplication(db)
    note = Note(name="n")
    note.write(text="x")
    app.save(note)
    follower = LedgerLog(
        {
            "CATALOG_LEDGER_DB": engine_url,
            "IS_SNAPSHOTTING_ENABLED": "y",
            "CATALOGLEDGER_IS_SNAPSHOTTING_ENABLED": "y",
        }
    )
    try:
        assert follower.snapshots is None
        got: Note = follower.repository.get(note.id)
        assert (got.version, got.lines) == (2, ["x"])
    finally:
        follower.close()


def test_r22_pinned_settings_are_documented_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "IS_SNAPSHOTTING_ENABLED" in readme
    assert "COMPRESSOR_TOPIC" in readme
