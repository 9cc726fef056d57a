"""The append transaction of the hash-chained log (``LedgerRecorder.append``).

One append:

1. locks the single head row (``BEGIN IMMEDIATE`` on SQLite,
   ``SELECT ... FOR UPDATE`` on the MySQL family), so appends are serialized
   and positions are gapless and commit-ordered on every engine;
2. checks the read fence: every aggregate the command read (and every
   aggregate it writes) must still be at the version the decision was made
   on, otherwise the append fails with ``Conflict`` and nothing is written;
3. runs the caller's ``precommit`` check against the locked current state
   (R11: the terminal half of the preflight/terminal matrix);
4. computes ``event_id`` and ``chain`` for each new row from the exact stored
   bytes, inserts the rows, advances the head;
5. runs the inline projection hooks in the same transaction (R8, R20).

Each committed append records how long it held the head row, from the moment the
head row is locked and read to the commit, in its appender's ``HeadLockHolds``
(``Appender.head_lock_holds``, also ``LedgerRecorder.head_lock_holds``): the figure
R30 bounds (a release's hold must follow what it changes, not the catalog's size),
read by ``bench.apply`` after each apply. It costs two ``time.perf_counter`` calls
and an uncontended lock per append.

It runs on the DBAPI cursor with SQL written once for both dialects (only the
placeholder and the row-lock clause differ): it is the hot path, and SQLAlchemy's
per-statement overhead would dominate it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError, StoredEvent
from sqlalchemy.engine import Connection

from domain.digests import event_id, next_chain
from domain.errors import Conflict, InvalidInput
from domain.log import LoggedEvent
from ledger.log import tables as schema
from ledger.log.crashpoints import crashpoint
from ledger.log.db import Database
from ledger.log.sqltypes import mysql_errors
from ledger.log.stored import CHUNK, as_uuid, binary

Precommit = Callable[[Connection], None]
InlineHook = Callable[[Connection, Sequence[LoggedEvent]], None]

#: Appends up to this many bytes of SQL go in one multi-statement packet (PyMySQL's
#: own split size for executemany, far below any server's max_allowed_packet).
_PACKET = 1_000_000


@dataclass(frozen=True)
class Head:
    position: int
    chain: bytes


@dataclass(frozen=True)
class AppendResult:
    rows: list[LoggedEvent]
    head: Head

    @property
    def positions(self) -> list[int]:
        return [row.position for row in self.rows]


@dataclass
class HeadLockHolds:
    """How long the committed appends of one appender held the head row (R30).

    Seconds (``time.perf_counter``) from the moment an append has locked and read the
    head row (``SELECT ... FOR UPDATE`` answered on the MySQL family; on SQLite the
    same read, just after ``BEGIN IMMEDIATE`` took the write lock) to the moment its
    commit returned. Recorded per committed append: ``last`` is the latest append's
    hold (overwritten by the next one; ``None`` before any), ``count``, ``total`` and
    ``longest`` accumulate until ``reset()``. An append refused or failed records
    nothing. Appends of several threads through one appender each record under a lock.
    ``clock`` is the clock the append reads (a test injects its own).
    """

    last: float | None = None
    count: int = 0
    total: float = 0.0
    longest: float = 0.0
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, seconds: float) -> None:
        with self._lock:
            self.last = seconds
            self.count += 1
            self.total += seconds
            self.longest = max(self.longest, seconds)

    def reset(self) -> None:
        """Forget every recorded hold (``last`` back to ``None``)."""
        with self._lock:
            self.last, self.count, self.total, self.longest = None, 0, 0.0, 0.0


class RecordConflict(Conflict, IntegrityError):
    """A refused append: our CONFLICT, and the ``eventsourcing`` ``IntegrityError``.

    The ``eventsourcing`` recorder contract (``ApplicationRecorderTestCase``) says a
    recorder refuses a conflicting write with ``eventsourcing.persistence.IntegrityError``
    (a ``RecordConflictError``); our users see ``Conflict``. Every conflict that leaves
    the append is this class, so both hold: the code (``CONFLICT``), the exit code (4),
    the message and the details are ``Conflict``'s, and a library caller catching
    ``IntegrityError`` or ``RecordConflictError`` catches it too. It lives here, not in
    ``domain.errors``, because the domain imports no persistence library.
    """

    @classmethod
    def of(cls, conflict: Conflict) -> RecordConflict:
        """The same conflict (message and details) as a ``RecordConflict``."""
        if isinstance(conflict, RecordConflict):
            return conflict
        return cls(conflict.message, **conflict.details)


class Appender:
    """Appends rows to the log of ``db``, one transaction each."""

    def __init__(self, db: Database) -> None:
        self.db = db
        #: How long this appender's committed appends held the head row (R30).
        self.head_lock_holds = HeadLockHolds()
        p = "?" if db.is_sqlite else "%s"
        self._p = p
        ev, hd = schema.events.name, schema.head.name
        self.sql_lock_head = f"SELECT position, chain FROM {hd} WHERE id = 1" + (
            "" if db.is_sqlite else " FOR UPDATE"
        )
        self._sql_insert_into = (
            f"INSERT INTO {ev} (position, aggregate_id, version, topic, state, event_id, chain)"
        )
        self._sql_values = f"({p}, {p}, {p}, {p}, {p}, {p}, {p})"
        self._sql_insert = f"{self._sql_insert_into} VALUES {self._sql_values}"
        self._sql_update_head = f"UPDATE {hd} SET position = {p}, chain = {p} WHERE id = 1"
        self.sql_max_versions = (
            f"SELECT aggregate_id, MAX(version) FROM {ev} WHERE aggregate_id IN ({{ids}})"
            " GROUP BY aggregate_id"
        )

    def append(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        fence: Mapping[UUID, int] | None = None,
        precommit: Precommit | None = None,
        hooks: Sequence[InlineHook] = (),
    ) -> AppendResult:
        """Append atomically, or raise ``Conflict`` / a typed error and write nothing.

        Written aggregates need no fence query: versions are consecutive, so a
        stale write collides with the unique (aggregate id, version) index. Every
        plain ``Conflict`` that refuses the append (a version collision, a moved
        fence, a ``precommit`` refusal, a concurrent write reported by the server) is
        raised as a ``RecordConflict``: also the ``eventsourcing`` ``IntegrityError``
        its recorder contract names. A caller's own ``Conflict`` subclass raised by its
        ``precommit`` (``LeaseLost``, ``LeaseBusy``) keeps its class. The inline
        ``hooks`` (the inline views) run in the same transaction, after the insert.
        """
        try:
            return self._append(stored_events, fence=fence, precommit=precommit, hooks=hooks)
        except Conflict as exc:
            if type(exc) is not Conflict:
                raise
            raise RecordConflict.of(exc) from exc

    def _append(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        fence: Mapping[UUID, int] | None,
        precommit: Precommit | None,
        hooks: Sequence[InlineHook],
    ) -> AppendResult:
        fenced = self._fence_versions(stored_events, fence or {})
        crashpoint("append:begin")
        with self.db.write() as conn:
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cursor.execute(self.sql_lock_head)
                locked = cursor.fetchone()
                held_from = self.head_lock_holds.clock()
                crashpoint("append:head-locked")
                if locked is None:
                    raise InvalidInput(
                        "the log has no head row; run `catalog-ledger init`", field="db"
                    )
                start = Head(int(locked[0]), bytes(locked[1]))
                self._check_fence(cursor, fenced)
                if precommit is not None:
                    precommit(conn)
                rows, params = self._chain(stored_events, start.position, start.chain)
                if rows:
                    self._insert(cursor, rows, params)
            finally:
                cursor.close()
            for hook in hooks:
                hook(conn, rows)
            crashpoint("append:before-commit")
        self.head_lock_holds.record(self.head_lock_holds.clock() - held_from)
        crashpoint("append:committed")
        head = Head(rows[-1].position, rows[-1].chain) if rows else start
        return AppendResult(rows=rows, head=head)

    def _insert(self, cursor: Any, rows: list[LoggedEvent], params: list[tuple[Any, ...]]) -> None:
        """Insert the rows and move the head past them (the head row is locked).

        On the MySQL family both go in one multi-statement packet: one round trip
        instead of two (the driver escapes every value; the writer's connections have
        multi-statements on, ``ledger.log.db``); bigger appends use the driver's split
        executemany. SQLite runs in process: two calls."""
        head = (rows[-1].position, rows[-1].chain)
        try:
            values = (
                ""
                if self.db.is_sqlite
                else ", ".join(cursor.mogrify(self._sql_values, p) for p in params)
            )
            if self.db.is_sqlite or len(values) > _PACKET:
                cursor.executemany(self._sql_insert, params)  # the driver splits big ones
                crashpoint("append:rows-inserted")
                cursor.execute(self._sql_update_head, head)
                return
            update = cursor.mogrify(self._sql_update_head, head)
            cursor.execute(f"{self._sql_insert_into} VALUES {values}; {update}")
            crashpoint("append:rows-inserted")
            while cursor.nextset():  # the UPDATE's result: its errors surface here
                pass
        except mysql_errors("IntegrityError", also=(sqlite3.IntegrityError,)) as exc:
            raise RecordConflict(
                "an event with the same aggregate id and version already exists",
                rule="R11",
            ) from exc

    @staticmethod
    def _fence_versions(
        stored_events: Sequence[StoredEvent], fence: Mapping[UUID, int]
    ) -> dict[bytes, int]:
        """Aggregate bytes -> version it must still be at when the append commits."""
        next_version: dict[UUID, int] = {}
        for stored in stored_events:
            key = as_uuid(stored.originator_id)
            version = stored.originator_version
            if key in next_version:
                if version != next_version[key]:
                    raise RecordConflict(
                        "events of one aggregate must have consecutive versions",
                        aggregate_id=str(key),
                    )
            elif key in fence and fence[key] != version - 1:
                raise RecordConflict(
                    "state changed since it was read: the read fence and the written "
                    "version disagree",
                    aggregate_id=str(key),
                    expected_version=fence[key],
                    found_version=version - 1,
                )
            next_version[key] = version + 1
        return {agg.bytes: version for agg, version in fence.items()}

    def _check_fence(self, cursor: Any, expected: Mapping[bytes, int]) -> None:
        if not expected:
            return
        keys = list(expected)
        for start in range(0, len(keys), CHUNK):
            chunk = keys[start : start + CHUNK]
            sql = self.sql_max_versions.format(ids=", ".join([self._p] * len(chunk)))
            cursor.execute(sql, chunk)
            current = {bytes(agg): int(ver) for agg, ver in cursor.fetchall()}
            for key in chunk:
                found = current.get(key, 0)
                if found != expected[key]:
                    raise RecordConflict(
                        "state changed since it was read: the read fence moved",
                        aggregate_id=str(UUID(bytes=key)),
                        expected_version=expected[key],
                        found_version=found,
                    )

    def unchanged_since(self, position: int, aggregates: Callable[[], Iterable[UUID]]) -> Precommit:
        """A precommit: refuse the append (``Conflict``) if any of ``aggregates`` has an
        event after ``position``.

        The read fence of a reader that read all of them in one snapshot at
        ``position``, without reading their versions: the same guarantee as a ``fence``
        of their versions at that position. It reads the (usually no) events appended
        since, by primary key, and calls ``aggregates`` only when there are any, so a
        fence over thousands of aggregates costs one empty range read.
        """
        sql = f"SELECT DISTINCT aggregate_id FROM {schema.events.name} WHERE position > {self._p}"

        def check(conn: Connection) -> None:
            moved = {binary(r[0]) for r in conn.exec_driver_sql(sql, (position,))}
            if not moved:
                return
            for aggregate in aggregates():
                if aggregate.bytes in moved:
                    raise RecordConflict(
                        "state changed since it was read: the read fence moved",
                        aggregate_id=str(aggregate),
                        read_at_position=position,
                    )

        return check

    @staticmethod
    def _chain(
        stored_events: Sequence[StoredEvent], position: int, chain: bytes
    ) -> tuple[list[LoggedEvent], list[tuple[Any, ...]]]:
        """The rows, and the same rows as INSERT parameters (built in one pass: the
        aggregate's bytes and the encoded topic are computed once per event)."""
        rows: list[LoggedEvent] = []
        params: list[tuple[Any, ...]] = []
        for stored in stored_events:
            position += 1
            agg = as_uuid(stored.originator_id)
            key, version, topic = agg.bytes, stored.originator_version, stored.topic
            topic_bytes, state = topic.encode(), stored.state
            eid = event_id(key, version, topic_bytes, state)
            chain = next_chain(chain, eid)
            rows.append(LoggedEvent(position, agg, version, topic, state, eid, chain))
            params.append((position, key, version, topic_bytes, state, eid, chain))
        return rows, params
