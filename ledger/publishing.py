"""Publishing: read the publisher's input from the views, fence it, append one revision.

Everything is read in one consistent snapshot: bindings in force, every pack's
authority (active generation, source kind, dirty flag) with the components of
the active generations, the parent revision, and the versions of every
aggregate the decision depends on. The revision is built and validated in
memory (``publisher.catalog``) and appended as one event with a read fence on
the catalog, the activations, pack histories and newest attempts of every pack
it uses, and every audience's bindings (R16); a concurrent activation makes it
fail with a conflict instead of publishing a stale binding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.canonical import canonical_bytes_trusted
from domain.catalog import CATALOG_NAME, AudienceBindings, Catalog, audience_bindings_id, catalog_id
from domain.content import PackContent, fact_hasher
from domain.lifecycle import activation_id, generation_id, history_id
from domain.manifest import BindingSpec
from ledger.runtime import Ledger, LogReader
from projections.catalog_views import (
    AUDIENCE_BINDING,
    CATALOG_ACTIVATION,
    CATALOG_AUDIENCE,
    CATALOG_REVISION,
    OPEN,
    AudienceBindingView,
    CatalogView,
)
from projections.lifecycle_views import (
    INSTALLED_PACK,
    PACK_ACTIVATION,
    PACK_COMPONENT,
    PACK_GENERATION,
    InstalledPackView,
    PackActivationView,
    PackComponentView,
    PackGenerationView,
)
from projections.queries import require_running
from projections.sqltypes import dec
from publisher.catalog import (
    BindingRow,
    BuiltCatalog,
    CatalogInput,
    Fact,
    PackAuthority,
    ParentState,
    build_catalog,
)

_VIEWS = (
    AudienceBindingView.name,
    CatalogView.name,
    InstalledPackView.name,
    PackActivationView.name,
    PackComponentView.name,
    PackGenerationView.name,
)


@dataclass
class CatalogSnapshot:
    """The publisher's input as of one log position."""

    position: int
    bindings: list[BindingRow]
    packs: dict[str, PackAuthority]
    parent: ParentState
    newest: dict[str, str] = field(default_factory=dict)  # pack -> newest install id

    def input(self) -> CatalogInput:
        return CatalogInput(self.bindings, self.packs)


def read_snapshot(ledger: Ledger, conn: Connection) -> CatalogSnapshot:
    """Read every input of publication in the caller's (one) read transaction."""
    v = require_running(conn, *_VIEWS)
    position = ledger.recorder.head_in(conn).position
    ab = AUDIENCE_BINDING.physical
    bindings = [
        BindingRow(
            dec(r.audience_kind),
            dec(r.audience_id),
            dec(r.pack),
            dec(r.kind),
            dec(r.key),
            dec(r.credential_set) or None,
            dec(r.install_id),
            dec(r.payload_hash),
        )
        for r in conn.execute(sa.select(ab).where(ab.c.view_version == v[AudienceBindingView.name]))
    ]
    packs, newest = read_authorities(conn, v)
    return CatalogSnapshot(
        position, bindings, packs, read_parent(conn, v[CatalogView.name]), newest
    )


def read_authorities(
    conn: Connection, versions: Mapping[str, int]
) -> tuple[dict[str, PackAuthority], dict[str, str]]:
    """Every pack's authority: active generation + components, source kind, dirty flag."""
    ip, act = INSTALLED_PACK.physical, PACK_ACTIVATION.physical
    gen, comp = PACK_GENERATION.physical, PACK_COMPONENT.physical
    kinds = {
        dec(r.pack): (dec(r.source_kind), dec(r.status))
        for r in conn.execute(
            sa.select(ip.c.pack, ip.c.source_kind, ip.c.status).where(
                ip.c.view_version == versions[InstalledPackView.name]
            )
        )
    }
    newest: dict[str, tuple[str, str]] = {}
    for r in conn.execute(
        sa.select(gen.c.pack, gen.c.install_id, gen.c.status)
        .where(gen.c.view_version == versions[PackGenerationView.name])
        .order_by(gen.c.pack, gen.c.ordinal)
    ):
        newest[dec(r.pack)] = (dec(r.install_id), dec(r.status))
    components: dict[str, dict[tuple[str, str], Fact]] = {}
    query = (
        sa.select(comp.c.pack, comp.c.fact, comp.c.fact_digest)
        .join(
            act,
            sa.and_(
                act.c.pack == comp.c.pack,
                act.c.install_id == comp.c.install_id,
                act.c.view_version == versions[PackActivationView.name],
            ),
        )
        .where(comp.c.view_version == versions[PackComponentView.name])
    )
    for r in conn.execute(query):
        fact = Fact.parse(bytes(r.fact), bytes(r.fact_digest))
        components.setdefault(dec(r.pack), {})[(fact.kind, fact.key)] = fact
    packs: dict[str, PackAuthority] = {}
    for r in conn.execute(
        sa.select(act).where(act.c.view_version == versions[PackActivationView.name])
    ):
        pack = dec(r.pack)
        packs[pack] = PackAuthority(
            pack=pack,
            source_kind="official_repo",
            install_id=dec(r.install_id),
            revision=dec(r.revision),
            epoch=int(r.epoch),
            payload_hash=dec(r.payload_hash),
            dirty=newest.get(pack, ("", ""))[1] == "failed_dirty",
            components=components.get(pack, {}),
        )
    for pack, (source_kind, _status) in kinds.items():
        if pack not in packs:
            kind = "local_path" if source_kind == "local_path" else "legacy"
            packs[pack] = PackAuthority(pack=pack, source_kind=kind)
    for pack, (_, status) in newest.items():
        if pack not in packs:  # attempts but never activated
            packs[pack] = PackAuthority(
                pack=pack, source_kind="absent", dirty=status == "failed_dirty"
            )
    return packs, {p: i for p, (i, _) in newest.items()}


