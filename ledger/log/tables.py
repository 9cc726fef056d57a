"""The log's tables and the schema version; DDL artifacts are generated from here.

``ledger_events`` is the one table of events (DESIGN "The log");
``ledger_head`` is the single row every append locks, which makes positions
gapless and commit-ordered on every engine without relying on
auto-increment; ``ledger_meta`` records the schema version and holds the
migration lock row; ``ledger_lease`` is the writer lease's coordination row,
whose expiry renewals move by compare-and-set outside the log (R12). Projection
tables are declared by their projections and joined in by ``all_metadata``.
Each schema version's changes are numbered steps in ``ledger.store.migrations``.
"""

from __future__ import annotations

import sqlalchemy as sa

from ledger.log.sqltypes import BigInt, Binary, Blob

SCHEMA_VERSION = 3

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

#: The writer lease's coordination row (schema version 2). The log records every
#: acquisition, release and break; a renewal only moves ``expires_at_us`` here,
#: by compare-and-set on (holder, epoch), so the log does not grow by a renewal
#: every few seconds. Appends are fenced on the lease aggregate's version, which
#: only acquisitions, releases and breaks move: the epoch, never the expiry.
lease = sa.Table(
    "ledger_lease",
    metadata,
    sa.Column("name", Binary(64), primary_key=True),
    sa.Column("holder", Binary(255), nullable=False),
    sa.Column("epoch", sa.BigInteger(), nullable=False),
    sa.Column("expires_at_us", sa.BigInteger(), nullable=False),
)

#: Cosigned checkpoints (schema version 3, R29): one row per log origin (today the
#: catalog log's), the whole signed note as the collector (`catalog-ledger cosign`)
#: stored it: body, blank line, the log's signature line, the witnesses' cosignature
#: lines. Written only by the collector, served as stored; `audit verify` checks each
#: row's (size, root) against the log recomputed from the main log.
checkpoint = sa.Table(
    "ledger_checkpoint",
    metadata,
    sa.Column("origin", Binary(255), primary_key=True),
    sa.Column("size", sa.BigInteger(), nullable=False),
    sa.Column("root", Binary(32), nullable=False),
    sa.Column("note", Blob(), nullable=False),
    sa.Column("stored_at_us", sa.BigInteger(), nullable=False),
)
