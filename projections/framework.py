"""The projection framework: one ``apply`` code path for inline, catch-up, rebuild and verify.

A projection declares a name, a code version, its tables and the event types it
consumes, and implements ``apply(event, rows)`` against a ``RowStore``:

* ``SqlRowStore`` writes through a SQLAlchemy connection into the rows of one
  *view version* — used inline (inside the append transaction) and by the
  catch-up runner;
* ``MemoryRowStore`` keeps rows in dictionaries — used to verify a live view
  against a fresh replay, and to rebuild a view that has no kernel.

A rebuild from position 0 runs each view's ``Replayer`` (``Projection.replayer``):
a kernel that turns decoded events straight into row tuples, bulk-written as the
next view version. ``apply`` stays the definition: a kernel that raises is
replaced by ``apply`` for that view, and ``projections verify`` compares what a
kernel built with a replay through ``apply`` (R20, R21).

Blue/green without DDL: every physical view table has a leading
``view_version`` key column. ``projection_state`` names the live version of
each projection; a rebuild writes version n+1 beside version n and the swap is
one UPDATE of ``projection_state`` in the transaction that also applies the
last events. Readers always select ``view_version = live`` (the SQL views
named ``_System_…`` do that join), so they see one complete version.
"""

from __future__ import annotations

import itertools
import sqlite3
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from operator import itemgetter
from typing import Any, ClassVar

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.errors import IntegrityFailure, Stale
from domain.event_types import EVENT_TYPES, decode_state
from domain.log import LoggedEvent
from ledger.log.sqltypes import BigInt, Binary, Blob, mysql_errors
from projections.tables import metadata

Row = dict[str, Any]
Key = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class ViewEvent:
    """A log row as projections see it: position, event type name and current-version state.

    Events are self-describing (they carry the pack, install id … they are
    about), so projections need nothing else from the row.
    """

    position: int
    type: str
    data: dict[str, Any]

    @classmethod
    def decode(cls, row: LoggedEvent) -> ViewEvent:
        """Decode through the type table: v0 and v1 rows alike, upcast (R23)."""
        return cls(row.position, *decode_state(row.position, row.topic, row.state))


@dataclass(frozen=True)
class ViewTable:
    """A logical view table and its physical, versioned table."""

    name: str
    physical: sa.Table
    key: tuple[str, ...]
    columns: tuple[str, ...]

    def key_of(self, row: Row) -> Key:
        key = self.key
        if len(key) == 1:
            return (row[key[0]],)
        return _getter(key)(row)


def code_mismatch(name: str, built_with: int, code: int) -> Stale:
    """A view built by other code than this program's is never served nor written (R25)."""
    return Stale(
        f"view {name} was built by view code version {built_with}, this program has "
        f"version {code}: it is not served until `catalog-ledger projections rebuild {name}` "
        "swaps in a version built by this code",
        axis="projection",
        view=name,
        built_with_code_version=built_with,
        code_version=code,
    )


@cache
def stored_topics(types: frozenset[str]) -> frozenset[str]:
    """Every stored topic (both log formats, every version) of the event types ``types``."""
    return frozenset(EVENT_TYPES.topics_of(types))


@cache
def _getter(key: tuple[str, ...]) -> Callable[[Row], Key]:
    return itemgetter(*key)


def view_table(
    name: str,
    physical_name: str,
    key: Sequence[str],
    *columns: sa.Column[Any],
    indexes: Sequence[Sequence[str]] = (),
) -> ViewTable:
    """Declare a view table; ``view_version`` leads its primary key."""
    cols = [sa.Column("view_version", sa.Integer(), primary_key=True, autoincrement=False)]
    for column in columns:
        if column.name in key:
            column.primary_key = True
            column.nullable = False
        cols.append(column)
    # WITHOUT ROWID on SQLite: the primary key is the clustered index, as on
    # InnoDB, so bulk writes maintain one B-tree instead of two.
    table = sa.Table(physical_name, metadata, *cols, sqlite_with_rowid=False)
    for number, index_cols in enumerate(indexes):
        sa.Index(
            f"ix_{physical_name}_{number}", table.c.view_version, *(table.c[c] for c in index_cols)
        )
    return ViewTable(
        name=name,
        physical=table,
        key=tuple(key),
        columns=tuple(c.name for c in columns),
    )


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