def read_parent(conn: Connection, version: int) -> ParentState:
    """The head revision: its number, digest, bound activations and audience digests."""
    rev, ca, cu = CATALOG_REVISION.physical, CATALOG_ACTIVATION.physical, CATALOG_AUDIENCE.physical
    head = conn.execute(
        sa.select(rev.c.revision, rev.c.content_digest)
        .where(rev.c.view_version == version)
        .order_by(rev.c.revision.desc())
        .limit(1)
    ).one_or_none()
    if head is None:
        return ParentState()
    activations = {
        dec(r.pack): [
            dec(r.pack),
            dec(r.install_id),
            dec(r.revision),
            int(r.epoch),
            dec(r.payload_hash),
        ]
        for r in conn.execute(
            sa.select(ca).where(ca.c.view_version == version, ca.c.to_revision == OPEN)
        )
    }
    audiences = {
        (dec(r.audience_kind), dec(r.audience_id)): dec(r.digest)
        for r in conn.execute(
            sa.select(cu).where(cu.c.view_version == version, cu.c.to_revision == OPEN)
        )
    }
    return ParentState(int(head.revision), dec(head.content_digest), activations, audiences)


def fence_ids(
    snapshot: CatalogSnapshot, packs: Iterable[str], audiences: Iterable[tuple[str, str]]
) -> list[UUID]:
    """Every aggregate a revision over ``packs`` and ``audiences`` depends on."""
    ids = [catalog_id()]
    for pack in sorted(set(packs)):
        ids.extend([activation_id(pack), history_id(pack)])
        if pack in snapshot.newest:
            ids.append(generation_id(pack, snapshot.newest[pack]))
    ids.extend(audience_bindings_id(k, i) for k, i in sorted(set(audiences)))
    return ids


@dataclass(frozen=True)
class PublishPlan:
    """A validated revision ready to append (or ``None`` when unchanged)."""

    built: BuiltCatalog
    parent: ParentState
    event: dict[str, Any] | None

    @property
    def changed(self) -> bool:
        return self.event is not None

    def summary(self) -> dict[str, Any]:
        return {
            "revision": self.event["revision"] if self.event else self.parent.revision,
            "content_digest": self.built.content_digest,
            "published": self.changed,
            "counts": self.built.counts,
        }


def plan_publication(
    catalog: CatalogInput, parent: ParentState, bindings_position: int | None
) -> PublishPlan:
    """Build and validate in memory; describe the revision event if content changed."""
    built = build_catalog(catalog)
    if parent.content_digest == built.content_digest:
        return PublishPlan(built, parent, None)
    activations, released, audiences = built.delta(parent)
    event = {
        "revision": parent.revision + 1,
        "content_digest": built.content_digest,
        "activations": activations,
        "released_packs": released,
        "audiences": audiences,
        "counts": built.counts,
        "bindings_position": bindings_position,
    }
    return PublishPlan(built, parent, event)


# -- releases: bindings converged together with the packs ---------------------------------


@dataclass(frozen=True)
class BindingChange:
    """One binding event a release appends."""

    op: str  # "grant", "rebind" or "revoke"
    row: BindingRow
    from_install_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "audience": f"{self.row.audience_kind}:{self.row.audience_id}",
            "pack": self.row.pack,
            "kind": self.row.kind,
            "key": self.row.key,
            "credential_set": self.row.credential_set,
        }
        if self.op != "revoke":
            out["install_id"] = self.row.install_id
        if self.from_install_id is not None:
            out["from_install_id"] = self.from_install_id
        return out


