"""The recorder keeps the ``eventsourcing`` ApplicationRecorder contract (DESIGN "The log", R22).

DESIGN.md says the recorder *is* an ``eventsourcing`` ``ApplicationRecorder``. The
library ships the test case every recorder must pass; it runs here unmodified, on a
fresh SQLite file and a fresh MariaDB database per test. Only the hook the library
documents is overridden (``create_recorder``), and the library's optional subscription
test (``optional_test_insert_subscribe``) is switched on the way the library's own
recorders switch it on.
"""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID, uuid4

import pytest
from eventsourcing.persistence import IntegrityError, RecordConflictError, StoredEvent
from eventsourcing.tests import persistence as library
from sqlalchemy.engine import Connection

from domain.errors import Conflict
from ledger.commands.writer_lease import LeaseLost
from ledger.log.db import Database, open_database
from ledger.log.recorder import LedgerRecorder
from ledger.store.init import init_store
from tests.support.cli_inprocess import cli
from tests.support.lifecycle_support import World


def _store(url: str) -> Database:
    db = open_database(url)
    init_store(db)
    return db


class TestR22LedgerRecorderContractSQLite(library.ApplicationRecorderTestCase[LedgerRecorder]):
    """The library's ApplicationRecorderTestCase on a fresh SQLite file."""

    db: Database

    @pytest.fixture(autouse=True)
    def _fresh_store(self, sqlite_url: str) -> Iterator[None]:
        self.db = _store(sqlite_url)
        yield
        self.db.close()

    def create_recorder(self) -> LedgerRecorder:
        return LedgerRecorder(self.db)

    def test_insert_subscribe(self) -> None:
        self.optional_test_insert_subscribe()


class TestR22LedgerRecorderContractMariaDB(library.ApplicationRecorderTestCase[LedgerRecorder]):
    """The library's ApplicationRecorderTestCase on a fresh MariaDB database."""

    db: Database

    @pytest.fixture(autouse=True)
    def _fresh_store(self, mysql_url: str) -> Iterator[None]:
        self.db = _store(mysql_url)
        yield
        self.db.close()

    def create_recorder(self) -> LedgerRecorder:
        return LedgerRecorder(self.db)

    def test_insert_subscribe(self) -> None:
        self.optional_test_insert_subscribe()


# -- what our users see of the same refusals (R11: CONFLICT, exit 4, nothing written) ----


def _event(aggregate: UUID, version: int, state: bytes = b"{}") -> StoredEvent:
    return StoredEvent(
        originator_id=aggregate, originator_version=version, topic="test.t@1", state=state
    )


def test_r11_version_collision_is_conflict_and_the_library_integrity_error(db: Database) -> None:
    recorder = LedgerRecorder(db)
    aggregate = uuid4()
    recorder.insert_events([_event(aggregate, 1)])
    head = recorder.head()
    with pytest.raises(IntegrityError) as info:
        recorder.insert_events([_event(aggregate, 1, b'{"again": 1}')])
    error = info.value
    assert isinstance(error, Conflict) and isinstance(error, RecordConflictError)
    assert (error.exit_code, error.code) == (4, "CONFLICT")
    assert error.to_json() == {
        "error": "CONFLICT",
        "message": "an event with the same aggregate id and version already exists",
        "details": {"rule": "R11"},
    }
    assert recorder.head() == head  # nothing written


def test_r11_moved_read_fence_is_conflict_and_the_library_integrity_error(db: Database) -> None:
    recorder = LedgerRecorder(db)
    read, written = uuid4(), uuid4()
    recorder.insert_events([_event(read, 1), _event(read, 2)])
    head = recorder.head()
    with pytest.raises(IntegrityError) as info:
        recorder.insert_events([_event(written, 1)], fence={read: 1})
    error = info.value
    assert isinstance(error, Conflict)
    assert error.to_json() == {
        "error": "CONFLICT",
        "message": "state changed since it was read: the read fence moved",
        "details": {"aggregate_id": str(read), "expected_version": 1, "found_version": 2},
    }
    assert recorder.head() == head


def test_r11_precommit_conflict_keeps_message_and_details_as_integrity_error(
    db: Database,
) -> None:
    recorder = LedgerRecorder(db)

    def refuse(conn: Connection) -> None:
        raise Conflict("command id reused for another request", rule="R10", command_id="c-1")

    with pytest.raises(IntegrityError) as info:
        recorder.insert_events([_event(uuid4(), 1)], precommit=refuse)
    error = info.value
    assert isinstance(error, Conflict)
    assert error.to_json() == {
        "error": "CONFLICT",
        "message": "command id reused for another request",
        "details": {"rule": "R10", "command_id": "c-1"},
    }
    assert recorder.head().position == 0


def test_r11_precommit_conflict_subclass_keeps_its_own_class(db: Database) -> None:
    """A caller's own refusal (here R12's lost lease) is not re-typed: callers tell it
    apart from a lost race by its class (``ledger.commands.apply.lost_race``)."""
    recorder = LedgerRecorder(db)

    def lease_lost(conn: Connection) -> None:
        raise LeaseLost("the writer lease was lost", rule="R12")

    with pytest.raises(LeaseLost) as info:
        recorder.insert_events([_event(uuid4(), 1)], precommit=lease_lost)
    assert not isinstance(info.value, IntegrityError)
    assert recorder.head().position == 0


def test_r11_cli_conflict_output_is_unchanged(world: World) -> None:
    """A refused append reaches the user as before: exit 4, CONFLICT, its message."""
    first = world.manifest([world.official("sales", world.commit("sales", 1))])
    other = world.manifest([world.official("sales", world.commit("sales", 2))])
    done = cli("--db", world.url, "apply", str(first), "--command-id", "rel-1", "--json")
    assert done.code == 0, done.stdout + done.stderr
    head = world.head()
    clash = cli("--db", world.url, "apply", str(other), "--command-id", "rel-1", "--json")
    assert clash.code == 4, clash.stdout + clash.stderr
    assert (clash.json()["error"], clash.json()["details"]["rule"]) == ("CONFLICT", "R10")
    assert "Traceback" not in clash.stdout + clash.stderr
    assert world.head() == head


# -- the subscription ---------------------------------------------------------------------


def test_r22_subscription_stop_ends_iteration_with_items_still_buffered(db: Database) -> None:
    recorder = LedgerRecorder(db)
    recorder.insert_events([_event(uuid4(), 1) for _ in range(60)])
    with recorder.subscribe(gt=0) as subscription:
        first = next(subscription)
        subscription.stop()
        rest = list(subscription)
    assert first.id == 1
    assert rest == []  # 59 were read ahead into the buffer; none is yielded after stop()


def test_r22_subscription_yields_every_position_in_order_then_new_ones(db: Database) -> None:
    recorder = LedgerRecorder(db)
    recorder.insert_events([_event(uuid4(), 1) for _ in range(5)])
    seen: list[int] = []
    with recorder.subscribe(gt=2) as subscription:
        for notification in subscription:
            seen.append(notification.id)
            if notification.id == 5:
                recorder.insert_events([_event(uuid4(), 1)])
            if notification.id == 6:
                break
    assert seen == [3, 4, 5, 6]
