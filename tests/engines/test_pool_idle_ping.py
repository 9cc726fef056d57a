"""Pooled MariaDB connections are pinged only after sitting idle.

The pool used to ping every connection it handed out: one round trip more on every
append and every read. Now a connection idle for longer than ``IDLE_PING_SECONDS`` is
pinged (and replaced when dead) and one used moments ago is not: a connection the
server dropped since is reported by its first statement, typed, and replaced.
"""

from __future__ import annotations

import pymysql
import pytest
from sqlalchemy.engine import make_url

from domain.errors import Unavailable
from ledger.log import db as db_module
from ledger.log.db import Database, open_database
from ledger.store.init import init_store


def _write_connection_id(db: Database) -> int:
    with db.write() as conn:
        return int(conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one())


def _kill(url: str, connection_id: int) -> None:
    u = make_url(url)
    with (
        pymysql.connect(
            host=u.host, port=u.port or 3306, user=u.username, password=u.password or ""
        ) as admin,
        admin.cursor() as cur,
    ):
        cur.execute(f"KILL {connection_id}")


def test_pool_an_idle_dead_connection_is_pinged_and_replaced(
    mysql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = open_database(mysql_url)
    try:
        init_store(db)
        dead = _write_connection_id(db)
        _kill(mysql_url, dead)
        monkeypatch.setattr(db_module, "IDLE_PING_SECONDS", 0.0)  # every checkout is "idle"
        fresh = _write_connection_id(db)  # the ping found it dead: a new one, no error
        assert fresh != dead
    finally:
        db.close()


def test_pool_a_connection_used_moments_ago_is_not_pinged(
    mysql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = open_database(mysql_url)
    try:
        init_store(db)
        monkeypatch.setattr(db_module, "IDLE_PING_SECONDS", 3600.0)
        dead = _write_connection_id(db)
        _kill(mysql_url, dead)
        with pytest.raises(Unavailable):  # no ping: the first statement finds it dead
            _write_connection_id(db)
        assert _write_connection_id(db) != dead  # ... and the pool replaced it
    finally:
        db.close()


def test_pool_connections_share_one_tls_context_with_pymysqls_own_settings(
    mysql_url: str,
) -> None:
    """Every connection of every engine uses the one context PyMySQL would have built for
    it (opportunistic TLS, no verification): built once per process, not per connection."""
    import ssl

    db = open_database(mysql_url)
    try:
        contexts = []
        for engine in (db.engine, db.read_engine, db.statement_engine):
            assert engine is not None
            with engine.connect() as conn:
                dbapi = conn.connection.dbapi_connection
                assert dbapi is not None
                contexts.append(dbapi.ctx)
        assert len({id(c) for c in contexts}) == 1
        assert contexts[0] is db_module._TLS_CONTEXT[0]
        u = make_url(mysql_url)
        own = pymysql.connect(
            host=u.host, port=u.port or 3306, user=u.username, password=u.password or ""
        )
        try:
            own_ctx = own.ctx  # type: ignore[attr-defined]  # PyMySQL's, untyped
            assert own_ctx is not contexts[0]  # a plain PyMySQL connection builds its own
            settings = ("verify_mode", "check_hostname", "options", "verify_flags")
            assert [getattr(contexts[0], s) for s in settings] == [
                getattr(own_ctx, s) for s in settings
            ]
            assert contexts[0].verify_mode is ssl.CERT_NONE
        finally:
            own.close()
    finally:
        db.close()
