"""The log (DESIGN "The log", R11, R22) on SQLite and MariaDB: chain, fence, races."""

from __future__ import annotations

import multiprocessing
from uuid import UUID, uuid4

import pytest
import sqlalchemy as sa

from domain.errors import Conflict
from domain.log import first_chain_break
from ledger.log import tables as schema
from ledger.log.application import LedgerApplication
from ledger.log.db import Database, open_database
from ledger.log.recorder import LedgerRecorder
from tests.support.notes import Note


def _write_notes(db: Database, notes: int, lines: int) -> list[UUID]:
    app = LedgerApplication(db)
    ids = []
    for n in range(notes):
        note = Note(name=f"note-{n}")
        for line in range(lines):
            note.write(text=f"line {line} é")
        app.save(note)
        ids.append(note.id)
    return ids


def test_r22_stored_rows_recompute_to_stored_event_id_and_chain(db: Database) -> None:
    _write_notes(db, notes=5, lines=3)
    rows = list(LedgerRecorder(db).iter_rows())
    assert [r.position for r in rows] == list(range(1, 21))
    assert first_chain_break(rows) is None
    assert LedgerRecorder(db).head().chain == rows[-1].chain


@pytest.mark.parametrize("position", [1, 7, 20])
def test_r22_one_changed_state_byte_detected_at_its_position(db: Database, position: int) -> None:
    _write_notes(db, notes=5, lines=3)
    ev = schema.events
    with db.write() as conn:
        state = conn.execute(sa.select(ev.c.state).where(ev.c.position == position)).scalar_one()
        tampered = bytes(state[:-2]) + bytes([state[-2] ^ 0x01]) + bytes(state[-1:])
        conn.execute(ev.update().where(ev.c.position == position).values(state=tampered))
    broken = first_chain_break(LedgerRecorder(db).iter_rows())
    assert broken is not None
    assert broken.position == position
    assert "event_id" in broken.problem


def test_r22_repository_reads_back_what_was_appended(db: Database) -> None:
    (note_id,) = _write_notes(db, notes=1, lines=4)
    note: Note = LedgerApplication(db).repository.get(note_id)
    assert isinstance(note, Note)
    assert note.lines == [f"line {i} é" for i in range(4)]
    assert note.version == 5


def test_r11_racing_writers_on_same_version_exactly_one_wins(db: Database) -> None:
    app = LedgerApplication(db)
    note = Note(name="race")
    app.save(note)
    first: Note = app.repository.get(note.id)
    second: Note = app.repository.get(note.id)
    first.write(text="first")
    second.write(text="second")
    app.save(first)
    with pytest.raises(Conflict):
        app.save(second)
    final: Note = app.repository.get(note.id)
    assert final.lines == ["first"]
    assert LedgerRecorder(db).head().position == 2


def test_r11_read_fence_violation_rejected_and_nothing_written(db: Database) -> None:
    app = LedgerApplication(db)
    watched = Note(name="watched")
    app.save(watched)
    decision_basis = watched.version  # a command reads `watched` at this version ...
    moved: Note = app.repository.get(watched.id)
    moved.write(text="moved meanwhile")
    app.save(moved)  # ... someone else moves it ...
    other = Note(name="written on stale state")
    head_before = LedgerRecorder(db).head()
    with pytest.raises(Conflict) as info:
        app.save(other, fence={watched.id: decision_basis})
    assert info.value.details["expected_version"] == 1
    assert info.value.details["found_version"] == 2
    assert LedgerRecorder(db).head() == head_before
    assert other.id not in app.repository


def test_r11_read_fence_of_unchanged_state_commits(db: Database) -> None:
    app = LedgerApplication(db)
    watched = Note(name="watched")
    app.save(watched)
    other = Note(name="written on fresh state")
    app.save(other, fence={watched.id: watched.version, uuid4(): 0})
    assert other.id in app.repository


def test_r11_precommit_check_runs_inside_the_locked_append(db: Database) -> None:
    app = LedgerApplication(db)
    seen: list[int] = []

    def precommit(conn: sa.Connection) -> None:
        seen.append(LedgerRecorder(db).head_in(conn).position)
        raise Conflict("terminal check rejected")

    with pytest.raises(Conflict):
        app.save(Note(name="x"), precommit=precommit)
    assert seen == [0]
    assert LedgerRecorder(db).head().position == 0


def _append_worker(url: str, worker: int, count: int) -> None:
    database = open_database(url)
    app = LedgerApplication(database)
    for i in range(count):
        app.save(Note(name=f"w{worker}-{i}"))
    database.close()


@pytest.mark.parametrize("engine_url", ["mariadb"], indirect=True)
def test_r22_four_processes_append_gapless_commit_ordered_chain(engine_url: str) -> None:
    database = open_database(engine_url)
    from ledger.store.init import init_store

    init_store(database)
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_append_worker, args=(engine_url, w, 500)) for w in range(4)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(timeout=600)
        assert p.exitcode == 0
    rows = list(LedgerRecorder(database).iter_rows())
    assert [r.position for r in rows] == list(range(1, 2001))
    assert len({(r.aggregate_id, r.version) for r in rows}) == 2000
    assert first_chain_break(rows) is None
    database.close()


def test_r8_appends_small_and_past_the_packet_split_chain_identically(db: Database) -> None:
    """On the MySQL family an append sends its rows and the head in one multi-statement
    packet up to ``_PACKET`` bytes and splits bigger ones: both chain and count alike,
    and a duplicate version is CONFLICT with nothing written either way."""
    from eventsourcing.persistence import StoredEvent

    from ledger.log import append as append_module

    recorder = LedgerRecorder(db)
    big = b"x" * (append_module._PACKET // 2 + 1)
    agg = uuid4()
    small = [StoredEvent(agg, v, "note.added v1", b'{"n":%d}' % v) for v in (1, 2, 3)]
    large = [StoredEvent(agg, v, "note.added v1", big) for v in (4, 5, 6)]
    recorder.insert_events(small)
    recorder.insert_events(large)
    head = recorder.head()
    assert head.position == 6
    assert first_chain_break(recorder.iter_rows()) is None
    assert [r.version for r in recorder.iter_rows()] == [1, 2, 3, 4, 5, 6]
    for batch in ([StoredEvent(agg, 6, "note.added v1", b"{}")], large[2:]):
        with pytest.raises(Conflict):
            recorder.insert_events(batch)
        assert recorder.head() == head
