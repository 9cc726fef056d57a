"""Streams of stored rows, in position order: what replays, audits, exports and the
Merkle tree read.

``scan`` is the projections' replay path (topic-filtered in SQL); ``scan_full`` every
row exactly as stored, for the auditor; ``scan_stored`` every value as the driver
returns it, for ``export``; ``read_rows`` / ``iter_rows`` rows as ``LoggedEvent``;
``event_ids`` the Merkle leaves. Each reads keyset pages on a DBAPI cursor, and a value
of another type than its column's is INTEGRITY naming the row (``ledger.log.stored``).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.log import LoggedEvent
from ledger.log import tables as schema
from ledger.log.db import Database
from ledger.log.stored import binary, close_scan, lenient_text, stored_types


class LogScans:
    """The row streams of the log of ``db``."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._p = "?" if db.is_sqlite else "%s"

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
                        aggregate_id=UUID(bytes=binary(agg)),
                        version=int(ver),
                        topic=binary(topic).decode("utf-8", "replace"),
                        state=binary(state),
                        event_id=binary(eid),
                        chain=binary(chain),
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
            close_scan(cursor)

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
                            binary(row[1]),
                            int(row[2]),
                            binary(row[3]),
                            binary(row[4]),
                            binary(row[5]),
                            binary(row[6]),
                        )
                if len(rows) < page:
                    return
                position = int(rows[-1][0])
        finally:
            close_scan(cursor)

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
        with lenient_text(conn) as cursor:
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
        with lenient_text(conn) as cursor:
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
