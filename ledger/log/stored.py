"""Stored rows as the log holds them: decoding checked, and tampering named (R22).

The log's columns are declared binary and integer; a hand edit can store another type
(SQLite's dynamic typing lets ``replace()`` store TEXT). Every reader of stored rows goes
through these helpers, so such a row is INTEGRITY naming its position, never a crash,
and ``export`` can still read it verbatim (``lenient_text``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any
from uuid import UUID

from sqlalchemy.engine import Connection

from domain.errors import IntegrityFailure
from domain.event_types import EVENT_TYPES, UnknownEventType, decode_row
from domain.log import LoggedEvent
from ledger.log.sqltypes import mysql_errors

#: Ids per ``IN (...)`` list of one statement (fences, versions, events of aggregates).
CHUNK = 400


def as_uuid(value: UUID | str) -> UUID:
    return value if isinstance(value, UUID) else UUID(value)


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


@contextmanager
def lenient_text(conn: Connection) -> Iterator[Any]:
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
        close_scan(cursor)
        if isinstance(raw, sqlite3.Connection):
            raw.text_factory = saved


def close_scan(cursor: Any) -> None:
    """Close a scan's cursor. A scan abandoned by an error (a tampered row) is finished
    only when it is collected, maybe after its connection closed: its cursor is gone
    with the connection then, and that is no error of anyone's (no noise on stderr)."""
    with suppress(*mysql_errors("Error", also=(sqlite3.ProgrammingError,))):
        cursor.close()


def _surrogate_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def binary(value: object) -> bytes:
    """A binary column's value; anything but bytes (TEXT, a number) is a TypeError."""
    if type(value) is bytes:
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"a binary column holds {type(value).__name__}")
