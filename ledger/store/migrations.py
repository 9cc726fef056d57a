"""Numbered schema migrations (R24): each step takes a store from version N-1 to N.

``migrate`` runs the pending steps in order under the migration lock (a locked
row of ``ledger_meta``), re-reading the stored version once it holds the lock,
so many processes starting at once apply each step exactly once. A step only
creates tables or indexes and then records its version: no step ever changes a
stored event byte, so a migrated store's audit root is the one it had before.
Downgrades are refused; a version this program does not know is tampering or a
newer release's store (INTEGRITY).

Version 1 is the 0.1 schema. Version 2 adds ``ledger_lease``, the writer
lease's coordination row (renewals move its expiry outside the log), and the
audience credentials view. Version 3 adds ``ledger_checkpoint``, the cosigned
checkpoints of the catalog log (R29). ``Store.migrate`` then finishes like ``init``: the
projection states of new views are created and those views built from the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TypedDict

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.errors import IntegrityFailure, MigrationRequired
from ledger.log import tables as log_tables
from ledger.log.db import Database, translate_errors
from ledger.log.sqltypes import dec, enc
from ledger.store.metadata import all_metadata

FIRST_VERSION = 1
_VERSION_KEY = enc("schema_version")


@dataclass(frozen=True)
class Step:
    """One numbered migration: from ``version - 1`` to ``version``."""

    version: int
    summary: str
    #: The tables this step creates; the schema contract of an older store omits them.
    creates: tuple[str, ...]
    run: Callable[[Connection], None]


def _creating(*names: str) -> Callable[[Connection], None]:
    """A step that creates the declared tables ``names`` (if missing)."""

    def run(conn: Connection) -> None:
        for md in all_metadata():
            for table in md.sorted_tables:
                if table.name in names:
                    table.create(conn, checkfirst=True)

    return run


_V2_TABLES = (log_tables.lease.name, "view_credential")
_V3_TABLES = (log_tables.checkpoint.name,)

STEPS: tuple[Step, ...] = (
    Step(
        2,
        "create ledger_lease (the writer lease's coordination row: renewals move its "
        "expiry) and view_credential (audience credentials, built from the log)",
        _V2_TABLES,
        _creating(*_V2_TABLES),
    ),
    Step(
        3,
        "create ledger_checkpoint (the cosigned catalog-log checkpoints the collector "
        "stores and the server serves with proof bundles, R29)",
        _V3_TABLES,
        _creating(*_V3_TABLES),
    ),
)

#: The schema version each table first appears in (absent: version 1).
TABLE_SINCE: dict[str, int] = {t: s.version for s in STEPS for t in s.creates}

assert [s.version for s in STEPS] == list(
    range(FIRST_VERSION + 1, log_tables.SCHEMA_VERSION + 1)
), "every schema version after the first has exactly one numbered step"


class AppliedStep(TypedDict):
    version: int
    summary: str


# What ``migrate`` did (or, with ``dry_run``, would do). ``from`` is a keyword,
# so this TypedDict is declared by the functional syntax.
MigrateResult = TypedDict(
    "MigrateResult",
    {"from": int, "to": int, "applied": list[AppliedStep], "dry_run": bool},
)


#: The stored field that holds the schema version, as errors name it.
VERSION_FIELD = "ledger_meta.schema_version"


def parse_version(stored: bytes | None) -> int | None:
    """The stored schema version, ``None`` when absent or not a version number."""
    if stored is None:
        return None
    text = dec(stored)
    return int(text) if text.isascii() and text.isdigit() and len(text) < 10 else None


def read_version(conn: Connection) -> tuple[int | None, str]:
    """(the stored version, or ``None`` when the row is absent; the stored text).

    A value that is not a decimal version number stored as bytes (TEXT or a number
    written by a hand edit, any other text) is INTEGRITY naming the field: the row
    was edited outside the store; no view rebuild can repair it.
    """
    stored = conn.execute(
        sa.select(log_tables.meta.c.value).where(log_tables.meta.c.name == _VERSION_KEY)
    ).scalar()
    if stored is None:
        return None, "none"
    if not isinstance(stored, bytes | bytearray | memoryview):
        raise malformed_version(
            f"a {type(stored).__name__} value {stored!r}, where the schema declares binary"
        )
    text = bytes(stored).decode("utf-8", errors="backslashreplace")
    if not (text.isascii() and text.isdigit() and len(text) < 10):
        raise malformed_version(f"{text!r}, which is not a decimal version number")
    return int(text), text


def malformed_version(found: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"{VERSION_FIELD} holds {found}: the row was edited outside the store (it is "
        "not derived from the log: restore it from a backup, or write the version the "
        "store's tables have)",
        rule="R24",
        field=VERSION_FIELD,
        found=found,
    )


def known(version: int | None) -> bool:
    return version is not None and FIRST_VERSION <= version <= log_tables.SCHEMA_VERSION


def pending(version: int) -> list[Step]:
    return [s for s in STEPS if s.version > version]


def require_current(version: int | None, text: str) -> None:
    """Refuse an older store (MIGRATION_REQUIRED) or an unknown version (INTEGRITY)."""
    if version == log_tables.SCHEMA_VERSION:
        return
    if known(version):
        raise MigrationRequired(
            f"the store has schema version {text}, this program needs "
            f"{log_tables.SCHEMA_VERSION}: run `catalog-ledger migrate`",
            rule="R24",
            found=version,
            expected=log_tables.SCHEMA_VERSION,
            hint="catalog-ledger migrate",
        )
    raise unknown_version(text)


def unknown_version(text: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"the store has schema version {text!r}, which this program does not know "
        f"(it knows {FIRST_VERSION} to {log_tables.SCHEMA_VERSION}); a newer store is "
        "never downgraded",
        rule="R24",
        field=VERSION_FIELD,
        found=text,
        expected=log_tables.SCHEMA_VERSION,
    )


def migrate(db: Database, *, dry_run: bool = False) -> MigrateResult:
    """Run every pending step under the migration lock (or list them, ``dry_run``)."""
    with translate_errors():
        with db.engine.connect() as conn:
            before, text = read_version(conn)
        if not known(before):
            raise unknown_version(text)
        assert before is not None
        if dry_run or not pending(before):
            return {
                "from": before,
                "to": log_tables.SCHEMA_VERSION,
                "applied": [_applied(s) for s in pending(before)],
                "dry_run": dry_run,
            }
        with migration_lock(db) as conn:
            version, text = read_version(conn)  # another process may have migrated
            if not known(version):
                raise unknown_version(text)
            assert version is not None
            steps = pending(version)
            for step in steps:
                step.run(conn)
                conn.execute(
                    log_tables.meta.update()
                    .where(log_tables.meta.c.name == _VERSION_KEY)
                    .values(value=enc(str(step.version)))
                )
        db.engine.dispose()  # DDL ran: later work uses fresh connections (and metadata)
    return {
        "from": before,
        "to": log_tables.SCHEMA_VERSION,
        "applied": [_applied(s) for s in steps],
        "dry_run": False,
    }


def _applied(step: Step) -> AppliedStep:
    return {"version": step.version, "summary": step.summary}


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