#: One row of a view version as the rebuild writes it: ``view_version`` then the
#: table's columns in declaration order (a list where a kernel updates it in place).
RowTuple = tuple[Any, ...] | list[Any]
#: A rebuild handler: (log position, decoded current-version state) -> None.
Handler = Callable[[int, dict[str, Any]], None]


class Replayer(ABC):
    """A projection's rebuild kernel: the rows of one view version, built in memory.

    ``handlers`` maps an event type name to a function of (position, decoded state)
    that updates ``rows`` (key -> row tuple, see ``RowTuple``). A kernel is an
    optimized transcription of its projection's ``apply``: on any exception the
    runner discards the kernel and replays that view through ``apply`` instead, so
    poison events are reported by ``apply`` itself, and ``projections verify``
    (which always replays through ``apply``) checks a kernel's rows against it.
    """

    def __init__(self, view_version: int) -> None:
        self.view_version = view_version
        self.handlers: dict[str, Handler] = {}

    @abstractmethod
    def tables(self) -> list[tuple[ViewTable, Mapping[Key, RowTuple]]]:
        """Every table of the view with its rows (any order; written in key order)."""


class TableReplayer(Replayer):
    """A kernel of a one-table view: ``rows`` of ``table``, keyed as the table is."""

    table: ClassVar[ViewTable]

    def __init__(self, view_version: int) -> None:
        super().__init__(view_version)
        self.rows: dict[Key, RowTuple] = {}

    def tables(self) -> list[tuple[ViewTable, Mapping[Key, RowTuple]]]:
        return [(self.table, self.rows)]


class GenericReplayer(Replayer):
    """``apply`` into a ``MemoryRowStore``: the rebuild of a view without a kernel."""

    def __init__(self, projection: Projection, view_version: int) -> None:
        super().__init__(view_version)
        self.projection = projection
        self.memory = MemoryRowStore()
        apply, memory = projection.apply, self.memory
        for name in projection.types:

            def handler(position: int, data: dict[str, Any], name: str = name) -> None:
                apply(ViewEvent(position, name, data), memory)

            self.handlers[name] = handler

    def tables(self) -> list[tuple[ViewTable, Mapping[Key, RowTuple]]]:
        vv = self.view_version
        out: list[tuple[ViewTable, Mapping[Key, RowTuple]]] = []
        for table in self.projection.tables:
            columns = table.columns
            out.append(
                (
                    table,
                    {
                        key: (vv, *[row[c] for c in columns])
                        for key, row in self.memory.rows(table).items()
                    },
                )
            )
        return out


class Projection(ABC):
    """A pure function of the log into view rows (R20)."""

    name: ClassVar[str]
    version: ClassVar[int]
    tables: ClassVar[tuple[ViewTable, ...]]
    #: The event type names (``domain.event_types``) the projection applies.
    types: ClassVar[frozenset[str]]
    #: Inline projections are applied inside the append transaction (core views).
    inline: ClassVar[bool] = True
    #: Relative replay cost, used to balance parallel rebuilds (measured, rough).
    weight: ClassVar[float] = 1.0

    @abstractmethod
    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        """Write the rows this event implies; raise to report a poison event."""

    def replayer(self, view_version: int) -> Replayer:
        """The rebuild kernel of this view (default: ``apply`` into memory)."""
        return GenericReplayer(self, view_version)


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
        for start in range(0, len(missing), _GET_MANY_CHUNK):
            chunk = missing[start : start + _GET_MANY_CHUNK]
            query = sa.select(*(t.c[c] for c in table.columns)).where(
                t.c.view_version == self.view_version,
                sa.tuple_(*columns).in_(chunk)
                if len(columns) > 1
                else columns[0].in_([k[0] for k in chunk]),
            )
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


# -- projection state -----------------------------------------------------------------------

state_table = sa.Table(
    "projection_state",
    metadata,
    sa.Column("name", Binary(64), primary_key=True),
    sa.Column("code_version", sa.Integer(), nullable=False),
    sa.Column("live_version", sa.Integer(), nullable=False),
    sa.Column("position", BigInt(), nullable=False),
    sa.Column("chain", Binary(32), nullable=False),
    sa.Column("mode", Binary(16), nullable=False),
    sa.Column("stopped", sa.Boolean(), nullable=False),
    sa.Column("error", Blob(), nullable=True),
    sa.Column("building_version", sa.Integer(), nullable=True),
)


