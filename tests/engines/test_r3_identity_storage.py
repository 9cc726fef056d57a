"""R1/R3 on real engines: storage equality, unique indexes, ORDER BY and digest order agree.

The MariaDB server's default collation is case-insensitive
(utf8mb4_general_ci); identity columns must not inherit it.
"""

from __future__ import annotations

import unicodedata

import pytest
import sqlalchemy as sa

from domain.canonical import canonical_bytes
from domain.digests import Purpose, digest
from domain.errors import Conflict
from domain.identity import PackName
from ledger.log.db import Database
from ledger.log.sqltypes import Binary, dec, enc

NFC = unicodedata.normalize("NFC", "é")
NFD = unicodedata.normalize("NFD", "é")
IDENTITIES = ["Pack", "pack", "PACK", NFC, NFD, "packé", "パック", "🙂", "pack é", "Z", "a"]


def _table(md: sa.MetaData) -> sa.Table:
    return sa.Table(
        "identity_probe",
        md,
        sa.Column("pack", Binary(255), primary_key=True),
        sa.Column("label", Binary(255), nullable=False, unique=True),
    )


@pytest.mark.parametrize("engine_url", ["mariadb"], indirect=True)
def test_r3_server_default_collation_is_case_insensitive(db: Database) -> None:
    with db.read() as conn:
        collation = conn.exec_driver_sql("SELECT @@collation_database").scalar()
        assert str(collation).endswith("_ci")
        # The trap this rule avoids: the server's own comparison folds case and accents.
        assert conn.exec_driver_sql("SELECT 'Pack' = 'pack'").scalar() == 1


def test_r3_case_nfc_nfd_and_non_ascii_identities_are_distinct_rows(db: Database) -> None:
    md = sa.MetaData()
    table = _table(md)
    md.create_all(db.engine)
    values = [PackName(v) for v in IDENTITIES]
    with db.write() as conn:
        conn.execute(table.insert(), [{"pack": enc(v), "label": enc("L" + v)} for v in values])
    with db.read() as conn:
        stored = [dec(r[0]) for r in conn.execute(sa.select(table.c.pack).order_by(table.c.pack))]
        one = conn.execute(sa.select(sa.func.count()).where(table.c.pack == enc("pack"))).scalar()
    assert len(stored) == len(IDENTITIES)
    assert one == 1
    # SQL ORDER BY == Python bytewise sort == digest input order.
    assert stored == sorted(values)
    assert stored == sorted(values, key=lambda v: v.encode("utf-8"))
    assert digest(Purpose.CATALOG, canonical_bytes(stored)) == digest(
        Purpose.CATALOG, canonical_bytes(sorted(values))
    )


def test_r3_unique_index_rejects_only_the_exact_same_bytes(db: Database) -> None:
    md = sa.MetaData()
    table = _table(md)
    md.create_all(db.engine)
    with db.write() as conn:
        conn.execute(table.insert(), [{"pack": enc("p1"), "label": enc("Label")}])
        conn.execute(table.insert(), [{"pack": enc("p2"), "label": enc("label")}])
        conn.execute(table.insert(), [{"pack": enc("p3"), "label": enc(NFD)}])
        conn.execute(table.insert(), [{"pack": enc("p4"), "label": enc(NFC)}])
    with pytest.raises(Conflict), db.write() as conn:
        conn.execute(table.insert(), [{"pack": enc("p5"), "label": enc("label")}])
