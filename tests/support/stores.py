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
        name = url.rsplit("/", 1)[1].split("?", 1)[0]
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

    def close(self) -> None:
        for name in sorted(self.made):
            self._drop(name)
        self.free.clear()


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
