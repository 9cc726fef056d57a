"""The hash-chained application recorder (SQLAlchemy Core, SQLite + MySQL family).

An ``eventsourcing`` ``ApplicationRecorder`` whose append transaction:

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

The notification id of ``eventsourcing`` is the log position.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from eventsourcing.persistence import (
    ApplicationRecorder,
    IntegrityError,
    Notification,
    StoredEvent,
    Subscription,
)
from sqlalchemy.engine import Connection

from domain.digests import ZERO_CHAIN, event_id, next_chain
from domain.errors import Conflict, IntegrityFailure, InvalidInput
from domain.event_types import EVENT_TYPES, Decoded, UnknownEventType, decode_row
from domain.log import LoggedEvent
from ledger.log import tables as schema
from ledger.log.crashpoints import crashpoint
from ledger.log.db import Database, translate_errors
from ledger.log.sqltypes import mysql_errors

Precommit = Callable[[Connection], None]
InlineHook = Callable[[Connection, Sequence[LoggedEvent]], None]

_FENCE_CHUNK = 400
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


@contextmanager
def stored_types(what: str, position: Callable[[], object]) -> Iterator[None]:
    """Turn a stored value of the wrong type into INTEGRITY naming the row (R22).

    The log's columns are declared binary and integer; SQLite's dynamic typing
    lets a hand edit store TEXT instead (``replace()`` does). Converting such a
    value fails with a TypeError or AttributeError deep in a read: that is
    tampering, reported as such, never a crash. The guard costs nothing on
    rows of the declared types.
    """
    try:
        yield
    except (TypeError, AttributeError, ValueError, UnicodeDecodeError) as exc:
        raise IntegrityFailure(
            f"{what} at position {position()} is not stored as its declared type "
            f"({type(exc).__name__}: {exc}); the row was edited outside the store",
            position=position(),
        ) from None


def check_row(row: LoggedEvent) -> None:
    """A row read as stored decodes as its type declares, or INTEGRITY naming its position
    (``decode_row``). A topic this release does not know is left to the readers that
    decode it (``log`` shows such a row as stored)."""
    try:
        EVENT_TYPES.resolve(row.topic)
    except UnknownEventType:
        return
    decode_row(row.aggregate_id.bytes, row.position, row.version, row.topic.encode(), row.state)


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


def _uuid(value: UUID | str) -> UUID:
    return value if isinstance(value, UUID) else UUID(value)


class LedgerRecorder(ApplicationRecorder):
    """Appends to and reads from the hash-chained log."""

    def __init__(self, db: Database, inline_hooks: Sequence[InlineHook] = ()) -> None:
        self.db = db
        self.inline_hooks: list[InlineHook] = list(inline_hooks)
        # The append path runs on the DBAPI cursor with SQL written once for both
        # dialects (only the placeholder and the row-lock clause differ): it is the
        # hot path, and SQLAlchemy's per-statement overhead would dominate it.
        p = "?" if db.is_sqlite else "%s"
        self._p = p
        ev, hd = schema.events.name, schema.head.name
        self._sql_lock_head = f"SELECT position, chain FROM {hd} WHERE id = 1" + (
            "" if db.is_sqlite else " FOR UPDATE"
        )
        self._sql_insert_into = (
            f"INSERT INTO {ev} (position, aggregate_id, version, topic, state, event_id, chain)"
        )
        self._sql_values = f"({p}, {p}, {p}, {p}, {p}, {p}, {p})"
        self._sql_insert = f"{self._sql_insert_into} VALUES {self._sql_values}"
        self._sql_update_head = f"UPDATE {hd} SET position = {p}, chain = {p} WHERE id = 1"
        self._sql_max_versions = (
            f"SELECT aggregate_id, MAX(version) FROM {ev} WHERE aggregate_id IN ({{ids}})"
            " GROUP BY aggregate_id"
        )

    # -- appending -----------------------------------------------------------------

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """``eventsourcing`` entry point; ``fence`` and ``precommit`` are optional kwargs."""
        result = self.append(
            stored_events, fence=kwargs.get("fence"), precommit=kwargs.get("precommit")
        )
        return result.positions

    def append(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        fence: Mapping[UUID, int] | None = None,
        precommit: Precommit | None = None,
    ) -> AppendResult:
        """Append atomically, or raise ``Conflict`` / a typed error and write nothing.

        Written aggregates need no fence query: versions are consecutive, so a
        stale write collides with the unique (aggregate id, version) index. Every
        plain ``Conflict`` that refuses the append (a version collision, a moved
        fence, a ``precommit`` refusal, a concurrent write reported by the server) is
        raised as a ``RecordConflict``: also the ``eventsourcing`` ``IntegrityError``
        its recorder contract names. A caller's own ``Conflict`` subclass raised by its
        ``precommit`` (``LeaseLost``, ``LeaseBusy``) keeps its class.
        """
        try:
            return self._append(stored_events, fence=fence, precommit=precommit)
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
    ) -> AppendResult:
        fenced = self._fence_versions(stored_events, fence or {})
        crashpoint("append:begin")
        with self.db.write() as conn:
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cursor.execute(self._sql_lock_head)
                locked = cursor.fetchone()
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
            for hook in self.inline_hooks:
                hook(conn, rows)
            crashpoint("append:before-commit")
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
            key = _uuid(stored.originator_id)
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
        for start in range(0, len(keys), _FENCE_CHUNK):
            chunk = keys[start : start + _FENCE_CHUNK]
            sql = self._sql_max_versions.format(ids=", ".join([self._p] * len(chunk)))
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
            moved = {_binary(r[0]) for r in conn.exec_driver_sql(sql, (position,))}
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
            agg = _uuid(stored.originator_id)
            key, version, topic = agg.bytes, stored.originator_version, stored.topic
            topic_bytes, state = topic.encode(), stored.state
            eid = event_id(key, version, topic_bytes, state)
            chain = next_chain(chain, eid)
            rows.append(LoggedEvent(position, agg, version, topic, state, eid, chain))
            params.append((position, key, version, topic_bytes, state, eid, chain))
        return rows, params

    # -- reading -------------------------------------------------------------------

    def head(self) -> Head:
        with self.db.read() as conn:
            return self.head_in(conn)

    def lock_head(self, conn: Connection) -> Head:
        """Lock the head row inside a write transaction (blocks appends until commit)."""
        row = conn.exec_driver_sql(self._sql_lock_head).one_or_none()
        if row is None:
            raise InvalidInput("the log has no head row; run `catalog-ledger init`", field="db")
        return Head(int(row[0]), bytes(row[1]))

    def head_in(self, conn: Connection) -> Head:
        hd = schema.head
        row = conn.execute(sa.select(hd.c.position, hd.c.chain).where(hd.c.id == 1)).one_or_none()
        if row is None:
            return Head(0, ZERO_CHAIN)
        return Head(int(row[0]), bytes(row[1]))

    def rows_of_topics(
        self, conn: Connection, topics: Sequence[str]
    ) -> list[tuple[int, bytes, bytes]]:
        """(position, topic, state) of every row stored under one of ``topics``, in
        position order. The topic column has no index: this reads the whole log table's
        topics (used by ``status`` for removals, which no view keeps, R7)."""
        if not topics:
            return []
        ev = schema.events
        query = (
            sa.select(ev.c.position, ev.c.topic, ev.c.state)
            .where(ev.c.topic.in_([t.encode() for t in topics]))
            .order_by(ev.c.position)
        )
        with stored_types("the log row", lambda: None):
            return [(int(p), _binary(t), _binary(s)) for p, t, s in conn.execute(query)]

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        with self.db.read() as conn:
            return self.select_events_in(
                conn, _uuid(originator_id), gt=gt, lte=lte, desc=desc, limit=limit
            )

    def select_events_of(self, conn: Connection, aggregates: Sequence[UUID]) -> list[StoredEvent]:
        """Every event of each of ``aggregates``, by aggregate and version, in one
        statement per ``_FENCE_CHUNK`` ids (``select_events_in`` of many at once)."""
        ev = schema.events
        out: list[StoredEvent] = []
        for start in range(0, len(aggregates), _FENCE_CHUNK):
            chunk = {a.bytes: a for a in aggregates[start : start + _FENCE_CHUNK]}
            query = (
                sa.select(ev.c.aggregate_id, ev.c.version, ev.c.topic, ev.c.state)
                .where(ev.c.aggregate_id.in_(list(chunk)))
                .order_by(ev.c.aggregate_id, ev.c.version)
            )
            out.extend(
                StoredEvent(
                    originator_id=chunk[bytes(agg)],
                    originator_version=int(version),
                    topic=bytes(topic).decode(),
                    state=bytes(state),
                )
                for agg, version, topic, state in conn.execute(query)
            )
        return out

    def checked_events_of(
        self, conn: Connection, aggregates: Sequence[UUID]
    ) -> list[tuple[int, StoredEvent]]:
        """``select_events_of`` for loading aggregates: each event with its position, and
        each row checked by ``decode_row`` first, so a tampered row is INTEGRITY naming
        its position instead of a crash in the mapper or the aggregate."""
        ev, p = schema.events.name, self._p
        out: list[tuple[int, StoredEvent]] = []
        for start in range(0, len(aggregates), _FENCE_CHUNK):
            chunk = {a.bytes: a for a in aggregates[start : start + _FENCE_CHUNK]}
            sql = (
                f"SELECT aggregate_id, position, version, topic, state FROM {ev} "
                f"WHERE aggregate_id IN ({', '.join([p] * len(chunk))}) "
                "ORDER BY aggregate_id, version"
            )
            for row in conn.exec_driver_sql(sql, tuple(chunk)):
                found = decode_row(*row)
                stored = StoredEvent(
                    originator_id=chunk[found.aggregate_id.bytes],
                    originator_version=found.version,
                    topic=bytes(row[3]).decode(),
                    state=bytes(row[4]),
                )
                out.append((found.position, stored))
        return out

    def select_events_in(
        self,
        conn: Connection,
        originator_id: UUID,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> list[StoredEvent]:
        ev = schema.events
        query = sa.select(ev.c.version, ev.c.topic, ev.c.state).where(
            ev.c.aggregate_id == originator_id.bytes
        )
        if gt is not None:
            query = query.where(ev.c.version > gt)
        if lte is not None:
            query = query.where(ev.c.version <= lte)
        query = query.order_by(ev.c.version.desc() if desc else ev.c.version)
        if limit is not None:
            query = query.limit(limit)
        return [
            StoredEvent(
                originator_id=originator_id,
                originator_version=int(version),
                topic=bytes(topic).decode(),
                state=bytes(state),
            )
            for version, topic, state in conn.execute(query)
        ]

    def versions(self, conn: Connection, aggregates: Sequence[UUID]) -> dict[UUID, int]:
        """Current version of each aggregate (0 when it has no events), in chunks."""
        out = {agg: 0 for agg in aggregates}
        keys = [agg.bytes for agg in out]
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            for start in range(0, len(keys), _FENCE_CHUNK):
                chunk = keys[start : start + _FENCE_CHUNK]
                cursor.execute(
                    self._sql_max_versions.format(ids=", ".join([self._p] * len(chunk))), chunk
                )
                for agg, version in cursor.fetchall():
                    out[UUID(bytes=bytes(agg))] = int(version)
        finally:
            cursor.close()
        return out

    def current_version(self, conn: Connection, aggregate: UUID) -> int:
        """The aggregate's latest version in the log (0 when it has no events)."""
        ev = schema.events
        found = conn.execute(
            sa.select(sa.func.max(ev.c.version)).where(ev.c.aggregate_id == aggregate.bytes)
        ).scalar()
        return int(found or 0)

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        ev = schema.events
        query = sa.select(ev.c.position, ev.c.aggregate_id, ev.c.version, ev.c.topic, ev.c.state)
        if start is not None:
            query = query.where(
                ev.c.position >= start if inclusive_of_start else ev.c.position > start
            )
        if stop is not None:
            query = query.where(ev.c.position <= stop)
        if topics:
            query = query.where(ev.c.topic.in_([t.encode() for t in topics]))
        query = query.order_by(ev.c.position).limit(limit)
        with self.db.read() as conn:
            return [
                Notification(
                    id=int(pos),
                    originator_id=UUID(bytes=bytes(agg)),
                    originator_version=int(ver),
                    topic=bytes(topic).decode(),
                    state=bytes(state),
                )
                for pos, agg, ver, topic, state in conn.execute(query)
            ]

    def max_notification_id(self) -> int | None:
        position = self.head().position
        return position or None

    def subscribe(
        self, gt: int | None = None, topics: Sequence[str] = ()
    ) -> Subscription[ApplicationRecorder]:
        return PollingSubscription(self, gt=gt, topics=topics)

    def read_rows(
        self, conn: Connection, *, after: int, upto: int | None = None, limit: int = 1000
    ) -> list[LoggedEvent]:
        """Stored rows with ``after < position <= upto``, in position order."""
        ev = schema.events
        query = sa.select(
            ev.c.position,
            ev.c.aggregate_id,
            ev.c.version,
            ev.c.topic,
            ev.c.state,
            ev.c.event_id,
            ev.c.chain,
        ).where(ev.c.position > after)
        if upto is not None:
            query = query.where(ev.c.position <= upto)
        query = query.order_by(ev.c.position).limit(limit)
        out: list[LoggedEvent] = []
        last: list[object] = [after]
        with stored_types("the log row", lambda: last[0]):
            for pos, agg, ver, topic, state, eid, chain in conn.execute(query):
                last[0] = pos
                out.append(
                    LoggedEvent(
                        position=int(pos),
                        aggregate_id=UUID(bytes=_binary(agg)),
                        version=int(ver),
                        topic=_binary(topic).decode("utf-8", "replace"),
                        state=_binary(state),
                        event_id=_binary(eid),
                        chain=_binary(chain),
                    )
                )
        return out

    def scan(
        self,
        conn: Connection,
        *,
        after: int,
        upto: int,
        topics: Sequence[str] | None = None,
        page: int = 10_000,
    ) -> Iterator[tuple[int, str, bytes]]:
        """(position, topic, state) for ``after < position <= upto``, topic-filtered in SQL.

        The replay path of projections: DBAPI cursor, keyset pages, no per-row
        objects beyond the tuple, so rebuilds run near the raw scan rate.
        """
        p = self._p
        where = f"position > {p} AND position <= {p}"
        topic_params: list[bytes] = []
        if topics is not None:
            topic_params = [t.encode() for t in sorted(topics)]
            if not topic_params:
                return
            where += f" AND topic IN ({', '.join([p] * len(topic_params))})"
        sql = (
            f"SELECT position, topic, state FROM {schema.events.name} WHERE {where} "
            f"ORDER BY position LIMIT {int(page)}"
        )
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        at: list[object] = [after]
        try:
            position = after
            while position < upto:
                cursor.execute(sql, [position, upto, *topic_params])
                rows = cursor.fetchall()
                with stored_types("the log row", lambda: at[0]):
                    for pos, topic, state in rows:
                        at[0] = pos
                        if type(state) is not bytes:
                            raise TypeError(f"state is {type(state).__name__}")
                        yield pos, topic.decode(), state
                if len(rows) < page:
                    return
                position = rows[-1][0]
        finally:
            _close_scan(cursor)

    def scan_full(
        self, conn: Connection, *, after: int = 0, upto: int | None = None, page: int = 20_000
    ) -> Generator[tuple[int, bytes, int, bytes, bytes, bytes, bytes], None, None]:
        """Every stored row after ``after`` in position order, exactly as stored:
        (position, aggregate id, version, topic, state, event_id, chain). Rows past
        the head row are included: the auditor must see everything that is there."""
        ev = schema.events.name
        bound = "" if upto is None else f" AND position <= {int(upto)}"
        sql = (
            f"SELECT position, aggregate_id, version, topic, state, event_id, chain FROM {ev} "
            f"WHERE position > {self._p}{bound} ORDER BY position LIMIT {int(page)}"
        )
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        at: list[object] = [after]
        try:
            position = after
            while True:
                cursor.execute(sql, (position,))
                rows = cursor.fetchall()
                with stored_types("the log row", lambda: at[0]):
                    for row in rows:
                        at[0] = row[0]
                        yield (
                            int(row[0]),
                            _binary(row[1]),
                            int(row[2]),
                            _binary(row[3]),
                            _binary(row[4]),
                            _binary(row[5]),
                            _binary(row[6]),
                        )
                if len(rows) < page:
                    return
                position = int(rows[-1][0])
        finally:
            _close_scan(cursor)

    def scan_stored(
        self, conn: Connection, *, after: int = 0, upto: int | None = None, page: int = 20_000
    ) -> Generator[tuple[object, ...], None, None]:
        """Every stored row after ``after`` in position order, each value as the driver
        returns it, unconverted: (position, aggregate id, version, topic, state, event_id,
        chain). For ``export``, which writes a damaged row verbatim (a TEXT state, a NULL)
        instead of stopping at it; every other reader uses ``scan_full``."""
        ev = schema.events.name
        bound = "" if upto is None else f" AND position <= {int(upto)}"
        sql = (
            f"SELECT position, aggregate_id, version, topic, state, event_id, chain FROM {ev} "
            f"WHERE position > {self._p}{bound} ORDER BY position LIMIT {int(page)}"
        )
        with _lenient_text(conn) as cursor:
            position = after
            while True:
                cursor.execute(sql, (position,))
                rows = cursor.fetchall()
                for row in rows:
                    yield tuple(row)
                if len(rows) < page:
                    return
                position = int(rows[-1][0])  # the primary key: an integer on both engines

    def stored_head(self, conn: Connection) -> tuple[object, object] | None:
        """The head row's (position, chain) as the driver returns them (see ``scan_stored``)."""
        with _lenient_text(conn) as cursor:
            cursor.execute(f"SELECT position, chain FROM {schema.head.name} WHERE id = 1")
            row = cursor.fetchone()
        return None if row is None else (row[0], row[1])

    def event_ids(self, conn: Connection, *, after: int, upto: int) -> list[bytes]:
        """Stored ``event_id``s of positions ``after+1 .. upto`` (Merkle leaf data)."""
        ev = schema.events.name
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(
                f"SELECT event_id FROM {ev} WHERE position > {self._p} AND position <= {self._p}"
                " ORDER BY position",
                (after, upto),
            )
            return [bytes(r[0]) for r in cursor.fetchall()]
        finally:
            cursor.close()

    # -- single rows the command side and the reader decide on (R28) -----------------

    def last_events(self, conn: Connection, aggregates: Iterable[UUID]) -> dict[UUID, Decoded]:
        """The last event of each of ``aggregates`` that has any, decoded: one index seek
        on ``(aggregate_id, version)`` per aggregate, a few hundred per statement."""
        return self._events_where(conn, aggregates, last=True)

    def first_events(self, conn: Connection, aggregates: Iterable[UUID]) -> dict[UUID, Decoded]:
        """The creating (version 1) event of each of ``aggregates`` that has any, decoded."""
        return self._events_where(conn, aggregates, last=False)

    def _events_where(
        self, conn: Connection, aggregates: Iterable[UUID], *, last: bool
    ) -> dict[UUID, Decoded]:
        wanted = {a.bytes: a for a in aggregates}
        keys = sorted(wanted)
        ev, p = schema.events.name, self._p
        out: dict[UUID, Decoded] = {}
        for start in range(0, len(keys), _FENCE_CHUNK):
            chunk = keys[start : start + _FENCE_CHUNK]
            marks = ", ".join([p] * len(chunk))
            if last:
                sql = (
                    f"SELECT e.aggregate_id, e.position, e.version, e.topic, e.state FROM {ev} e "
                    f"JOIN (SELECT aggregate_id, MAX(version) AS version FROM {ev} "
                    f"WHERE aggregate_id IN ({marks}) GROUP BY aggregate_id) m "
                    "ON e.aggregate_id = m.aggregate_id AND e.version = m.version"
                )
            else:
                sql = (
                    f"SELECT aggregate_id, position, version, topic, state FROM {ev} "
                    f"WHERE aggregate_id IN ({marks}) AND version = 1"
                )
            for row in conn.exec_driver_sql(sql, tuple(chunk)):
                found = decode_row(*row)
                out[wanted[found.aggregate_id.bytes]] = found
        return out

    def decoded_after(
        self, conn: Connection, *, after: int, topics: Iterable[str], upto: int | None = None
    ) -> list[Decoded]:
        """Every event of the types ``topics`` after ``after`` (up to the head), decoded."""
        head = self.head_in(conn).position if upto is None else upto
        if head <= after:
            return []
        stored = EVENT_TYPES.topics_of(topics)
        out: list[Decoded] = []
        p, ev = self._p, schema.events.name
        marks = ", ".join([p] * len(stored))
        sql = (
            f"SELECT aggregate_id, position, version, topic, state FROM {ev} "
            f"WHERE position > {p} AND position <= {p} AND topic IN ({marks}) ORDER BY position"
        )
        for row in conn.exec_driver_sql(sql, (after, head, *(t.encode() for t in stored))):
            out.append(decode_row(*row))
        return out

    def iter_rows(
        self, *, after: int = 0, upto: int | None = None, batch: int = 5000
    ) -> Iterator[LoggedEvent]:
        """Stream the log in position order, one short read transaction per batch."""
        position = after
        while True:
            with self.db.read() as conn:
                rows = self.read_rows(conn, after=position, upto=upto, limit=batch)
            if not rows:
                return
            yield from rows
            position = rows[-1].position
            if len(rows) < batch:
                return


