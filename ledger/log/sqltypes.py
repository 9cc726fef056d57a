"""Column types shared by every table, so identity semantics are declared once.

Identity columns are binary on every dialect (R3): ``VARBINARY`` on the MySQL
family and ``BLOB`` on SQLite. Comparison, unique indexes and ``ORDER BY`` are
then bytewise everywhere, whatever the server's default collation is. Text
identities are stored as their UTF-8 bytes (see ``enc``/``dec``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from domain.errors import IntegrityFailure

MYSQL_FAMILY = ("mysql", "mariadb")


def mysql_errors(
    *names: str, also: tuple[type[Exception], ...] = ()
) -> tuple[type[Exception], ...]:
    """``also`` and PyMySQL's exception classes ``names`` (``pymysql.err``) once the
    driver is loaded. The driver is imported only when a MySQL-family store is opened,
    so a command on a SQLite store never pays for it (issue 25.7); until then nothing
    can raise one of its errors, so none are needed to catch them."""
    err = sys.modules.get("pymysql.err")
    return also + (tuple(getattr(err, name) for name in names) if err is not None else ())


def Binary(length: int) -> sa.types.TypeEngine[bytes]:
    """A bounded binary identity column (indexable on MySQL)."""
    return sa.LargeBinary().with_variant(sa.VARBINARY(length), *MYSQL_FAMILY)


class LongBlob(sa.LargeBinary):
    """MySQL's ``LONGBLOB`` (the compiler's ``visit_LONGBLOB``), declared without
    importing ``sqlalchemy.dialects.mysql``: a SQLite store never loads the MySQL
    dialect (issue 25.7). Binds and results are those of every binary type."""

    __visit_name__ = "LONGBLOB"


def Blob() -> sa.types.TypeEngine[bytes]:
    """An unbounded binary value (event state, facts, fragment bodies)."""
    return sa.LargeBinary().with_variant(LongBlob(), *MYSQL_FAMILY)


def BigInt() -> sa.types.TypeEngine[int]:
    """64-bit integer; on SQLite ``INTEGER`` so a primary key aliases the rowid."""
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def enc(text: str) -> bytes:
    """Identity text to its stored bytes."""
    return text.encode("utf-8")


def dec(data: bytes) -> str:
    """Stored identity bytes back to text (they were valid UTF-8 on write).

    Anything else (TEXT or a number stored by a hand edit, bytes that are not
    UTF-8) is tampering: INTEGRITY, never a crash.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise IntegrityFailure(
            f"a stored identity is {type(data).__name__}, where the schema declares binary: "
            "a view row was edited outside the store; `catalog-ledger projections rebuild` "
            "rebuilds it from the log",
            found=type(data).__name__,
        )
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise IntegrityFailure(
            "a stored identity is not UTF-8: a row was edited outside the store"
        ) from None


#: Keys per statement for ``keys_in``: one OR term each, well under SQLite's expression
#: depth limit (1000).
KEYS_PER_STATEMENT = 200


def keys_in(
    fixed: Sequence[sa.ColumnElement[bool]],
    columns: Sequence[sa.ColumnElement[Any]],
    keys: Sequence[Sequence[Any]],
) -> sa.ColumnElement[bool]:
    """``fixed AND (columns) IN keys``, written so that each key is one index seek.

    Given a row-value ``IN`` list, SQLite and MariaDB seek the index only on the
    columns before it (``fixed``) and test every row those select against the list: a
    cost that grows with the table, not the keys (R30). Each key spelled out as its
    own ``AND`` term is one seek of the whole key (SQLite's MULTI-INDEX OR, MariaDB's
    range access). Keep ``keys`` to ``KEYS_PER_STATEMENT``."""
    if len(columns) == 1:
        return sa.and_(*fixed, columns[0].in_([k[0] for k in keys]))
    return sa.or_(
        *(sa.and_(*fixed, *(c == v for c, v in zip(columns, key, strict=True))) for key in keys)
    )