@dataclass
class ProjectionState:
    name: str
    code_version: int
    live_version: int
    position: int
    chain: bytes
    mode: str
    stopped: bool
    error: dict[str, Any] | None
    building_version: int | None = None

    @classmethod
    def from_row(cls, row: Any) -> ProjectionState:
        """A ``projection_state`` row; a cell that is not what the schema declares is an
        edited row: INTEGRITY naming the table (never an internal error)."""
        try:
            return cls._from_row(row)
        except (TypeError, ValueError, AttributeError) as exc:  # orjson's: a ValueError
            name = row.name if isinstance(row.name, bytes) else None
            raise IntegrityFailure(
                f"a projection_state row is not what the schema declares "
                f"({type(exc).__name__}: {exc}); the views can be made afresh from the "
                "log: `catalog-ledger export --jsonl --out log.jsonl`, then `init` and "
                "`import --jsonl log.jsonl` into a new store",
                table="projection_state",
                view=name.decode(errors="replace") if name is not None else None,
            ) from None

    @classmethod
    def _from_row(cls, row: Any) -> ProjectionState:
        return cls(
            name=bytes(row.name).decode(),
            code_version=int(row.code_version),
            live_version=int(row.live_version),
            position=int(row.position),
            chain=bytes(row.chain),
            mode=bytes(row.mode).decode(),
            stopped=bool(row.stopped),
            error=orjson.loads(row.error) if row.error is not None else None,
            building_version=int(row.building_version)
            if row.building_version is not None
            else None,
        )

    def values(self) -> dict[str, Any]:
        return {
            "name": self.name.encode(),
            "code_version": self.code_version,
            "live_version": self.live_version,
            "position": self.position,
            "chain": self.chain,
            "mode": self.mode.encode(),
            "stopped": self.stopped,
            "error": orjson.dumps(self.error) if self.error is not None else None,
            "building_version": self.building_version,
        }


def load_states(conn: Connection, *, lock: bool = False) -> dict[str, ProjectionState]:
    query = sa.select(state_table)
    if lock and conn.dialect.name in ("mysql", "mariadb"):
        query = query.with_for_update()
    return {s.name: s for s in (ProjectionState.from_row(r) for r in conn.execute(query))}


def save_state(conn: Connection, state: ProjectionState) -> None:
    values = state.values()
    updated = conn.execute(
        state_table.update().where(state_table.c.name == values["name"]).values(values)
    )
    if updated.rowcount == 0:
        conn.execute(state_table.insert().values(values))


@dataclass
class ApplyOutcome:
    """What applying a batch did: how far it got and the poison event, if any."""

    position: int
    chain: bytes
    error: dict[str, Any] | None = field(default=None)


#: Errors of the database (a lost connection, a lock timeout), not of an event: an
#: inline apply re-raises them, so the append fails typed and nothing is written,
#: instead of stopping the view as if the event were poison.
def database_errors() -> tuple[type[BaseException], ...]:
    return mysql_errors("MySQLError", also=(sa.exc.SQLAlchemyError, sqlite3.Error))


def apply_rows(
    projection: Projection,
    rows: Sequence[LoggedEvent],
    store: RowStore,
    *,
    start: int,
    start_chain: bytes,
) -> ApplyOutcome:
    """Apply ``rows`` in order; stop at the first event the projection cannot apply."""
    position, chain = start, start_chain
    topics = stored_topics(projection.types)
    buffered = store if isinstance(store, SqlRowStore) else None
    for row in rows:
        if row.topic in topics:
            # A row that does not decode is the log's damage (INTEGRITY naming it), not
            # a poison event of this view: it propagates, and the append or read fails.
            event = ViewEvent.decode(row)
            try:
                projection.apply(event, store)
            except database_errors():
                raise  # the store failed, not the event: the transaction aborts
            except Exception as exc:
                if buffered is not None:
                    buffered.discard_event()
                return ApplyOutcome(
                    position,
                    chain,
                    {
                        "position": row.position,
                        "topic": row.topic,
                        "error": f"{type(exc).__name__}: {exc}",
                    },
                )
            if buffered is not None:
                buffered.commit_event()
        position, chain = row.position, row.chain
    return ApplyOutcome(position, chain)
