"""The hash-chained application recorder (SQLAlchemy Core, SQLite + MySQL family).

An ``eventsourcing`` ``ApplicationRecorder`` over the log: appends go through one
transaction that locks the head row, checks the read fence and the caller's
``precommit``, chains and inserts the rows and runs the inline views
(``ledger.log.append``); reads load aggregates' events, versions and single decoded
rows; the row streams of replays, audits and exports are ``ledger.log.scans``; the
decoding of stored values and the naming of a tampered row ``ledger.log.stored``;
following the log ``ledger.log.follow``.

The notification id of ``eventsourcing`` is the log position.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from eventsourcing.persistence import (
    ApplicationRecorder,
    Notification,
    StoredEvent,
    Subscription,
)
from sqlalchemy.engine import Connection

from domain.digests import ZERO_CHAIN
from domain.errors import InvalidInput
from domain.event_types import EVENT_TYPES, Decoded, decode_row
from domain.log import LoggedEvent
from ledger.log import tables as schema
from ledger.log.append import (
    Appender,
    AppendResult,
    Head,
    HeadLockHolds,
    InlineHook,
    Precommit,
)
from ledger.log.db import Database
from ledger.log.follow import PollingSubscription
from ledger.log.scans import LogScans
from ledger.log.stored import CHUNK, as_uuid, binary, stored_types

__all__ = ["LedgerRecorder"]


class LedgerRecorder(ApplicationRecorder):
    """Appends to and reads from the hash-chained log."""

    def __init__(self, db: Database, inline_hooks: Sequence[InlineHook] = ()) -> None:
        self.db = db
        self.inline_hooks: list[InlineHook] = list(inline_hooks)
        self._p = "?" if db.is_sqlite else "%s"
        self._appender = Appender(db)
        self._scans = LogScans(db)

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
        """Append atomically, or raise ``Conflict`` / a typed error and write nothing
        (``Appender.append``); the inline views run in the same transaction."""
        return self._appender.append(
            stored_events, fence=fence, precommit=precommit, hooks=self.inline_hooks
        )

    @property
    def head_lock_holds(self) -> HeadLockHolds:
        """How long this recorder's committed appends held the head row, from locking
        it to the commit (R30; ``ledger.log.append.HeadLockHolds``)."""
        return self._appender.head_lock_holds

    def unchanged_since(self, position: int, aggregates: Callable[[], Iterable[UUID]]) -> Precommit:
        """A precommit refusing the append if any of ``aggregates`` has an event after
        ``position`` (``Appender.unchanged_since``)."""
        return self._appender.unchanged_since(position, aggregates)

    # -- reading -------------------------------------------------------------------

    def head(self) -> Head:
        with self.db.read() as conn:
            return self.head_in(conn)

    def lock_head(self, conn: Connection) -> Head:
        """Lock the head row inside a write transaction (blocks appends until commit)."""
        row = conn.exec_driver_sql(self._appender.sql_lock_head).one_or_none()
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
            return [(int(p), binary(t), binary(s)) for p, t, s in conn.execute(query)]

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
                conn, as_uuid(originator_id), gt=gt, lte=lte, desc=desc, limit=limit
            )

    def select_events_of(self, conn: Connection, aggregates: Sequence[UUID]) -> list[StoredEvent]:
        """Every event of each of ``aggregates``, by aggregate and version, in one
        statement per ``CHUNK`` ids (``select_events_in`` of many at once)."""
        ev = schema.events
        out: list[StoredEvent] = []
        for start in range(0, len(aggregates), CHUNK):
            chunk = {a.bytes: a for a in aggregates[start : start + CHUNK]}
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
        for start in range(0, len(aggregates), CHUNK):
            chunk = {a.bytes: a for a in aggregates[start : start + CHUNK]}
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
            for start in range(0, len(keys), CHUNK):
                chunk = keys[start : start + CHUNK]
                cursor.execute(
                    self._appender.sql_max_versions.format(ids=", ".join([self._p] * len(chunk))),
                    chunk,
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

    # -- row streams (``ledger.log.scans``) ----------------------------------------

    def read_rows(
        self, conn: Connection, *, after: int, upto: int | None = None, limit: int = 1000
    ) -> list[LoggedEvent]:
        """Stored rows with ``after < position <= upto``, in position order."""
        return self._scans.read_rows(conn, after=after, upto=upto, limit=limit)

    def iter_rows(
        self, *, after: int = 0, upto: int | None = None, batch: int = 5000
    ) -> Iterator[LoggedEvent]:
        """Stream the log in position order, one short read transaction per batch."""
        return self._scans.iter_rows(after=after, upto=upto, batch=batch)

    def scan(
        self,
        conn: Connection,
        *,
        after: int,
        upto: int,
        topics: Sequence[str] | None = None,
        page: int = 10_000,
    ) -> Iterator[tuple[int, str, bytes]]:
        """(position, topic, state) for ``after < position <= upto``, topic-filtered in
        SQL: the replay path of projections."""
        return self._scans.scan(conn, after=after, upto=upto, topics=topics, page=page)

    def scan_full(
        self, conn: Connection, *, after: int = 0, upto: int | None = None, page: int = 20_000
    ) -> Generator[tuple[int, bytes, int, bytes, bytes, bytes, bytes], None, None]:
        """Every stored row after ``after``, exactly as stored, rows past the head
        included (the auditor's read)."""
        return self._scans.scan_full(conn, after=after, upto=upto, page=page)

    def scan_stored(
        self, conn: Connection, *, after: int = 0, upto: int | None = None, page: int = 20_000
    ) -> Generator[tuple[object, ...], None, None]:
        """Every stored row after ``after``, each value as the driver returns it (``export``)."""
        return self._scans.scan_stored(conn, after=after, upto=upto, page=page)

    def stored_head(self, conn: Connection) -> tuple[object, object] | None:
        """The head row's (position, chain) as the driver returns them."""
        return self._scans.stored_head(conn)

    def event_ids(self, conn: Connection, *, after: int, upto: int) -> list[bytes]:
        """Stored ``event_id``s of positions ``after+1 .. upto`` (Merkle leaf data)."""
        return self._scans.event_ids(conn, after=after, upto=upto)

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
        for start in range(0, len(keys), CHUNK):
            chunk = keys[start : start + CHUNK]
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
