"""The declared schema as a contract (R24): compare the live database with it.

The tables the code declares (``ledger.log.tables`` and the projections'
tables) are the contract. ``differences`` inspects the live database and
names every way it differs: a table, a column and its type family (binary
identities must stay binary, R3), the primary key, every unique key and
index, and the schema version in ``ledger_meta``.

A difference is *safe* when ``init`` (or ``doctor --repair``) can restore it
without touching data: a missing secondary index, or a missing view table
(views are rebuilt from the log). Everything else is unsafe, and every command
but the few that only read files refuses to run on such a store (INTEGRITY,
naming the difference) before it reads or writes anything else.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.errors import IntegrityFailure
from ledger.log import tables as log_tables
from ledger.log.db import Database, translate_errors
from ledger.log.sqltypes import enc
from ledger.store import migrations

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
    from ledger.store.init import all_metadata

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


def differences(conn: Connection, dialect: str) -> list[Difference]:
    """Every difference between the live database and the declared schema."""
    inspector = sa.inspect(conn)
    live_tables = set(inspector.get_table_names())
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
    assert at is not None
    for table in declared_tables(at):
        name = table.name
        if name not in live_tables:
            safe = name not in _LOG_TABLES  # a view is rebuilt from the log
            found.append(Difference(f"table {name}", "present", "missing", safe))
            continue
        columns = {c["name"]: c for c in inspector.get_columns(name)}
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
    return found


def check(db: Database) -> list[Difference]:
    """The differences of the store at ``db`` (one inspection, a few ms)."""
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
    """Restore the safe differences (missing secondary indexes) under the migration lock,
    then diff again. Missing view tables are created by ``init`` itself."""
    missing = [d for d in check(db) if d.safe and d.object.startswith("index ")]
    if missing:
        with translate_errors(), migration_lock(db) as conn:
            live = {
                (t, tuple(i["column_names"]))
                for t in sa.inspect(conn).get_table_names()
                for i in sa.inspect(conn).get_indexes(t)
            }
            named = {d.object for d in missing}
            for table in declared_tables():
                for index in table.indexes:
                    if f"index {index.name} on {table.name}" not in named:
                        continue
                    if (table.name, tuple(c.name for c in index.columns)) not in live:
                        index.create(conn, checkfirst=True)
        db.engine.dispose()  # DDL ran: later work uses fresh connections
    return check(db)


@contextmanager
def migration_lock(db: Database) -> Iterator[Connection]:
    """The migration lock: a locked row of the store's own meta table (R24).

    ``GET_LOCK`` is refused under Galera; a row lock works on SQLite, MariaDB,
    Galera and TiDB alike. MySQL-family DDL commits implicitly, so the lock is
    held by its own transaction while the DDL runs on a second connection;
    SQLite runs the DDL inside the locking (``BEGIN IMMEDIATE``) transaction.
    """
    meta, name = log_tables.meta, enc("migration_lock")
    if db.is_sqlite:
        with db.write() as conn:
            yield conn
        return
    with db.engine.connect() as lock:
        with lock.begin():
            exists = lock.execute(sa.select(meta.c.name).where(meta.c.name == name)).first()
            if exists is None:
                with suppress(sa.exc.IntegrityError):
                    lock.execute(meta.insert(), {"name": name, "value": b"free"})
        with lock.begin():
            lock.execute(sa.select(meta.c.value).where(meta.c.name == name).with_for_update())
            with db.engine.connect() as ddl:
                yield ddl
                ddl.commit()
