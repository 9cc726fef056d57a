"""The log's tables and the schema version; DDL artifacts are generated from here.

``ledger_events`` is the one table of events (DESIGN "The log");
``ledger_head`` is the single row every append locks, which makes positions
gapless and commit-ordered on every engine without relying on
auto-increment; ``ledger_meta`` records the schema version. Projection tables
are declared by their projections and joined in by ``all_metadata``.
"""

from __future__ import annotations

import sqlalchemy as sa

from ledger.log.sqltypes import BigInt, Binary, Blob

SCHEMA_VERSION = 1

metadata = sa.MetaData()

events = sa.Table(
    "ledger_events",
    metadata,
    sa.Column("position", BigInt(), primary_key=True, autoincrement=False),
    sa.Column("aggregate_id", Binary(16), nullable=False),
    sa.Column("version", sa.BigInteger(), nullable=False),
    sa.Column("topic", Binary(255), nullable=False),
    sa.Column("state", Blob(), nullable=False),
    sa.Column("event_id", Binary(32), nullable=False),
    sa.Column("chain", Binary(32), nullable=False),
    sa.UniqueConstraint("aggregate_id", "version", name="uq_ledger_events_aggregate_version"),
)

head = sa.Table(
    "ledger_head",
    metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("position", sa.BigInteger(), nullable=False),
    sa.Column("chain", Binary(32), nullable=False),
)

meta = sa.Table(
    "ledger_meta",
    metadata,
    sa.Column("name", Binary(64), primary_key=True),
    sa.Column("value", Binary(255), nullable=False),
)

#: Cache of perfect, aligned Merkle subtree hashes (levels >= 10), filled on demand
#: by proofs and checkpoints. Derived data: `audit verify` never trusts it.
merkle = sa.Table(
    "ledger_merkle",
    metadata,
    sa.Column("level", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("idx", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("hash", Binary(32), nullable=False),
)
