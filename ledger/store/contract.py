"""The declared schema as a contract (R24): compare the live database with it.

The tables the code declares (``ledger.log.tables`` and the projections'
tables) are the contract. ``differences`` inspects the live database and
names every way it differs: a table, a column and its type family (binary
identities must stay binary, R3), the primary key, every unique key and
index, and the schema version in ``ledger_meta``.

A difference is *safe* when ``init`` (or ``doctor --repair``) can restore it
without touching data: a missing secondary index, or a missing view table
(views are rebuilt from the log), or an extra column every insert can leave
out (nullable or with a default). Everything else is unsafe, and every command
but the few that only read files refuses to run on such a store (INTEGRITY,
naming the difference) before it reads or writes anything else: among them an
extra ``NOT NULL`` column without a default (every insert into its table
fails) and a ``ledger_head`` that is missing or does not name the last row of
``ledger_events`` (``ledger.store.head``; ``doctor --repair`` rebuilds it from
the log once the chain verifies).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateIndex, CreateTable

from domain.errors import IntegrityFailure
from ledger.log import tables as log_tables
from ledger.log.db import Database, translate_errors
from ledger.store import head as head_row
from ledger.store import migrations
from ledger.store.causal import catch_up
from ledger.store.metadata import all_metadata
from ledger.store.migrations import migration_lock

_LOG_TABLES = frozenset(t.name for t in log_tables.metadata.sorted_tables)
#: How ``doctor`` marks an older, known schema version: ``migrate`` resolves it.
MIGRATE_HINT = "(run `catalog-ledger migrate`)"


@dataclass(frozen=True)
class Difference:
    """One way the live database differs from the declared schema."""

    object: str
    expected: str
    found: str
    safe: bool
    #: The store is at an older, known schema version: ``migrate`` resolves it.
    migration: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "object": self.object,
            "expected": self.expected,
            "found": self.found,
            "safe": self.safe,
        }


def declared_tables(version: int = log_tables.SCHEMA_VERSION) -> list[sa.Table]:
    """The tables a store at schema ``version`` has (later steps' tables omitted)."""
    return [
        t
        for md in all_metadata()
        for t in md.sorted_tables
        if migrations.TABLE_SINCE.get(t.name, migrations.FIRST_VERSION) <= version
    ]


def _family(kind: Any) -> str:
    """The comparison semantics of a column type: what R3 and the code rely on."""
    if isinstance(kind, sa.types.TypeDecorator):
        kind = kind.impl
    name = type(kind).__name__.upper()
    if (
        isinstance(kind, sa.LargeBinary | sa.VARBINARY | sa.BINARY)
        or "BLOB" in name
        or "BINARY" in name
    ):
        return "binary"
    if isinstance(kind, sa.Integer | sa.Boolean) or "INT" in name or "BOOL" in name:
        return "integer"
    if isinstance(kind, sa.String | sa.Text) or "CHAR" in name or "TEXT" in name:
        return "text"
    return name.lower()


def _declared_family(column: sa.Column[Any], dialect: str) -> str:
    """The family of the type ``dialect`` gets (a declared type may vary by dialect)."""
    variants: dict[str, Any] = getattr(column.type, "_variant_mapping", {})
    return _family(variants.get("mysql" if dialect != "sqlite" else "sqlite", column.type))


def differences(conn: Connection, dialect: str, *, fast: bool = True) -> list[Difference]:
    """Every difference between the live database and the declared schema.

    The common case costs a few queries: when the live catalog rows show every
    declared table exactly as declared (``_matches_declared``) and the stored
    version is the current one, the table-by-table diff would find nothing, so only
    the version and the head row are read. Anything else (any drift, an older
    version, a catalog row this check does not recognise) runs the detailed
    inspector diff, which names every difference as before.
    """
    if fast and _matches_declared(conn, dialect):
        live = {t.name for t in declared_tables()}
        found = _version_differences(conn, live)[0]
        if not found:
            return _head_differences(conn, found, live)
    return detailed_differences(conn, dialect)


def _matches_declared(conn: Connection, dialect: str) -> bool:
    """True only if the live catalog shows every declared table (current version)
    exactly as this program creates it, so the detailed diff's tables find nothing.

    One or two catalog queries, whatever the number of tables. Any doubt is False
    (the detailed diff then runs): a missing or extra column, a type family, a key
    or an index that differs, a catalog row this check does not recognise.
    """
    tables = declared_tables()
    if dialect == "sqlite":
        return _sqlite_matches(conn, tables)
    if dialect in ("mysql", "mariadb"):
        return _mysql_matches(conn, tables)
    return False


def _sqlite_matches(conn: Connection, tables: list[sa.Table]) -> bool:
    """SQLite keeps each table's and index's ``CREATE`` text: when every declared one
    reads exactly as this program's DDL (what ``init`` ran), the store has the shape
    of a fresh one (no extra or missing column, same types, keys and indexes)."""
    rows = conn.exec_driver_sql(
        "SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'index')"
    ).all()
    # SQLite keeps the statement's text as run, trailing blanks included.
    live = {(str(kind), str(name)): str(sql).strip() for kind, name, sql in rows if sql}
    dialect = conn.dialect
    for table in tables:
        want = str(CreateTable(table).compile(dialect=dialect)).strip()
        if live.get(("table", table.name)) != want:
            return False
        for index in table.indexes:
            want = str(CreateIndex(index).compile(dialect=dialect)).strip()
            if index.name is None or live.get(("index", str(index.name))) != want:
                return False
    return True


# Three single-table queries: joining two information_schema tables costs ~15 ms
# on MariaDB 10.11, more than the inspector's whole diff.
_MYSQL_TABLES = sa.text(
    "SELECT TABLE_NAME FROM information_schema.TABLES"
    " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_TYPE = 'BASE TABLE' AND TABLE_NAME IN :names"
).bindparams(sa.bindparam("names", expanding=True))
_MYSQL_COLUMNS = sa.text(
    "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS"
    " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN :names"
).bindparams(sa.bindparam("names", expanding=True))
_MYSQL_KEYS = sa.text(
    "SELECT TABLE_NAME, INDEX_NAME, NON_UNIQUE, COLUMN_NAME"
    " FROM information_schema.STATISTICS"
    " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN :names"
    " ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX"
).bindparams(sa.bindparam("names", expanding=True))


def _mysql_matches(conn: Connection, tables: list[sa.Table]) -> bool:
    """MySQL/MariaDB: the declared tables' columns and keys from information_schema
    (three queries), compared as the detailed diff compares the reflected ones: the
    same column names, the family of the class the dialect reflects each type as,
    the primary key in order, every declared unique key and index present."""
    names = [t.name for t in tables]
    # Base tables only, as the inspector lists them (a view of a declared name is "missing").
    base = {_text(name) for (name,) in conn.execute(_MYSQL_TABLES, {"names": names})}
    if not all(name in base for name in names):
        return False
    columns: dict[str, dict[str, str]] = {}
    for table, column, kind in conn.execute(_MYSQL_COLUMNS, {"names": names}):
        columns.setdefault(_text(table), {})[_text(column)] = _text(kind).lower()
    keys: dict[str, dict[str, tuple[bool, list[str | None]]]] = {}
    for table, index, non_unique, column in conn.execute(_MYSQL_KEYS, {"names": names}):
        entry = keys.setdefault(_text(table), {}).setdefault(
            _text(index), (int(non_unique) == 0, [])
        )
        entry[1].append(None if column is None else _text(column))
    ischema: dict[str, Any] = getattr(conn.dialect, "ischema_names", {})
    for table in tables:
        live = columns.get(table.name)
        if live is None or set(live) != {c.name for c in table.columns}:
            return False
        for column in table.columns:
            kind = ischema.get(live[column.name])
            if kind is None:
                return False
            try:
                got = _family(kind())
            except Exception:  # a type the dialect cannot build bare: let the inspector say
                return False
            if got != _declared_family(column, "mysql"):
                return False
        live_keys = keys.get(table.name, {})
        primary = live_keys.get("PRIMARY", (True, []))[1]
        if primary != [c.name for c in table.primary_key.columns]:
            return False
        indexes = {tuple(cols) for key, (_, cols) in live_keys.items() if key != "PRIMARY"}
        unique = {tuple(cols) for key, (uq, cols) in live_keys.items() if uq and key != "PRIMARY"}
        for constraint in table.constraints:
            if isinstance(constraint, sa.UniqueConstraint) and (
                tuple(c.name for c in constraint.columns) not in unique
            ):
                return False
        for index in table.indexes:
            if tuple(c.name for c in index.columns) not in indexes:
                return False
    return True


def _text(value: object) -> str:
    """A catalog value as text (some servers hand information_schema back as bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _version_differences(
    conn: Connection, live_tables: set[str]
) -> tuple[list[Difference], int | None]:
    """The schema version's differences, and the version to compare the tables at."""
    found: list[Difference] = []
    version: int | None = log_tables.SCHEMA_VERSION
    malformed = False
    if log_tables.meta.name in live_tables:
        try:
            version, text = migrations.read_version(conn)
        except IntegrityFailure as exc:  # not a version number at all
            version, text, malformed = None, str(exc.details["found"]), True
            found.append(
                Difference(migrations.VERSION_FIELD, "a decimal version number", text, False)
            )
        if version != log_tables.SCHEMA_VERSION and not malformed:
            older = migrations.known(version)
            found.append(
                Difference(
                    "schema version",
                    str(log_tables.SCHEMA_VERSION),
                    f"{text} {MIGRATE_HINT}" if older else text,
                    False,
                    migration=older,
                )
            )
    # An older store is compared with the schema of its own version.
    at = version if migrations.known(version) else log_tables.SCHEMA_VERSION
    return found, at


def detailed_differences(conn: Connection, dialect: str) -> list[Difference]:
    """Every difference, table by table through the SQLAlchemy inspector."""
    inspector = sa.inspect(conn)
    live_tables = set(inspector.get_table_names())
    found, at = _version_differences(conn, live_tables)
    assert at is not None
    for table in declared_tables(at):
        name = table.name
        if name not in live_tables:
            safe = name not in _LOG_TABLES  # a view is rebuilt from the log
            missing = f"missing {REPAIR_HINT}" if repairable(name) and not safe else "missing"
            found.append(Difference(f"table {name}", "present", missing, safe))
            continue
        columns = {c["name"]: c for c in inspector.get_columns(name)}
        declared = {c.name for c in table.columns}
        for extra, reflected in columns.items():
            if extra in declared:
                continue
            blocking = not reflected.get("nullable", True) and reflected.get("default") is None
            blocking = (
                blocking and not reflected.get("computed") and not reflected.get("autoincrement")
            )
            found.append(
                Difference(
                    f"column {name}.{extra}",
                    "absent",
                    f"present, NOT NULL without a default: every insert into {name} fails"
                    if blocking
                    else "present (nullable or with a default: inserts still work)",
                    not blocking,
                )
            )
        for column in table.columns:
            live = columns.get(column.name)
            if live is None:
                found.append(
                    Difference(f"column {name}.{column.name}", "present", "missing", False)
                )
                continue
            want, got = _declared_family(column, dialect), _family(live["type"])
            if want != got:
                found.append(Difference(f"column {name}.{column.name}", want, got, False))
        declared_pk = [c.name for c in table.primary_key.columns]
        live_pk = list(inspector.get_pk_constraint(name).get("constrained_columns") or [])
        if declared_pk != live_pk:
            found.append(
                Difference(
                    f"primary key of {name}",
                    ", ".join(declared_pk),
                    ", ".join(live_pk) or "none",
                    False,
                )
            )
        indexes = inspector.get_indexes(name)
        live_unique: set[tuple[str | None, ...]] = {
            tuple(u["column_names"]) for u in inspector.get_unique_constraints(name)
        }
        live_unique |= {tuple(i["column_names"]) for i in indexes if i.get("unique")}
        for constraint in table.constraints:
            if isinstance(constraint, sa.UniqueConstraint):
                cols = tuple(c.name for c in constraint.columns)
                if cols not in live_unique:
                    found.append(
                        Difference(
                            f"unique key {name}({', '.join(cols)})", "present", "missing", False
                        )
                    )
        live_indexes: set[tuple[str | None, ...]] = {tuple(i["column_names"]) for i in indexes}
        for index in table.indexes:
            cols = tuple(c.name for c in index.columns)
            if cols not in live_indexes and cols not in live_unique:
                found.append(
                    Difference(f"index {index.name} on {name}", "present", "missing", True)
                )
    return _head_differences(conn, found, live_tables)


def _head_differences(
    conn: Connection, found: list[Difference], live_tables: set[str]
) -> list[Difference]:
    """``found`` and the head row's difference, when the head can be compared."""
    if _head_readable(found, live_tables):
        try:
            check = head_row.read(conn)
        except IntegrityFailure as exc:  # a row of another type: repaired like a wrong one
            found.append(Difference("ledger_head", "the head row", exc.message, False))
        else:
            if not check.ok:
                found.append(Difference("ledger_head", check.expected(), check.found(), False))
    return found


#: Missing tables ``doctor --repair`` creates: every derived one (the views, rebuilt
#: from the log; the publisher's fragments and the Merkle subtree cache, refilled on
#: demand) and the head row's table (its row rebuilt from the log).
_REPAIRABLE_LOG_TABLES = frozenset((log_tables.head.name, log_tables.merkle.name))


def repairable(table: str) -> bool:
    return table not in _LOG_TABLES or table in _REPAIRABLE_LOG_TABLES


REPAIR_HINT = head_row.REPAIR_HINT


def _head_readable(found: list[Difference], live_tables: set[str]) -> bool:
    """Both tables are there with every declared column: the head can be compared."""
    names = (log_tables.events.name, log_tables.head.name)
    if not all(n in live_tables for n in names):
        return False
    return not any(
        d.object.startswith((f"column {n}.", f"table {n}")) and not d.safe
        for d in found
        for n in names
    )


def check(db: Database) -> list[Difference]:
    """The differences of the store at ``db`` (one inspection, a few ms)."""
    catch_up(db)  # a Galera node shows what the cluster committed before this check
    with translate_errors(), db.engine.connect() as conn:
        return differences(conn, db.dialect)


def require(db: Database, *, allow_older: bool = False) -> None:
    """Refuse a store whose schema differs unsafely from the declared one (R24).

    A store at an older schema version is refused with MIGRATION_REQUIRED, unless
    ``allow_older`` (the read-only audit commands read every version this release
    knows); any other unsafe difference is INTEGRITY, checked first.
    """
    found = check(db)
    unsafe = [d for d in found if not d.safe and not d.migration]
    if not unsafe and not allow_older and any(d.migration for d in found):
        with translate_errors(), db.engine.connect() as conn:
            migrations.require_current(*migrations.read_version(conn))
    if unsafe:
        first = unsafe[0]
        raise IntegrityFailure(
            f"the store's schema differs from the one this program declares: {first.object}: "
            f"expected {first.expected}, found {first.found}; `catalog-ledger doctor` lists "
            "every difference",
            rule="R24",
            differences=[d.to_json() for d in unsafe],
        )


def repair(db: Database) -> list[Difference]:
    """Restore what ``doctor --repair`` can restore from the log, then diff again.

    Under the migration lock: every missing derived table (views, the publisher's
    fragments, the Merkle subtree cache) and ``ledger_head`` are created, and every
    missing secondary index. Then a head row that is missing or does not name the last
    stored row is rebuilt, once every event id and chain link up to that row verifies
    (a broken chain: INTEGRITY naming the position, nothing written), and every view
    whose table was lost is rebuilt from the log.
    """
    found = check(db)
    lost = {
        d.object.removeprefix("table ")
        for d in found
        if d.object.startswith("table ") and d.found.startswith("missing")
    }
    tables = [t for t in declared_tables() if t.name in lost and repairable(t.name)]
    indexes = {d.object for d in found if d.safe and d.object.startswith("index ")}
    if tables or indexes:
        with translate_errors(), migration_lock(db) as conn:
            for table in tables:
                table.create(conn, checkfirst=True)
            inspector = sa.inspect(conn)
            live = {
                (t, tuple(i["column_names"]))
                for t in inspector.get_table_names()
                for i in inspector.get_indexes(t)
            }
            for table in declared_tables():
                for index in table.indexes:
                    if f"index {index.name} on {table.name}" not in indexes:
                        continue
                    if (table.name, tuple(c.name for c in index.columns)) not in live:
                        index.create(conn, checkfirst=True)
        db.engine.dispose()  # DDL ran: later work uses fresh connections
    if any(d.object == "ledger_head" for d in found) or log_tables.head.name in lost:
        rebuild_head(db)
    rebuild_lost_views(db, {t.name for t in tables})
    return check(db)


def rebuild_head(db: Database) -> None:
    """The head row rebuilt from the log in one write transaction (``ledger.store.head``),
    the schema first checked: nothing else may differ unsafely in the log's tables."""
    log = (log_tables.events.name, log_tables.head.name)
    blocking = [
        d
        for d in check(db)
        if not d.safe
        and d.object != "ledger_head"
        and (d.object == migrations.VERSION_FIELD or any(n in d.object for n in log))
    ]
    if blocking:
        return  # reported by the diff after repair; the head waits for a sound schema
    from ledger.log.recorder import LedgerRecorder

    with db.write() as conn:
        head_row.rebuild(conn, LedgerRecorder(db))


def lost_view_tables(db: Database) -> set[str]:
    """The view and derived tables missing from the store right now."""
    with translate_errors(), db.engine.connect() as conn:
        live = set(sa.inspect(conn).get_table_names())
    return {t.name for t in declared_tables() if t.name not in live and t.name not in _LOG_TABLES}


def rebuild_lost_views(db: Database, tables: set[str], *, skip: Sequence[str] = ()) -> list[str]:
    """Rebuild from the log every view one of whose ``tables`` was lost (and just
    recreated, empty): the names rebuilt. Views with no state yet get one first."""
    from ledger.store.runtime import Ledger
    from projections.registry import ALL_PROJECTIONS
    from projections.state import state_table

    names = [p.name for p in ALL_PROJECTIONS if any(t.physical.name in tables for t in p.tables)]
    states = {state_table.name} & tables  # every view's state row was lost with it
    if not names and not states:
        return []
    ledger = Ledger(db)
    with db.write() as conn:
        created = ledger.runner.ensure_states(conn)
    chosen = [n for n in dict.fromkeys([*names, *created]) if n not in skip]
    with db.read() as conn:
        empty = ledger.recorder.head_in(conn).position == 0
    if chosen and not empty:
        ledger.runner.rebuild(db, chosen)
    return chosen
