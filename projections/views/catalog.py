"""The catalog tables, applied inline: what each published revision serves, shaped for the
reader: revisions, and temporal rows (``from_revision`` … ``to_revision``) of bound
activations, grant edges and per-audience digests. Rows in force at the head have
``to_revision = OPEN``, so the current view of an audience is a primary-key prefix read,
and any earlier revision is a range read.

Binding events change the catalog only when a revision is published: until
then they wait in ``catalog_pending``; a ``Catalog.Published`` event turns them
into grant rows of that revision (publication validated every one of them).
"""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa

from domain.event_types import T_GRANTED, T_PUBLISHED, T_REBOUND, T_REVOKED, T_VIEW_PUBLISHED
from ledger.log.sqltypes import BigInt, Binary, enc
from projections.framework import Projection, ViewEvent
from projections.rows import RowStore
from projections.tables import Row, ViewTable, view_table
from projections.views.audience_binding import BINDING_KEY, binding_columns, binding_key

#: ``to_revision`` of rows still in force at the head revision.
OPEN = 2**62


CATALOG_REVISION = view_table(
    "_System_CatalogRevision",
    "view_catalog_revision",
    ["revision"],
    sa.Column("revision", BigInt()),
    sa.Column("content_digest", Binary(64), nullable=False),
    sa.Column("parent_digest", Binary(64), nullable=True),
    sa.Column("position", BigInt(), nullable=False),
    sa.Column("audiences", BigInt(), nullable=False),
    sa.Column("activations", BigInt(), nullable=False),
    sa.Column("facts", BigInt(), nullable=False),
    sa.Column("grants", BigInt(), nullable=False),
)

CATALOG_ACTIVATION = view_table(
    "_System_CatalogActivation",
    "view_catalog_activation",
    ["pack", "to_revision"],
    sa.Column("pack", Binary(255)),
    sa.Column("to_revision", BigInt()),
    sa.Column("from_revision", BigInt(), nullable=False),
    sa.Column("install_id", Binary(255), nullable=False),
    sa.Column("revision", Binary(255), nullable=False),
    sa.Column("epoch", sa.BigInteger(), nullable=False),
    sa.Column("payload_hash", Binary(80), nullable=False),
)

CATALOG_GRANT = view_table(
    "_System_CatalogGrant",
    "view_catalog_grant",
    [*BINDING_KEY, "to_revision"],
    *binding_columns(
        sa.Column("to_revision", BigInt()),
        sa.Column("from_revision", BigInt(), nullable=False),
        sa.Column("install_id", Binary(255), nullable=False),
        sa.Column("payload_hash", Binary(80), nullable=False),
    ),
    # The reader's access path: one audience's edges in force (or at a revision).
    indexes=[["audience_kind", "audience_id", "to_revision"]],
)

CATALOG_AUDIENCE = view_table(
    "_System_CatalogAudience",
    "view_catalog_audience",
    ["audience_kind", "audience_id", "to_revision"],
    sa.Column("audience_kind", Binary(16)),
    sa.Column("audience_id", Binary(255)),
    sa.Column("to_revision", BigInt()),
    sa.Column("from_revision", BigInt(), nullable=False),
    sa.Column("digest", Binary(64), nullable=False),
)

CATALOG_PENDING = view_table(
    "_System_CatalogPending",
    "view_catalog_pending",
    [*BINDING_KEY, "position"],
    *binding_columns(
        sa.Column("position", BigInt()),
        sa.Column("op", Binary(8), nullable=False),
        sa.Column("install_id", Binary(255), nullable=True),
        sa.Column("payload_hash", Binary(80), nullable=True),
    ),
)


def _close(rows: RowStore, table: ViewTable, current: Row | None, revision: int) -> None:
    """End ``current`` (the row in force, ``to_revision = OPEN``) at ``revision``."""
    if current is not None:
        rows.delete(table, table.key_of(current))
        rows.put(table, {**current, "to_revision": revision})


