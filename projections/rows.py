"""Row stores: primary-key access to the rows of one view version.

* ``SqlRowStore`` writes through a SQLAlchemy connection into the rows of one
  *view version* — used inline (inside the append transaction) and by the
  catch-up runner;
* ``MemoryRowStore`` keeps rows in dictionaries — used to verify a live view
  against a fresh replay, and to rebuild a view that has no kernel;
* ``read_version_rows`` and ``write_tuples`` read and bulk-write a whole version.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ledger.log.sqltypes import KEYS_PER_STATEMENT, keys_in
from projections.tables import Key, Row, RowTuple, ViewTable


class RowStore(ABC):
    """Primary-key access to the rows of one version of a projection's tables."""

    @abstractmethod
    def get(self, table: ViewTable, key: Key) -> Row | None: ...

    @abstractmethod
    def put(self, table: ViewTable, row: Row) -> None: ...

    @abstractmethod
    def delete(self, table: ViewTable, key: Key) -> None: ...

    @abstractmethod
    def scan(self, table: ViewTable, **equal: Any) -> list[Row]:
        """Every row whose columns equal ``equal`` (meant for small tables/filters)."""

    def get_many(self, table: ViewTable, keys: Iterable[Key]) -> dict[Key, Row]:
        """The rows that exist for ``keys`` (one round trip per chunk on SQL)."""
        found = {}
        for key in keys:
            row = self.get(table, key)
            if row is not None:
                found[key] = row
        return found


class MemoryRowStore(RowStore):
    """Rows in dictionaries: the fast path for rebuild and verify."""

    def __init__(self) -> None:
        self.tables: defaultdict[str, dict[Key, Row]] = defaultdict(dict)

    def get(self, table: ViewTable, key: Key) -> Row | None:
        return self.tables[table.name].get(key)

    def put(self, table: ViewTable, row: Row) -> None:
        self.tables[table.name][table.key_of(row)] = row

    def delete(self, table: ViewTable, key: Key) -> None:
        self.tables[table.name].pop(key, None)

    def rows(self, table: ViewTable) -> dict[Key, Row]:
        return self.tables[table.name]

    def scan(self, table: ViewTable, **equal: Any) -> list[Row]:
        found = self.tables[table.name].values()
        if not equal:
            return list(found)
        return [r for r in found if all(r[c] == v for c, v in equal.items())]


_DELETED: Row = {}
_GET_MANY_CHUNK = 500


@cache
def _select_one(table: ViewTable) -> Any:
    """One compiled primary-key lookup per table (built once: this runs per event)."""
    t = table.physical
    return sa.select(*(t.c[c] for c in table.columns)).where(
        t.c.view_version == sa.bindparam("vv"),
        *(t.c[k] == sa.bindparam(f"k_{k}") for k in table.key),
    )


