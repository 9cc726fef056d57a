"""Opening a store: URL handling, engine settings per dialect, error mapping.

One code path serves SQLite (embedded default) and the MySQL family (MySQL 8,
MariaDB 10.11, TiDB over PyMySQL). The differences live here and only here:

* SQLite runs in WAL mode with ``synchronous=FULL`` (every commit is durable
  on return). Write transactions start with ``BEGIN IMMEDIATE`` so the head
  row lock is taken up front; read transactions start with a deferred
  ``BEGIN`` and see one consistent snapshot.
* MySQL-family write transactions run at READ COMMITTED behind
  ``SELECT ... FOR UPDATE`` on the head row; read transactions run at
  REPEATABLE READ, so every statement in one read sees the same snapshot.

Every driver failure is translated into a typed ``LedgerError`` here, so no
caller ever sees a driver exception or a traceback.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url

from domain.errors import (
    Conflict,
    IntegrityFailure,
    InvalidInput,
    LedgerError,
    Permission,
    Unavailable,
)
from ledger.log.sqltypes import mysql_errors

Dialect = Literal["sqlite", "mysql"]

#: SQLite's page cache per connection, in KiB (``PRAGMA cache_size``).
SQLITE_CACHE_KIB = 65536
_BEGIN_OPTION = "catalog_ledger_begin"
# Error numbers that mean "another transaction won": a duplicate key (1062), a
# deadlock, which is also how Galera reports a certification failure (1213), and
# TiDB's write conflicts (9007 write conflict, 8002 "can not retry select for
# update", 8022 optimistic transaction retry failed). The command re-reads.
_MYSQL_CONFLICTS = {1062, 1213, 9007, 8002, 8022}
# Transient failures the caller may simply retry: a lock wait timeout (1205) and
# TiDB's "information schema changed" (8028) after concurrent DDL.
_MYSQL_RETRYABLE = {1205, 8028}
# MySQL / MariaDB client/server errors that mean "cannot reach or use the server".
_MYSQL_UNAVAILABLE = {1049, 2002, 2003, 2005, 2006, 2013, 2055}
# The server is up but refuses this account: access denied to a database (1044), a
# login refused (1045: wrong user or password; 1698: MariaDB's answer for an account
# it does not know or that logs in by a plugin such as unix_socket), a table or column
# command denied (1142, 1143), a privilege missing (1227). PERMISSION (exit 7), never
# "server down".
_MYSQL_PERMISSION = {1044, 1045, 1142, 1143, 1227, 1698}


def _normalize(url_text: str) -> tuple[URL, Dialect]:
    try:
        url_text.encode("utf-8")
    except UnicodeEncodeError:  # undecodable argv bytes arrive as lone surrogates
        raise InvalidInput("the database URL is not valid UTF-8", field="db") from None
    try:
        url = make_url(url_text)
    except Exception:
        raise InvalidInput(
            "the database URL could not be parsed; expected sqlite:///PATH or "
            "mysql+pymysql://USER@HOST:PORT/DATABASE",
            field="db",
        ) from None
    backend = url.get_backend_name()
    driver = url.get_driver_name() if "+" in url.drivername else ""
    if backend == "sqlite" and driver in ("", "pysqlite"):
        database = url.database or ""
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            raise InvalidInput(
                "an in-memory SQLite database is not a durable store; give a file path",
                field="db",
            )
        if url.query or database.startswith("file:"):
            # The driver would ignore ?mode=ro (and friends) and open the file
            # read-write: refuse rather than pretend.
            raise InvalidInput(
                "SQLite URL options (such as ?mode=ro) are not supported; give "
                "sqlite:///PATH (read-only commands never write)",
                field="db",
            )
        return url.set(drivername="sqlite+pysqlite"), "sqlite"
    if backend in ("mysql", "mariadb", "tidb") and driver in ("", "pymysql"):
        if not url.database:
            raise InvalidInput("the MySQL URL must name a database", field="db")
        query = dict(url.query)
        query.setdefault("charset", "utf8mb4")
        return url.set(drivername="mysql+pymysql", query=query), "mysql"
    raise InvalidInput(
        f"unsupported database URL scheme {url.drivername!r}; use sqlite:/// or mysql+pymysql://",
        field="db",
    )


@dataclass
class Database:
    """An opened store: the engines and the dialect-specific transaction rules.

    On the MySQL family, writes and reads use two pools whose connections are
    set once to READ COMMITTED and REPEATABLE READ respectively, so no
    per-transaction ``SET`` round trip is needed on the hot path.
    """

    engine: Engine
    dialect: Dialect
    display_url: str
    read_engine: Engine
    #: The full URL (password included) for worker processes; never printed.
    url: str = field(default="", repr=False)
    #: Autocommit connections for single-statement reads (MySQL family only).
    statement_engine: Engine | None = None
    _local: threading.local = field(default_factory=threading.local, repr=False)
    _held: list[Any] = field(default_factory=list, repr=False)
    _held_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: SQLite: write connections idle between write transactions (``write``).
    _idle_writes: list[Connection] = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)
    #: A SQLite store's file and its (device, inode) when it was opened.
    sqlite_file: tuple[Path, int, int] | None = None

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    def vanished(self) -> str | None:
        """Why a SQLite store is no longer the file it was opened as (removed or replaced
        while open connections still read the old one), else ``None``."""
        if self.sqlite_file is None:
            return None
        path, device, inode = self.sqlite_file
        try:
            found = path.stat()
        except OSError:
            return f"the store's file {path} was removed"
        if (found.st_dev, found.st_ino) != (device, inode):
            return f"the store's file {path} was replaced by another file"
        return None

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction; the caller locks the head row first.

        On SQLite a write takes one of the few connections kept idle between write
        transactions and gives it back after (the file is local: nothing to ping or
        reconnect). That spares a pool checkout, a connection object and its options:
        about 45 us of the ~65 us this scaffolding cost per commit. None is tied to a
        thread, so threads that come and go pin nothing. One whose transaction failed
        is closed, and one from a pool that ``engine.dispose()`` replaced is not reused.
        """
        if not self.is_sqlite:
            with translate_errors(), self.engine.connect() as conn, conn.begin():
                yield conn
            return
        with translate_errors():
            conn = self._take_write_connection()
            try:
                with conn.begin():
                    yield conn
            except BaseException:
                _release(conn, reuse=False)
                raise
            self._give_back_write_connection(conn)

    def _take_write_connection(self) -> Connection:
        pool, stale = self.engine.pool, []
        conn: Connection | None = None
        with self._held_lock:
            while self._idle_writes and conn is None:
                candidate = self._idle_writes.pop()
                if not candidate.invalidated and candidate.info.get(_POOL) is pool:
                    conn = candidate
                else:
                    stale.append(candidate)
        for old in stale:
            _release(old, reuse=False)
        if conn is None:
            conn = self.engine.connect().execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
            conn.info[_POOL] = pool
        return conn

    def _give_back_write_connection(self, conn: Connection) -> None:
        current = conn.info.get(_POOL) is self.engine.pool
        with self._held_lock:
            if current and not self._closed and len(self._idle_writes) < IDLE_WRITES:
                self._idle_writes.append(conn)
                return
        _release(conn, reuse=current)

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """One consistent snapshot for every statement inside the block."""
        with translate_errors(), self.read_engine.connect() as conn, conn.begin():
            yield conn

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one self-contained SELECT outside any transaction; return all rows.

        One statement is one consistent snapshot on every engine, so a read that
        fits in one statement needs no BEGIN/COMMIT round trips: SQLite runs it in
        its implicit statement transaction, the MySQL family in autocommit mode
        (a single-statement REPEATABLE READ transaction). Each thread keeps one
        DBAPI connection for these reads (no pool checkout per read, no ping); a
        connection found dropped is discarded and the statement retried once.
        """
        with translate_errors():
            for attempt in (1, 2):
                raw = self._statement_connection()
                try:
                    cursor = raw.cursor()
                    try:
                        cursor.execute(sql, params)
                        return list(cursor.fetchall())
                    finally:
                        cursor.close()
                except mysql_errors("OperationalError", "InterfaceError") as exc:
                    number = exc.args[0] if exc.args else None
                    self._drop_statement_connection(raw)
                    if attempt == 2 or number not in (0, 2006, 2013, 2055):
                        raise
        raise AssertionError("unreachable")  # pragma: no cover

    def data_version(self) -> int | None:
        """SQLite: ``PRAGMA data_version`` of this thread's statement connection, which
        changes whenever another connection (of any process) commits to the file; a
        reader may reuse what it read while it is unchanged. ``None`` on other engines."""
        if not self.is_sqlite:
            return None
        with translate_errors():
            cursor = self._statement_connection().cursor()
            try:
                cursor.execute("PRAGMA data_version")
                return int(cursor.fetchone()[0])
            finally:
                cursor.close()

    def _statement_connection(self) -> Any:
        raw = getattr(self._local, "raw", None)
        if raw is None:
            raw = (self.statement_engine or self.engine).raw_connection()
            self._local.raw = raw
            with self._held_lock:
                self._held.append(raw)
        return raw

    def _drop_statement_connection(self, raw: Any) -> None:
        self._local.raw = None
        with self._held_lock:
            if raw in self._held:
                self._held.remove(raw)
        with suppress(Exception):
            raw.invalidate()

    def close(self) -> None:
        with self._held_lock:
            held, self._held = self._held, []
            self._closed = True
            idle, self._idle_writes = self._idle_writes, []
        for raw in held:
            with suppress(Exception):
                raw.close()
        for conn in idle:  # maybe from a pool ``engine.dispose()`` replaced: close them
            _release(conn, reuse=False)
        self.engine.dispose()
        for other in (self.read_engine, self.statement_engine):
            if other is not None and other is not self.engine:
                other.dispose()


#: Write connections a SQLite ``Database`` keeps idle between write transactions.
IDLE_WRITES = 4
_POOL = "catalog_ledger_pool"


def _release(conn: Connection, *, reuse: bool) -> None:
    """Give a write connection back to its pool (``reuse``), or close its driver
    connection (it failed, or its pool was disposed of)."""
    with suppress(Exception):
        if not reuse:
            conn.invalidate()
        conn.close()


def open_database(url_text: str, *, pool_size: int = 5, create: bool = True) -> Database:
    """Open (but do not initialize) the store at ``url_text``.

    ``create=False`` refuses a SQLite file that does not exist instead of
    leaving a new empty one behind (only ``init`` creates a store).
    """
    url, dialect = _normalize(url_text)
    display = url.render_as_string(hide_password=True)
    if dialect == "sqlite":
        path = Path(url.database or "").expanduser()
        if not create and not path.is_file():
            raise InvalidInput(
                f"there is no store at {path} (no such file); `catalog-ledger init` creates one",
                field="db",
                path=str(path),
            )
        engine = _sqlite_engine(url)
        opened = None
        with suppress(OSError):
            found = path.stat()
            opened = (path.resolve(), found.st_dev, found.st_ino)
        return Database(
            engine=engine,
            dialect=dialect,
            display_url=display,
            read_engine=engine,
            url=url.render_as_string(hide_password=False),
            sqlite_file=opened,
        )

    from pymysql.constants import CLIENT  # the driver: only for a MySQL-family store

    def mysql_engine(
        isolation: str, *, pre_ping: bool = True, overflow: int = pool_size, flags: int = 0
    ) -> Engine:
        engine = sa.create_engine(
            url,
            isolation_level=isolation,
            pool_size=pool_size,
            max_overflow=overflow,
            pool_recycle=3600,
            # Every transaction is ended explicitly (commit or rollback) by
            # `write`/`read`, so the pool's extra ROLLBACK round trip is not needed.
            pool_reset_on_return=None,
            connect_args={
                "connect_timeout": 5,
                "read_timeout": 600,
                "write_timeout": 600,
                # SQLAlchemy's own FOUND_ROWS (matched-row counts) is kept beside extras.
                **({"client_flag": CLIENT.FOUND_ROWS | flags} if flags else {}),
            },
        )
        if pre_ping:
            _ping_when_idle(engine)
        _share_tls_context(engine)
        return engine

    return Database(
        # Multi-statement packets for the writer: an append sends its rows and the head
        # update in one round trip (``LedgerRecorder``); every value is escaped by the
        # driver, nothing is ever spliced in from input.
        engine=mysql_engine("READ COMMITTED", flags=CLIENT.MULTI_STATEMENTS),
        dialect=dialect,
        display_url=display,
        read_engine=mysql_engine("REPEATABLE READ"),
        # Single-statement reads retry once on a dropped connection instead of
        # paying a ping round trip on every checkout (see Database.statement).
        statement_engine=mysql_engine("AUTOCOMMIT", pre_ping=False, overflow=64),
        url=url.render_as_string(hide_password=False),
    )


_TLS_LOCK = threading.Lock()
_TLS_CONTEXT: list[Any] = []  # PyMySQL's context for opportunistic TLS, built once


def _share_tls_context(engine: Engine) -> None:
    """Connect through PyMySQL with one TLS context per process for the default case.

    Given no ``ssl*`` option, PyMySQL builds a fresh ``ssl.SSLContext`` for every
    connection (opportunistic TLS: used if the server offers it, no verification),
    which loads the system's CA store: about 20 ms of CPU per connection, more than
    the connection itself on loopback. The context is the same every time and a client
    context may serve any number of connections, so the first one built is kept and
    reused: the TLS each connection negotiates is unchanged. A connection given its
    own ``ssl`` options builds its own context as before."""
    import pymysql.connections

    class Connection(pymysql.connections.Connection):
        def _create_ssl_ctx(self, sslp: Any) -> Any:
            if not (isinstance(sslp, dict) and not sslp):
                return super()._create_ssl_ctx(sslp)  # type: ignore[misc]
            with _TLS_LOCK:
                if not _TLS_CONTEXT:
                    _TLS_CONTEXT.append(super()._create_ssl_ctx(sslp))  # type: ignore[misc]
                return _TLS_CONTEXT[0]

    @sa.event.listens_for(engine, "do_connect")
    def connect(dialect: Any, record: Any, cargs: Any, cparams: Any) -> Any:
        return Connection(*cargs, **cparams)


#: A pooled connection unused for longer than this is pinged before it is handed out.
IDLE_PING_SECONDS = 5.0


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection at checkout only when it sat idle ``IDLE_PING_SECONDS``.

    A server restart, a failover or ``wait_timeout`` leaves idle connections dead, and
    the ping finds them before a transaction does (the pool then opens a fresh one). A
    connection checked in moments ago is as alive as a ping would show, so the hot path
    (one append after another, one read after another) pays no ping round trip; a
    connection lost since is reported by its first statement (UNAVAILABLE)."""

    @sa.event.listens_for(engine, "checkin")
    def checkin(dbapi_connection: Any, record: Any) -> None:
        record.info["checked_in"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        last = record.info.get("checked_in")
        if last is not None and time.monotonic() - last > IDLE_PING_SECONDS:
            try:
                dbapi_connection.ping(reconnect=False)
            except Exception as exc:  # the pool retries with a new connection
                raise sa.exc.DisconnectionError(str(exc)) from exc


def _sqlite_engine(url: URL) -> Engine:
    path = url.database or ""
    if not path.startswith("file:"):
        parent = Path(path).expanduser().resolve().parent
        if not parent.is_dir():
            raise Unavailable(
                f"the directory {parent} does not exist", field="db", path=str(parent)
            )
    # Reads keep one connection per thread (Database.query): allow a server's
    # thread pool to hold one each.
    engine = sa.create_engine(
        url, connect_args={"timeout": 60}, pool_reset_on_return=None, pool_size=5, max_overflow=64
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let this module, not the driver, decide where transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA busy_timeout = 60000")
            mode = cursor.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode and str(mode[0]).lower() != "wal":
                raise Unavailable(f"SQLite refused WAL mode (got {mode[0]})", field="db")
            cursor.execute("PRAGMA synchronous = FULL")
            # A page cache that holds a large catalog's hot index pages (the default is
            # 2 MiB): the views' keyed lookups inside an append stay in memory (R30).
            cursor.execute(f"PRAGMA cache_size = -{SQLITE_CACHE_KIB}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
        # Straight to the driver: this runs on every transaction.
        conn.connection.dbapi_connection.execute(f"BEGIN {mode}")  # type: ignore[union-attr]

    return engine


def _root(exc: BaseException) -> BaseException:
    orig = getattr(exc, "orig", None)
    return orig if isinstance(orig, BaseException) else exc


_UTF8_COLUMN = re.compile(r"Could not decode to UTF-8 column '([^']*)'")


def translate(exc: BaseException) -> LedgerError:
    """Map a driver or SQLAlchemy failure onto the typed errors of DESIGN.md."""
    if isinstance(exc, LedgerError):
        return exc
    root = _root(exc)
    if isinstance(root, sqlite3.Error):
        text = str(root)
        lowered = text.lower()
        if "file is not a database" in lowered or "malformed" in lowered:
            return InvalidInput(
                f"the file is not a SQLite database: {text}", field="db", driver_error=text
            )
        if "locked" in lowered or "busy" in lowered:
            return Conflict(f"the database is busy: {text}", driver_error=text)
        if isinstance(root, sqlite3.IntegrityError):
            return Conflict(f"a concurrent write won: {text}", driver_error=text)
        if lowered.startswith("could not decode to utf-8 column"):
            # A TEXT cell holding bytes that are not UTF-8: SQLite's dynamic typing lets a
            # hand edit (``CAST(x AS TEXT)`` of binary) store it. The row is tampered
            # (INTEGRITY naming the column); the driver's text would print those bytes.
            found = _UTF8_COLUMN.match(text)
            column = found.group(1) if found else None
            return IntegrityFailure(
                f"a stored cell of column {column} is TEXT that is not UTF-8, not the value "
                "its column declares; the row was edited outside the store",
                column=column,
            )
        if "no such table" in lowered:
            return InvalidInput(
                "the database has no Catalog Ledger schema; run `catalog-ledger init`",
                field="db",
                driver_error=text,
            )
        return Unavailable(f"SQLite could not be used: {text}", driver_error=text)
    if isinstance(root, mysql_errors("MySQLError")):
        number = root.args[0] if root.args and isinstance(root.args[0], int) else None
        text = str(root.args[1]) if len(root.args) > 1 else str(root)
        if not text.strip():
            # PyMySQL reports a connection closed under it as InterfaceError(0, '').
            text = f"the connection was closed ({type(root).__name__} {number})"
        if number in _MYSQL_CONFLICTS:
            return Conflict(f"a concurrent write won: {text}", driver_error=text, errno=number)
        if number in _MYSQL_RETRYABLE:
            return Unavailable(
                f"the server asked for a retry: {text}",
                driver_error=text,
                errno=number,
                retryable=True,
            )
        if number in _MYSQL_PERMISSION:
            return Permission(
                f"the MySQL server refused this account: {text}", driver_error=text, errno=number
            )
        if number == 1146:
            return InvalidInput(
                "the database has no Catalog Ledger schema; run `catalog-ledger init`",
                field="db",
                driver_error=text,
            )
        if number in _MYSQL_UNAVAILABLE or isinstance(
            root, mysql_errors("OperationalError", "InterfaceError")
        ):
            return Unavailable(
                f"the MySQL server could not be used: {text}", driver_error=text, errno=number
            )
        return Unavailable(f"the MySQL server failed: {text}", driver_error=text, errno=number)
    if isinstance(exc, sa.exc.TimeoutError):
        return Unavailable(f"no database connection became free: {exc}")
    if isinstance(exc, sa.exc.SQLAlchemyError | OSError):
        return Unavailable(f"the database could not be used: {exc}")
    raise exc


@contextmanager
def translate_errors() -> Iterator[None]:
    """Re-raise driver failures as typed errors (typed errors pass through)."""
    try:
        yield
    except (LedgerError, BrokenPipeError):
        raise  # a closed stdout is the reader's business, not the store's
    except mysql_errors("MySQLError", also=(sa.exc.SQLAlchemyError, sqlite3.Error, OSError)) as exc:
        raise translate(exc) from exc


def stream_rows(conn: Connection, query: Any, chunk: int = 4096) -> Iterator[Sequence[Any]]:
    """The rows of ``query`` in chunks, as plain tuples, without keeping them all: on
    SQLite straight from the DBAPI cursor of the caller's transaction, elsewhere through
    a server-side (streamed) result."""
    if conn.dialect.name == "sqlite":
        sql = str(query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(sql)
            while rows := cursor.fetchmany(chunk):
                yield rows
        finally:
            cursor.close()
        return
    result = conn.execute(query.execution_options(stream_results=True))
    for rows in result.partitions(chunk):
        yield [tuple(r) for r in rows]