class CatalogView(Projection):
    """Published revisions with their activations, grant edges and audience digests."""

    name = "catalog"
    version = 1
    weight = 1.5
    tables = (
        CATALOG_REVISION,
        CATALOG_ACTIVATION,
        CATALOG_GRANT,
        CATALOG_AUDIENCE,
        CATALOG_PENDING,
    )
    # ``audience_view.published`` (issue 24) added a type; no row of a log without it
    # changes, so views built before stay exact: the version is unchanged.
    types: ClassVar[frozenset[str]] = frozenset(
        {T_GRANTED, T_REBOUND, T_REVOKED, T_PUBLISHED, T_VIEW_PUBLISHED}
    )

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        if event.type == T_VIEW_PUBLISHED:
            self._audience(
                rows, int(d["revision"]), d["audience_kind"], d["audience_id"], d["digest"]
            )
            return
        if event.type != T_PUBLISHED:
            key = binding_key(d)
            granted = event.type != T_REVOKED
            rows.put(
                CATALOG_PENDING,
                dict(
                    zip(BINDING_KEY, key, strict=True),
                    position=event.position,
                    op=b"grant" if granted else b"revoke",
                    install_id=enc(d["install_id"]) if granted else None,
                    payload_hash=enc(d["payload_hash"]) if granted else None,
                ),
            )
            return
        self._publish(event, rows)

    def _publish(self, event: ViewEvent, rows: RowStore) -> None:
        """Turn pending binding changes up to the revision's cut into its grant rows.

        ``bindings_position`` is the log position the publisher read bindings at
        (``None``: everything before this event, as inside one ``apply`` append);
        later changes stay pending for the next revision, so the grants always
        equal what was validated and digested.
        """
        d = event.data
        r = int(d["revision"])
        cut = d.get("bindings_position")
        final: dict[tuple[Any, ...], Row] = {}
        for change in sorted(rows.scan(CATALOG_PENDING), key=lambda c: c["position"]):
            if cut is not None and change["position"] > cut:
                continue
            key = tuple(change[k] for k in BINDING_KEY)
            final[key] = change  # the last change of each binding up to the cut wins
            rows.delete(CATALOG_PENDING, (*key, change["position"]))
        # One batched lookup per table: a revision may touch every grant of the store.
        # When it touches at least half of the grants in force, one scan of those is
        # cheaper than keyed lookups of each (same rows either way).
        parent = rows.get(CATALOG_REVISION, (r - 1,)) if r > 1 else None
        in_force = int(parent["grants"]) if parent is not None else 0
        open_grants: dict[tuple[Any, ...], Row]
        if 2 * len(final) >= in_force:
            open_grants = {
                CATALOG_GRANT.key_of(g): g for g in rows.scan(CATALOG_GRANT, to_revision=OPEN)
            }
        else:
            open_grants = rows.get_many(CATALOG_GRANT, [(*key, OPEN) for key in final])
        for key, change in final.items():
            current = open_grants.get((*key, OPEN))
            if (
                change["op"] == b"grant"
                and current is not None
                and (current["install_id"], current["payload_hash"])
                == (change["install_id"], change["payload_hash"])
            ):
                continue
            _close(rows, CATALOG_GRANT, current, r)
            if change["op"] == b"grant":
                rows.put(
                    CATALOG_GRANT,
                    dict(
                        zip(BINDING_KEY, key, strict=True),
                        to_revision=OPEN,
                        from_revision=r,
                        install_id=change["install_id"],
                        payload_hash=change["payload_hash"],
                    ),
                )
        moved = [enc(a[0]) for a in d["activations"]] + [enc(p) for p in d["released_packs"]]
        open_activations = rows.get_many(CATALOG_ACTIVATION, [(p, OPEN) for p in moved])
        for pack, install_id, revision, epoch, payload_hash in d["activations"]:
            _close(rows, CATALOG_ACTIVATION, open_activations.get((enc(pack), OPEN)), r)
            rows.put(
                CATALOG_ACTIVATION,
                {
                    "pack": enc(pack),
                    "to_revision": OPEN,
                    "from_revision": r,
                    "install_id": enc(install_id),
                    "revision": enc(revision),
                    "epoch": epoch,
                    "payload_hash": enc(payload_hash),
                },
            )
        for pack in d["released_packs"]:
            _close(rows, CATALOG_ACTIVATION, open_activations.get((enc(pack), OPEN)), r)
        # Format v1 lists the changed audiences here; from v2 on each is an
        # ``audience_view.published`` event of the same append (``_audience``).
        open_audiences = rows.get_many(
            CATALOG_AUDIENCE, [(enc(k), enc(i), OPEN) for k, i, _ in d["audiences"]]
        )
        for kind, ident, value in d["audiences"]:
            self._audience(rows, r, kind, ident, value, open_audiences)
        counts = d["counts"]
        rows.put(
            CATALOG_REVISION,
            {
                "revision": r,
                "content_digest": enc(d["content_digest"]),
                "parent_digest": enc(d["parent_digest"]) if d["parent_digest"] else None,
                "position": event.position,
                "audiences": counts["audiences"],
                "activations": counts["activations"],
                "facts": counts["facts"],
                "grants": counts["grants"],
            },
        )

    @staticmethod
    def _audience(
        rows: RowStore,
        revision: int,
        kind: str,
        ident: str,
        value: str | None,
        open_rows: dict[tuple[Any, ...], Row] | None = None,
    ) -> None:
        """The audience's digest from ``revision`` on (``None``: it has no view any more)."""
        key = (enc(kind), enc(ident), OPEN)
        current = open_rows.get(key) if open_rows is not None else rows.get(CATALOG_AUDIENCE, key)
        _close(rows, CATALOG_AUDIENCE, current, revision)
        if value is not None:
            rows.put(
                CATALOG_AUDIENCE,
                {
                    "audience_kind": enc(kind),
                    "audience_id": enc(ident),
                    "to_revision": OPEN,
                    "from_revision": revision,
                    "digest": enc(value),
                },
            )