class SqlRowStore(RowStore):
    """Rows of one view version through a live connection, written back on ``flush``.

    Writes are buffered per event: ``commit_event`` keeps the current event's
    writes, ``discard_event`` drops them (a poison event leaves no partial
    rows, without savepoints), and ``flush`` writes only the final state of
    each touched key with one executemany per table and operation.
    """

    def __init__(self, conn: Connection, view_version: int) -> None:
        self.conn = conn
        self.view_version = view_version
        self._mysql = conn.dialect.name in ("mysql", "mariadb")
        self._done: dict[tuple[str, Key], tuple[ViewTable, Row]] = {}
        self._pending: dict[tuple[str, Key], tuple[ViewTable, Row]] = {}

    def _layered(self, table: ViewTable, key: Key) -> tuple[bool, Row | None]:
        ident = (table.name, key)
        for layer in (self._pending, self._done):
            if ident in layer:
                row = layer[ident][1]
                return True, None if row is _DELETED else row
        return False, None

    def get(self, table: ViewTable, key: Key) -> Row | None:
        known, row = self._layered(table, key)
        if known:
            return row
        params = {
            "vv": self.view_version,
            **{f"k_{k}": v for k, v in zip(table.key, key, strict=True)},
        }
        found = self.conn.execute(_select_one(table), params).one_or_none()
        return _normalize(found._asdict()) if found is not None else None

    def get_many(self, table: ViewTable, keys: Iterable[Key]) -> dict[Key, Row]:
        found: dict[Key, Row] = {}
        missing: list[Key] = []
        for key in keys:
            known, row = self._layered(table, key)
            if not known:
                missing.append(key)
            elif row is not None:
                found[key] = row
        t = table.physical
        columns = [t.c[k] for k in table.key]
        size = _GET_MANY_CHUNK if len(columns) == 1 else KEYS_PER_STATEMENT
        for start in range(0, len(missing), size):
            chunk = missing[start : start + size]
            where = keys_in([t.c.view_version == self.view_version], columns, chunk)
            query = sa.select(*(t.c[c] for c in table.columns)).where(where)
            for hit in self.conn.execute(query):
                values = _normalize(hit._asdict())
                found[table.key_of(values)] = values
        return found

    def put(self, table: ViewTable, row: Row) -> None:
        self._pending[(table.name, table.key_of(row))] = (table, row)

    def delete(self, table: ViewTable, key: Key) -> None:
        self._pending[(table.name, key)] = (table, _DELETED)

    def scan(self, table: ViewTable, **equal: Any) -> list[Row]:
        t = table.physical
        query = sa.select(*(t.c[c] for c in table.columns)).where(
            t.c.view_version == self.view_version, *(t.c[c] == v for c, v in equal.items())
        )
        found = {
            table.key_of(r): r
            for r in (_normalize(row._asdict()) for row in self.conn.execute(query))
        }
        for layer in (self._done, self._pending):
            for (name, key), (_, row) in layer.items():
                if name != table.name:
                    continue
                if row is _DELETED or not all(row[c] == v for c, v in equal.items()):
                    found.pop(key, None)
                else:
                    found[key] = row
        return list(found.values())

    def commit_event(self) -> None:
        self._done.update(self._pending)
        self._pending.clear()

    def discard_event(self) -> None:
        self._pending.clear()

    def flush(self) -> None:
        """Write the final state of every touched key: one DBAPI executemany per table
        and operation (publishing a revision can touch every grant of the store)."""
        self.commit_event()
        upserts: dict[str, tuple[ViewTable, list[tuple[Any, ...]]]] = {}
        deletes: dict[str, tuple[ViewTable, list[tuple[Any, ...]]]] = {}
        vv = self.view_version
        for (name, key), (table, row) in self._done.items():
            if row is _DELETED:
                deletes.setdefault(name, (table, []))[1].append((vv, *key))
            else:
                upserts.setdefault(name, (table, []))[1].append(
                    (vv, *(row[c] for c in table.columns))
                )
        self._done.clear()
        cursor = self.conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            for table, params in deletes.values():
                cursor.executemany(_delete_sql(table, self._mark, self._quote), params)
            for table, params in upserts.values():
                cursor.executemany(_upsert_sql(table, self._mark, self._quote, self._mysql), params)
        finally:
            cursor.close()

    @property
    def _mark(self) -> str:
        return "?" if self.conn.dialect.paramstyle == "qmark" else "%s"

    @property
    def _quote(self) -> Callable[[str], str]:
        return self.conn.dialect.identifier_preparer.quote


@cache
def _delete_sql(table: ViewTable, mark: str, quote: Callable[[str], str]) -> str:
    keys = " AND ".join(f"{quote(k)} = {mark}" for k in ("view_version", *table.key))
    return f"DELETE FROM {quote(table.physical.name)} WHERE {keys}"