def plan_bindings(
    current: Iterable[BindingRow],
    desired: Iterable[BindingSpec] | None,
    packs: Mapping[str, PackAuthority],
) -> tuple[list[BindingRow], list[BindingChange]]:
    """The bindings after a release and the events that get there.

    ``desired`` is the manifest's complete binding set; ``None`` (no
    ``bindings`` in the manifest) keeps the current set. Either way every
    binding is bound to its pack's active generation after the release, so
    what moved is re-bound in the same release (R14).
    """
    now: dict[tuple[str, ...], BindingRow] = {row.ident: row for row in current}
    wanted: dict[tuple[str, ...], BindingRow] = {}
    specs: Iterable[tuple[str, str, str, str, str, str | None]] = (
        (
            (s.audience.kind.value, s.audience.id, s.pack, s.kind, s.key, s.credential_set)
            for s in desired
        )
        if desired is not None
        else (
            (r.audience_kind, r.audience_id, r.pack, r.kind, r.key, r.credential_set)
            for r in now.values()
        )
    )
    for kind, ident, pack, ckind, key, cred in specs:
        auth = packs.get(pack)
        row = BindingRow(
            kind,
            ident,
            pack,
            ckind,
            key,
            cred,
            (auth.install_id if auth else None) or "",
            (auth.payload_hash if auth else None) or "",
        )
        wanted[row.ident] = row
    changes: list[BindingChange] = []
    for wanted_key in sorted(wanted):
        row = wanted[wanted_key]
        before = now.get(wanted_key)
        if before is None:
            changes.append(BindingChange("grant", row))
        elif (before.install_id, before.payload_hash) != (row.install_id, row.payload_hash):
            changes.append(BindingChange("rebind", row, before.install_id))
    changes.extend(BindingChange("revoke", now[i]) for i in sorted(set(now) - set(wanted)))
    return [wanted[i] for i in sorted(wanted)], changes


def content_authority(
    pack: str, install_id: str, revision: str, epoch: int, content: PackContent
) -> PackAuthority:
    """The authority a generation of ``content`` will have once activated."""
    payload_hash = content.payload_hash_v1
    digest_of = fact_hasher(pack, install_id, payload_hash)
    components: dict[tuple[str, str], Fact] = {}
    for component in content.components:
        fact = canonical_bytes_trusted(component.to_json())
        components[(component.kind, component.key)] = Fact.parse(fact, digest_of(fact))
    return PackAuthority(
        pack=pack,
        source_kind="official_repo",
        install_id=install_id,
        revision=revision,
        epoch=epoch,
        payload_hash=payload_hash,
        dirty=False,
        components=components,
    )


def binding_aggregates(
    reader: LogReader, changes: Iterable[BindingChange], versions: Mapping[UUID, int]
) -> list[AudienceBindings]:
    """The changed audiences' binding aggregates with their events applied."""
    out: dict[tuple[str, str], AudienceBindings] = {}
    for change in changes:
        row = change.row
        aggregate = out.get(row.audience)
        if aggregate is None:
            aid = audience_bindings_id(*row.audience)
            version = versions.get(aid, 0)
            aggregate = (
                reader.positioned(
                    AudienceBindings,
                    aid,
                    version,
                    audience_kind=row.audience_kind,
                    audience_id=row.audience_id,
                )
                if version
                else AudienceBindings(audience_kind=row.audience_kind, audience_id=row.audience_id)
            )
            out[row.audience] = aggregate
        if change.op == "grant":
            aggregate.grant(
                row.pack, row.kind, row.key, row.credential_set, row.install_id, row.payload_hash
            )
        elif change.op == "rebind":
            assert change.from_install_id is not None
            aggregate.rebind(
                row.pack,
                row.kind,
                row.key,
                row.credential_set,
                change.from_install_id,
                row.install_id,
                row.payload_hash,
            )
        else:
            aggregate.revoke(row.pack, row.kind, row.key, row.credential_set, row.install_id)
    return list(out.values())


def positioned_catalog(reader: LogReader, parent: ParentState, version: int) -> Catalog:
    """The catalog lineage aggregate at its log version, from the head revision row."""
    if version == 0:
        return Catalog(name=CATALOG_NAME)
    return reader.positioned(
        Catalog,
        catalog_id(),
        version,
        name=CATALOG_NAME,
        revision=parent.revision,
        content_digest=parent.content_digest,
    )
