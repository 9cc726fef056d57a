"""Initialized stores for tests without running ``init``'s DDL for every test.

``init_store`` on MariaDB creates 21 tables, their indexes and 14 SQL views: seconds of
DDL per test, and dropping the database afterwards as much again. Each test worker
therefore initializes a store once and hands out copies in exactly the state ``init``
leaves (the same tables, rows and views; a store id of its own):

- SQLite: the worker's template file is copied to the test's path.
- MariaDB: a database the previous test used is emptied (DML only) and given the rows
  ``init`` wrote. A database whose tables, columns, indexes or views a test changed (DDL,
  migrations, drift) is dropped, never reused; so is one that cannot be emptied.

Stores whose creation a test is about (``init`` itself, migrations from older versions)
still start from an empty database: only the ``world`` and ``db`` fixtures use these.
"""

from __future__ import annotations

import secrets
import shutil
import sqlite3
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql

from ledger.log.db import open_database
from ledger.store.init import init_store

Shape = tuple[tuple[Any, ...], ...]

#: Store URLs handed out already initialized: ``World`` and the ``db`` fixture skip
#: ``init`` on them.
INITIALIZED: set[str] = set()

#: The schema as the server describes it; a test that changed any of it (DDL) leaves a
#: database that is not reused.
SHAPE_QUERIES = (
    "SELECT table_name, table_type, engine, table_collation, create_options"
    " FROM information_schema.tables WHERE table_schema = DATABASE() ORDER BY 1",
    "SELECT table_name, column_name, ordinal_position, column_type, is_nullable,"
    " column_default, collation_name, extra FROM information_schema.columns"
    " WHERE table_schema = DATABASE() ORDER BY 1, 3",
    "SELECT table_name, index_name, seq_in_index, column_name, non_unique, sub_part"
    " FROM information_schema.statistics WHERE table_schema = DATABASE() ORDER BY 1, 2, 3",
    "SELECT table_name, view_definition FROM information_schema.views"
    " WHERE table_schema = DATABASE() ORDER BY 1",
    "SELECT trigger_name, event_object_table, action_statement FROM information_schema.triggers"
    " WHERE trigger_schema = DATABASE() ORDER BY 1",
    "SELECT constraint_name, table_name, constraint_type FROM information_schema.table_constraints"
    " WHERE constraint_schema = DATABASE() ORDER BY 2, 1",
)


def _new_store_id() -> bytes:
    return uuid.uuid4().hex.encode()


def initialize(url: str) -> None:
    database = open_database(url)
    try:
        init_store(database)
    finally:
        database.close()


