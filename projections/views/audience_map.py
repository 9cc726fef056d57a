"""The audience map view: the nodes of the sparse Merkle tree of audience digests (R28).

``domain.audience_map`` defines the tree; each ``catalog.published`` v2 event carries its
root. This inline view keeps the nodes of the map in force, so that the next publication
updates the root in O(changed audiences x log N) (``ledger.commands.catalog_state``,
which first checks the stored nodes reproduce the parent's root: the view is a cache and
is never trusted) and, later, so that a runtime can be given its own leaf's proof (R29).

A revision's ``audience_view.published`` events precede its ``catalog.published`` event
in one append: they wait in the pending table, and the revision applies them together
(one read of the nodes per tree level) and checks the result against the root the event
carries. A root that does not match stops the view (a poison event): it is then rebuilt
from the log. Revisions of format v1 carry no root and change nothing here (the map
begins with a store's first v2 revision, which records every audience in force).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import ClassVar

import sqlalchemy as sa

from domain.audience_map import Node, Position, key_of, update
from domain.event_types import T_PUBLISHED, T_VIEW_PUBLISHED
from ledger.log.sqltypes import BigInt, Binary
from projections.framework import Projection, ViewEvent
from projections.rows import RowStore
from projections.tables import view_table

AUDIENCE_MAP = view_table(
    "_System_AudienceMap",
    "view_audience_map",
    ["depth", "prefix"],
    sa.Column("depth", sa.Integer()),
    sa.Column("prefix", Binary(32)),
    sa.Column("hash", Binary(32), nullable=False),
    sa.Column("leaf_key", Binary(32), nullable=True),
    sa.Column("leaf_value", Binary(32), nullable=True),
)

AUDIENCE_MAP_PENDING = view_table(
    "_System_AudienceMapPending",
    "view_audience_map_pending",
    ["audience_key"],
    sa.Column("audience_key", Binary(32)),
    sa.Column("revision", BigInt(), nullable=False),
    sa.Column("leaf_value", Binary(32), nullable=True),
)


class MapMismatch(ValueError):
    """The nodes after a revision's changes do not give the root its event carries."""


class AudienceMapView(Projection):
    """The audience map's nodes at the head revision."""

    name = "audience_map"
    version = 1
    weight = 0.5
    tables = (AUDIENCE_MAP, AUDIENCE_MAP_PENDING)
    types: ClassVar[frozenset[str]] = frozenset({T_VIEW_PUBLISHED, T_PUBLISHED})

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        if event.type == T_VIEW_PUBLISHED:
            digest = d["digest"]
            rows.put(
                AUDIENCE_MAP_PENDING,
                {
                    "audience_key": key_of(d["audience_kind"], d["audience_id"]),
                    "revision": d["revision"],
                    "leaf_value": None if digest is None else bytes.fromhex(digest),
                },
            )
            return
        root = d.get("audiences_root")
        if root is None:
            return
        pending = rows.scan(AUDIENCE_MAP_PENDING)
        if any(p["revision"] != d["revision"] for p in pending):
            raise MapMismatch(
                f"audience views of another revision wait for revision {d['revision']}"
            )
        changes = {p["audience_key"]: p["leaf_value"] for p in pending}
        for p in pending:
            rows.delete(AUDIENCE_MAP_PENDING, (p["audience_key"],))

        def fetch(positions: Collection[Position]) -> Mapping[Position, Node]:
            found = rows.get_many(AUDIENCE_MAP, positions)
            return {
                key: Node(row["hash"], row["leaf_key"], row["leaf_value"])
                for key, row in found.items()
            }

        counts = d.get("counts")
        size = counts.get("audiences") if isinstance(counts, dict) else None
        result = update(fetch, changes, size=size if isinstance(size, int) else None)
        if result.root.hex() != root:
            raise MapMismatch(
                f"revision {d['revision']}'s audience map root is {root}, but its audience "
                f"views give {result.root.hex()}"
            )
        for (depth, prefix), node in result.writes.items():
            if node is None:
                rows.delete(AUDIENCE_MAP, (depth, prefix))
            else:
                rows.put(
                    AUDIENCE_MAP,
                    {
                        "depth": depth,
                        "prefix": prefix,
                        "hash": node.hash,
                        "leaf_key": node.key,
                        "leaf_value": node.value,
                    },
                )