@contextmanager
def _lenient_text(conn: Connection) -> Iterator[Any]:
    """A DBAPI cursor that reads any TEXT value, however it was stored.

    SQLite's driver refuses a TEXT value that is not UTF-8 (a hand edit such as
    ``CAST(event_id AS TEXT)`` makes one); for the raw scans the bytes come back as
    ``str`` with surrogate escapes, so ``value.encode("utf-8", "surrogateescape")``
    is exactly what is stored. The connection's own setting is restored after."""
    raw = conn.connection.dbapi_connection
    saved = raw.text_factory if isinstance(raw, sqlite3.Connection) else None
    if isinstance(raw, sqlite3.Connection):
        raw.text_factory = _surrogate_text
    cursor = raw.cursor()  # type: ignore[union-attr]
    try:
        yield cursor
    finally:
        _close_scan(cursor)
        if isinstance(raw, sqlite3.Connection):
            raw.text_factory = saved


def _close_scan(cursor: Any) -> None:
    """Close a scan's cursor. A scan abandoned by an error (a tampered row) is finished
    only when it is collected, maybe after its connection closed: its cursor is gone
    with the connection then, and that is no error of anyone's (no noise on stderr)."""
    with suppress(*mysql_errors("Error", also=(sqlite3.ProgrammingError,))):
        cursor.close()