@cache
def _upsert_sql(table: ViewTable, mark: str, quote: Callable[[str], str], mysql: bool) -> str:
    """INSERT … ON CONFLICT/ON DUPLICATE KEY UPDATE, written once per table and dialect."""
    columns = ("view_version", *table.columns)
    names = ", ".join(quote(c) for c in columns)
    values = ", ".join([mark] * len(columns))
    others = [c for c in table.columns if c not in table.key]
    insert = f"INSERT INTO {quote(table.physical.name)} ({names}) VALUES ({values})"
    if mysql:
        if not others:
            return insert.replace("INSERT INTO", "INSERT IGNORE INTO", 1)
        sets = ", ".join(f"{quote(c)} = VALUES({quote(c)})" for c in others)
        return f"{insert} ON DUPLICATE KEY UPDATE {sets}"
    conflict = ", ".join(quote(c) for c in ("view_version", *table.key))
    if not others:
        return f"{insert} ON CONFLICT ({conflict}) DO NOTHING"
    sets = ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in others)
    return f"{insert} ON CONFLICT ({conflict}) DO UPDATE SET {sets}"


def _normalize(row: Row) -> Row:
    """Driver values to plain Python (memoryview → bytes) so stores compare equal."""
    return {k: bytes(v) if isinstance(v, memoryview | bytearray) else v for k, v in row.items()}


def read_version_rows(conn: Connection, table: ViewTable, view_version: int) -> Iterator[Row]:
    """Every row of one version of a table, in key order (bytewise, R3)."""
    t = table.physical
    query = (
        sa.select(*(t.c[c] for c in table.columns))
        .where(t.c.view_version == view_version)
        .order_by(*(t.c[k] for k in table.key))
    )
    for row in conn.execute(query):
        yield _normalize(row._asdict())


def write_tuples(conn: Connection, table: ViewTable, rows: Sequence[RowTuple]) -> int:
    """Bulk-insert row tuples (``view_version`` first): one DBAPI executemany on SQLite;
    multi-row INSERTs with hex literals on the MySQL family (PyMySQL's executemany
    escapes every value in Python, which cost more than the rest of a rebuild)."""
    if not rows:
        return 0
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    sql = _insert_sql(table, mark, conn.dialect.identifier_preparer.quote)
    dbapi = conn.connection.dbapi_connection
    cursor = dbapi.cursor()  # type: ignore[union-attr]
    try:
        if mark == "?":
            # Many rows per statement: a tenth less per row than one-row statements.
            per = max(1, _SQLITE_PARAMS // (len(table.columns) + 1))
            full = len(rows) - len(rows) % per
            if full:
                many = _insert_sql(table, mark, conn.dialect.identifier_preparer.quote, per)
                chain = itertools.chain.from_iterable
                cursor.executemany(
                    many, [list(chain(rows[i : i + per])) for i in range(0, full, per)]
                )
            if full < len(rows):
                cursor.executemany(sql, rows[full:])
        else:
            escape = dbapi.escape  # type: ignore[union-attr]
            head = sql[: sql.index(" VALUES ") + 8]
            parts: list[str] = []
            size = 0
            for row in rows:
                text = "(" + ",".join([_literal(v, escape) for v in row]) + ")"
                parts.append(text)
                size += len(text) + 1
                if size >= _STATEMENT_BYTES:
                    cursor.execute(head + ",".join(parts))
                    parts, size = [], 0
            if parts:
                cursor.execute(head + ",".join(parts))
    finally:
        cursor.close()
    return len(rows)


#: Size of one multi-row INSERT on the MySQL family (well under max_allowed_packet).
_STATEMENT_BYTES = 2_000_000


def _literal(value: Any, escape: Callable[[Any], str]) -> str:
    """A view cell as SQL literal text: bytes as a hex literal (exact, any byte),
    integers in decimal, NULL; anything else through the driver's own escaping."""
    kind = type(value)
    if kind is bytes:
        return f"X'{value.hex()}'"
    if kind is int:
        return str(value)
    if value is None:
        return "NULL"
    return str(escape(value))


#: Parameters per multi-row INSERT on SQLite (its limit is 32766 since 3.32).
_SQLITE_PARAMS = 4000


@cache
def _insert_sql(table: ViewTable, mark: str, quote: Callable[[str], str], rows: int = 1) -> str:
    columns = ("view_version", *table.columns)
    one = f"({', '.join([mark] * len(columns))})"
    return (
        f"INSERT INTO {quote(table.physical.name)} ({', '.join(quote(c) for c in columns)}) "
        f"VALUES {', '.join([one] * rows)}"
    )
