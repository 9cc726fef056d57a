"""What publishing reads from the view tables: the revision in force cut into fragments
from the catalog views' open rows, and the audience map view's live nodes.

Neither is trusted by itself: the command side checks the fragments against the content
digest and counts the log committed, and the map's nodes against the parent's root
(``ledger.commands.catalog_state``, R28).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.audience_map import Fetch, Node, Position, leaf_hash, position_of
from domain.errors import IntegrityFailure
from ledger.log.db import stream_rows
from ledger.log.sqltypes import KEYS_PER_STATEMENT, dec, keys_in
from projections import checks
from projections.queries.status import require_running
from projections.state import load_states
from projections.views.audience_map import AUDIENCE_MAP, AudienceMapView
from projections.views.catalog import CATALOG_ACTIVATION, CATALOG_GRANT, OPEN, CatalogView
from projections.views.pack_component import PACK_COMPONENT, PackComponentView


@dataclass
class OpenRows:
    """The catalog views' rows in force, as the entries of the revision's fragments:
    activation entries and bound facts by pack, grants by audience (keys: stored bytes)."""

    activations: dict[bytes, list[Any]] = field(default_factory=dict)
    facts: dict[bytes, list[list[Any]]] = field(default_factory=dict)
    grants: dict[tuple[bytes, bytes], list[list[Any]]] = field(default_factory=dict)


def open_catalog_rows(conn: Connection) -> OpenRows:
    """The revision in force from the catalog views' open rows (and the bound components'
    fact digests). Not trusted: the caller checks what they digest to."""
    v = require_running(conn, CatalogView.name, PackComponentView.name)
    ca, cg, comp = CATALOG_ACTIVATION.physical, CATALOG_GRANT.physical, PACK_COMPONENT.physical
    out = OpenRows()
    by_pack, by_audience = out.facts, out.grants
    try:
        for rows in stream_rows(
            conn,
            sa.select(ca.c.pack, ca.c.install_id, ca.c.revision, ca.c.epoch, ca.c.payload_hash)
            .where(ca.c.view_version == v[CatalogView.name], ca.c.to_revision == OPEN)
            .order_by(ca.c.pack),
        ):
            for pack, install_id, rev, epoch, payload_hash in rows:
                out.activations[bytes(pack)] = [
                    dec(pack),
                    dec(install_id),
                    dec(rev),
                    int(epoch),
                    dec(payload_hash),
                ]
        bound = (
            sa.select(cg.c.pack, cg.c.install_id, cg.c.kind, cg.c.key)
            .where(cg.c.view_version == v[CatalogView.name], cg.c.to_revision == OPEN)
            .distinct()
            .subquery("bound")
        )
        for rows in stream_rows(
            conn,
            sa.select(
                bound.c.pack, bound.c.install_id, bound.c.kind, bound.c.key, comp.c.fact_digest
            )
            .select_from(
                bound.outerjoin(
                    comp,
                    sa.and_(
                        comp.c.view_version == v[PackComponentView.name],
                        comp.c.pack == bound.c.pack,
                        comp.c.install_id == bound.c.install_id,
                        comp.c.kind == bound.c.kind,
                        comp.c.key == bound.c.key,
                    ),
                )
            )
            .order_by(bound.c.pack, bound.c.install_id, bound.c.kind, bound.c.key),
        ):
            for pack, install_id, kind, key, fact_digest in rows:
                by_pack.setdefault(bytes(pack), []).append(
                    [dec(pack), dec(install_id), dec(kind), dec(key), _hex(fact_digest)]
                )
        for rows in stream_rows(
            conn,
            sa.select(
                cg.c.audience_kind,
                cg.c.audience_id,
                cg.c.pack,
                cg.c.kind,
                cg.c.key,
                cg.c.credential_set,
                cg.c.install_id,
            )
            .where(cg.c.view_version == v[CatalogView.name], cg.c.to_revision == OPEN)
            .order_by(
                cg.c.audience_kind,
                cg.c.audience_id,
                cg.c.pack,
                cg.c.kind,
                cg.c.key,
                cg.c.credential_set,
            ),
        ):
            for kind, ident, pack, ckind, key, cred, install_id in rows:
                by_audience.setdefault((bytes(kind), bytes(ident)), []).append(
                    [
                        dec(kind),
                        dec(ident),
                        dec(pack),
                        dec(ckind),
                        dec(key),
                        dec(cred) or None,
                        dec(install_id),
                    ]
                )
    except (TypeError, ValueError) as exc:
        raise IntegrityFailure(
            "a catalog view cell is not of its declared type: a view row was edited "
            f"({type(exc).__name__}: {exc})",
            rule="R28",
            tables=[CATALOG_ACTIVATION.physical.name, CATALOG_GRANT.physical.name],
        ) from None
    return out


def _hex(value: object) -> str | None:
    if value is None:
        return None  # a bound component without its row: the digest check refuses it
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"fact_digest is {type(value).__name__}")
    return bytes(value).hex()


def map_fetch(conn: Connection) -> Fetch | None:
    """Reads the audience map view's live nodes, or ``None`` when the view is missing,
    stopped or built by other code (the caller then computes the map afresh)."""
    state = load_states(conn).get(AudienceMapView.name)
    if state is None or state.stopped or state.code_version != AudienceMapView.version:
        return None
    t = AUDIENCE_MAP.physical
    version = state.live_version

    def fetch(positions: Collection[Position]) -> Mapping[Position, Node]:
        out: dict[Position, Node] = {}
        wanted = sorted(positions)
        for start in range(0, len(wanted), KEYS_PER_STATEMENT):
            chunk = wanted[start : start + KEYS_PER_STATEMENT]
            where = keys_in([t.c.view_version == version], [t.c.depth, t.c.prefix], chunk)
            query = sa.select(t.c.depth, t.c.prefix, t.c.hash, t.c.leaf_key, t.c.leaf_value).where(
                where
            )
            for depth, prefix, digest, key, value in conn.execute(query):
                place, node = _stored_node(depth, prefix, digest, key, value)
                out[place] = node
        return out

    return fetch


class BadNode(ValueError):
    """A stored map node that is not a node of any map (the view was edited)."""


def _stored_node(
    depth: object, prefix: object, digest: object, key: object, value: object
) -> tuple[Position, Node]:
    """A stored node, checked for what a root check cannot see: a leaf's hash is the
    hash of its own key and value, and sits on its key's path; an inner node has
    neither. Anything else is ``BadNode`` (the map is then made afresh)."""
    if type(depth) is not int or not all(type(v) is bytes for v in (prefix, digest)):
        raise BadNode("a node cell is not of the declared type")
    assert isinstance(prefix, bytes) and isinstance(digest, bytes)
    place = (depth, prefix)
    if len(digest) != 32 or not 0 <= depth <= 256:
        raise BadNode(f"node {place} is malformed")
    if key is None and value is None:
        return place, Node(digest)
    if not (type(key) is bytes and type(value) is bytes and len(key) == len(value) == 32):
        raise BadNode(f"leaf {place} is malformed")
    assert isinstance(key, bytes) and isinstance(value, bytes)
    if checks.on(checks.MAP) and (
        leaf_hash(key, value) != digest or position_of(key, depth) != place
    ):
        raise BadNode(f"leaf {place} does not hash its own key and value")
    return place, Node(digest, key, value)
