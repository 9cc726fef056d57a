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
from typing import Any, cast
from uuid import UUID

import sqlalchemy as sa
from eventsourcing.domain import Aggregate
from sqlalchemy.engine import Connection

from domain.catalog import CATALOG_NAME, AudienceBindings, Catalog, audience_bindings_id, catalog_id
from domain.coordination import CommandRecord
from domain.errors import LifecycleRejected
from domain.identity import identity_problem
from domain.lifecycle import activation_id, generation_id, history_id
from ledger.commands.core import ServiceCore
from ledger.commands.results import CatalogCounts, CatalogOutcome, PublishResult
from ledger.log.sqltypes import dec
from ledger.observability import bind, get_logger, logged_command
from ledger.store.runtime import Ledger, LogReader
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
from publisher.catalog import (
    BindingRow,
    CatalogInput,
    Fact,
    PackAuthority,
    ParentState,
)
from publisher.planning import BindingChange, PublishPlan, plan_publication

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
    generations: dict[tuple[str, str], tuple[str, str | None, int | None]] = {}
    for r in conn.execute(
        sa.select(
            gen.c.pack, gen.c.install_id, gen.c.status, gen.c.applied_payload_hash, gen.c.epoch
        )
        .where(gen.c.view_version == versions[PackGenerationView.name])
        .order_by(gen.c.pack, gen.c.ordinal)
    ):
        pack, install_id, status = dec(r.pack), dec(r.install_id), dec(r.status)
        newest[pack] = (install_id, status)
        applied = dec(r.applied_payload_hash) if r.applied_payload_hash is not None else None
        generations[(pack, install_id)] = (status, applied, r.epoch)
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
    for c in conn.execute(query):
        fact = Fact.parse(bytes(c.fact), bytes(c.fact_digest))
        components.setdefault(dec(c.pack), {})[(fact.kind, fact.key)] = fact
    packs: dict[str, PackAuthority] = {}
    for r in conn.execute(
        sa.select(act).where(act.c.view_version == versions[PackActivationView.name])
    ):
        pack = dec(r.pack)
        _check_activation(pack, dec(r.install_id), dec(r.payload_hash), int(r.epoch), generations)
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


def _check_activation(
    pack: str,
    install_id: str,
    payload_hash: str,
    epoch: int,
    generations: Mapping[tuple[str, str], tuple[str, str | None, int | None]],
) -> None:
    """The pointer must select an active generation that agrees with it (R13): the same
    classifier rules as the command side, on the views publication reads from."""
    found = None
    problem = identity_problem(install_id)
    generation = generations.get((pack, install_id))
    if problem is not None:
        found = f"activation install id {install_id!r} is not canonical: {problem}"
    elif generation is None:
        found = "the activation names a generation that is not in the log"
    elif generation[0] != "active":
        found = f"the activation names generation {install_id} which is {generation[0]}"
    elif generation[1] != payload_hash or generation[2] != epoch:
        found = "the active generation and the activation disagree"
    if found is not None:
        raise LifecycleRejected(
            f"pack {pack!r} is in an inconsistent state: {found}",
            reason="INCONSISTENT_STATE",
            rule="R13",
            pack=pack,
            found=found,
        )


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


@dataclass(frozen=True)
class StagedPublication:
    """A validated revision built in memory, not yet appended."""

    result: PublishResult
    aggregates: list[Aggregate]
    fence: dict[UUID, int]


log = get_logger("publish")


def publication_summary(result: Mapping[str, Any]) -> dict[str, Any]:
    """The final log record's fields of a command that may publish (``apply`` nests its
    catalog outcome, ``publish`` is one); a new revision is logged on its own too."""
    catalog = result.get("catalog", result)
    fields = {
        "noop": result.get("noop"),
        "replayed": result.get("replayed"),
        "revision": catalog.get("revision"),
        "published": catalog.get("published"),
    }
    if catalog.get("published") and not result.get("replayed"):
        log.info(
            "catalog published",
            extra={
                "revision": catalog.get("revision"),
                "content_digest": catalog.get("content_digest"),
                **catalog.get("counts", {}),
            },
        )
    if "blocked" in catalog:
        log.warning("publication blocked", extra={"packs": catalog["blocked"]["packs"]})
    return fields