class SqliteTemplate:
    """This worker's initialized SQLite store, copied for each test."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "template.db"
        initialize(f"sqlite:///{self.path}")  # closed: the WAL is checkpointed and gone
        assert not self.path.with_name("template.db-wal").exists()

    def copy_to(self, path: Path) -> None:
        shutil.copyfile(self.path, path)
        with sqlite3.connect(path) as conn:
            conn.execute(
                "UPDATE ledger_meta SET value = ? WHERE name = ?", (_new_store_id(), b"store_id")
            )
        conn.close()


@dataclass
class MariaDBStores:
    """This worker's initialized MariaDB databases: one per running test, reused after."""

    server_url: str
    connect: Any  # (database name | None) -> pymysql connection
    database_url: Any  # database name -> SQLAlchemy URL
    free: list[str] = field(default_factory=list)
    made: set[str] = field(default_factory=set)
    shape: Shape | None = None
    rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)

    def take(self) -> str:
        """The URL of a database in the state ``init`` leaves."""
        if self.free:
            return str(self.database_url(self.free.pop()))
        name = "cl_" + secrets.token_hex(5)
        with self.connect(None) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        self.made.add(name)
        url = str(self.database_url(name))
        initialize(url)
        if self.shape is None:
            with self.connect(name) as conn:
                self.shape = shape_of(conn, name)
                self.rows = _rows(conn)
        return url

    def give_back(self, url: str) -> None:
        """Empty the test's database for the next test, or drop it when it cannot be."""
        name = _name_of(url)
        try:
            with self.connect(name) as conn:
                if shape_of(conn, name) != self.shape:
                    raise _Changed
                self._reset(conn)
        except Exception:
            self._drop(name)
            return
        self.free.append(name)

    def _reset(self, conn: pymysql.connections.Connection[Any]) -> None:
        with conn.cursor() as cur:
            cur.execute("SET SESSION lock_wait_timeout = 10, innodb_lock_wait_timeout = 10")
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            cur.execute("SET SESSION foreign_key_checks = 0")
            conn.begin()
            for table in sorted(self.rows):
                cur.execute(f"DELETE FROM `{table}`")
                rows = self.rows[table]
                if rows:
                    marks = ", ".join(["%s"] * len(rows[0]))
                    cur.executemany(f"INSERT INTO `{table}` VALUES ({marks})", rows)
            cur.execute(
                "UPDATE ledger_meta SET value = %s WHERE name = %s",
                (_new_store_id(), b"store_id"),
            )
        conn.commit()

    def _drop(self, name: str) -> None:
        self.made.discard(name)
        with self.connect(None) as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name}")

    def keep(self, url: str) -> str:
        """A copy of the store at ``url`` (rows only: the shape is ``init``'s), kept until
        this worker ends; returns its database name for ``restore``."""
        name = _name_of(self.take())
        self._copy(_name_of(url), name)
        return name

    def restore(self, kept: str, url: str) -> None:
        """Make the store at ``url`` a row-for-row copy of the ``kept`` one (DML only)."""
        self._copy(kept, _name_of(url))

    def _copy(self, kept: str, target: str) -> None:
        with self.connect(target) as conn:
            with conn.cursor() as cur:
                cur.execute("SET SESSION foreign_key_checks = 0")
                conn.begin()
                for table in sorted(self.rows):
                    cur.execute(f"DELETE FROM `{table}`")
                    cur.execute(f"INSERT INTO `{table}` SELECT * FROM `{kept}`.`{table}`")
            conn.commit()

    def close(self) -> None:
        for name in sorted(self.made):
            self._drop(name)
        self.free.clear()


def _name_of(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]


class BuiltStores:
    """Stores a test module fills with an expensive history once per worker, then copies
    into each test's own store (a byte copy on SQLite, a row copy on MariaDB), so that
    the cases that only read or damage the history do not each rebuild it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.mariadb: MariaDBStores | None = None  # set by the fixture for a MariaDB store
        self.kept: dict[tuple[str, str], tuple[str, Any]] = {}

    def restore(self, key: str, url: str) -> Any | None:
        """Copy the history kept under ``key`` for ``url``'s engine into ``url``'s store
        and return what its builder returned; None when nothing is kept yet."""
        engine = url.split(":", 1)[0]
        found = self.kept.get((key, engine))
        if found is None:
            return None
        source, value = found
        if engine == "sqlite":
            _sqlite_copy(source, url.removeprefix("sqlite:///"))
        else:
            self._mariadb().restore(source, url)
        return value

    def keep(self, key: str, url: str, value: Any) -> None:
        """Keep a copy of the store at ``url`` under ``key`` (with ``value``)."""
        engine = url.split(":", 1)[0]
        if engine == "sqlite":
            source = str(self.folder / f"{key}.db")
            _sqlite_copy(url.removeprefix("sqlite:///"), source)
        else:
            source = self._mariadb().keep(url)
        self.kept[(key, engine)] = (source, value)

    def _mariadb(self) -> MariaDBStores:
        assert self.mariadb is not None, "a MariaDB store comes from the mariadb_stores fixture"
        return self.mariadb


def _sqlite_copy(source: str, target: str) -> None:
    """A consistent copy through SQLite's backup API (the WAL included)."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()


class _Changed(Exception):
    """The test changed the database's schema: it is not reused."""


def shape_of(conn: pymysql.connections.Connection[Any], name: str) -> Shape:
    """The schema, with the database's own name (views name it) taken out."""
    with conn.cursor() as cur:
        out: list[tuple[Any, ...]] = []
        for query in SHAPE_QUERIES:
            cur.execute(query)
            out.append(tuple(repr(tuple(row)).replace(name, "<db>") for row in cur.fetchall()))
        return tuple(out)


def _rows(conn: pymysql.connections.Connection[Any]) -> dict[str, list[tuple[Any, ...]]]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE'"
        )
        tables = [str(row[0]) for row in cur.fetchall()]
        rows: dict[str, list[tuple[Any, ...]]] = {}
        for table in tables:
            cur.execute(f"SELECT * FROM `{table}`")
            rows[table] = [tuple(row) for row in cur.fetchall()]
        return rows