def _surrogate_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _binary(value: object) -> bytes:
    """A binary column's value; anything but bytes (TEXT, a number) is a TypeError."""
    if type(value) is bytes:
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"a binary column holds {type(value).__name__}")


class PollingSubscription(Subscription[ApplicationRecorder]):
    """Follows the log from a position by polling; gapless positions need no gap logic.

    ``stop()`` (also on leaving the ``with`` block) ends the iteration at once: the
    next ``next()`` raises ``StopIteration`` even if read-ahead items are buffered.
    """

    def __init__(
        self,
        recorder: LedgerRecorder,
        gt: int | None = None,
        topics: Sequence[str] = (),
        *,
        poll_interval: float = 0.2,
        batch: int = 500,
    ) -> None:
        super().__init__(recorder=recorder, gt=gt, topics=topics)
        self._ledger = recorder
        self._poll_interval = poll_interval
        self._batch = batch
        self._buffer: list[Notification] = []
        self._index = 0
        self._stopped = threading.Event()

    def stop(self) -> None:
        super().stop()
        self._stopped.set()

    def __next__(self) -> Notification:
        # Stopped means stopped: nothing more is yielded, not even what was already
        # read into the buffer (the library's contract: one item after stop() during
        # iteration is the last one, and none after stop() before it).
        if self._stopped.is_set():
            self._buffer, self._index = [], 0
            raise StopIteration
        while self._index >= len(self._buffer):
            if self._stopped.is_set():
                raise StopIteration
            with translate_errors():
                batch = self._ledger.select_notifications(
                    start=self._last_notification_id or 0,
                    limit=self._batch,
                    topics=self._topics,
                    inclusive_of_start=False,
                )
            if batch:
                self._buffer = list(batch)
                self._index = 0
                self._last_notification_id = batch[-1].id
            else:
                self._stopped.wait(self._poll_interval)
        item = self._buffer[self._index]
        self._index += 1
        return item