def catalog_outcome(plan: PublishPlan) -> CatalogOutcome:
    """The revision a publication plan leaves in force, new or the parent's.

    Revision and digest always belong together. A validated catalog that was
    not published (``apply --no-publish``) is shown beside them as the
    candidate, never in place of the published digest.
    """
    built, parent = plan.built, plan.parent
    if built is None:  # publication blocked by failed_dirty packs (R12)
        dirty = plan.dirty_packs
        return {
            "revision": parent.revision,
            "content_digest": parent.content_digest,
            "published": False,
            "blocked": {
                "reason": "DIRTY_PACK",
                "packs": dirty,
                "message": f"publication is blocked while {', '.join(dirty)} "
                "has a failed_dirty newest attempt (R12); it clears when a later "
                "generation of that pack activates: apply a release that advances it",
            },
        }
    outcome: CatalogOutcome = {
        "revision": plan.event["revision"] if plan.event else parent.revision,
        "content_digest": built.content_digest if plan.event else parent.content_digest,
        "published": plan.changed,
        "counts": cast(CatalogCounts, built.counts),
    }
    if not plan.changed and built.content_digest != parent.content_digest:
        outcome["candidate_content_digest"] = built.content_digest
    return outcome


class PublishCommand(ServiceCore):
    """The ``publish`` command: validate every audience, append one revision (R16)."""

    @logged_command(log, "publish", publication_summary)
    def publish(self, *, command_id: str | None = None) -> PublishResult:
        """Validate every audience and append one revision, or nothing if unchanged (R16)."""
        staged = self.stage_publication(command_id=command_id)
        if isinstance(staged, StagedPublication):
            return self.commit_publication(staged)
        return staged

    def stage_publication(
        self, *, command_id: str | None = None
    ) -> PublishResult | StagedPublication:
        """Read, build and validate the whole revision in memory (no write).

        Returns the final result when there is nothing to append (exact retry or
        unchanged content), else the staged revision for ``commit_publication``.
        """
        request_digest = self.request_digest({"kind": "publish"})
        with self.ledger.snapshot() as reader:
            cid = self._command_id(command_id, "publish", request_digest, reader)
            bind(command_id=cid)
            prior = self.recorded(reader, cid, "publish", request_digest)
            if prior is not None:
                return cast(PublishResult, {**prior, "replayed": True})
            catalog = read_snapshot(self.ledger, reader.conn)
            publication = plan_publication(catalog.input(), catalog.parent, catalog.position)
            result: PublishResult = {
                "command_id": cid,
                "noop": publication.event is None,
                "replayed": False,
                **catalog_outcome(publication),
            }
            if publication.event is None:
                return result
            used = {row.pack for row in catalog.bindings} | set(catalog.parent.activations)
            audiences = {row.audience for row in catalog.bindings} | set(catalog.parent.audiences)
            versions = self.ledger.recorder.versions(
                reader.conn, fence_ids(catalog, used, audiences)
            )
            lineage = positioned_catalog(reader, catalog.parent, versions[catalog_id()])
        lineage.publish(**{k: v for k, v in publication.event.items() if k != "revision"})
        record = CommandRecord(
            command_id=cid, kind="publish", request_digest=request_digest, result=dict(result)
        )
        return StagedPublication(result, [lineage, record], versions)

    def commit_publication(self, staged: StagedPublication) -> PublishResult:
        """Append the staged revision as one event, fenced on everything it read."""
        self.ledger.app.save(*staged.aggregates, fence=staged.fence)
        return staged.result
