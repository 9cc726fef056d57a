"""Publishing: the publisher's input from the log, validated and appended as one revision.

What a publication decides on is anchored in the log (``ledger.commands.catalog_state``,
R28): the revision in force is the last event of the catalog lineage; its content is
the kept fragments (or the catalog views' rows in force) only once they digest to what
that event committed; the binding and lifecycle events since its cut are read from the
log; and every pack's authority comes from its own aggregates' events. The revision is
built and validated in memory (``publisher.catalog``) and appended as one append: one
``audience_view.published`` event per audience whose view changed, then the
``catalog.published`` event with the audience map's root (R16, R17, R28), fenced on
everything it read (a concurrent activation makes it fail with a conflict instead of
publishing a stale binding).

``publish`` is incremental when a parent revision exists: only the audiences whose
bindings changed since the parent's cut, or that bind a pack with a lifecycle event
since, are re-read and validated completely (``read_from_fragments``); every other
audience keeps the parent's validation and digest, and the content digest is computed
from the parent's fragments, re-encoding only the affected audiences and the packs they
bind or bound. Any rejection falls back to the full build (``read_catalog_in_force``), so errors
are exactly the full build's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from uuid import UUID

from eventsourcing.domain import Aggregate
from sqlalchemy.engine import Connection

from domain.catalog import (
    CATALOG_NAME,
    AudienceBindings,
    Catalog,
    PublishedView,
    audience_bindings_id,
    catalog_id,
    published_view_id,
)
from domain.classifier import PackState
from domain.identity import PackName
from domain.lifecycle import activation_id, generation_id, history_id
from ledger.commands import catalog_state as state
from ledger.commands.catalog_state import Change, LogHead, ParentContent
from ledger.commands.results import CatalogCounts, CatalogOutcome
from ledger.observability import get_logger
from ledger.store.runtime import Ledger, Repository
from projections.queries.status import require_running
from projections.views.audience_binding import AudienceBindingView
from projections.views.catalog import CatalogView
from projections.views.installed_pack import InstalledPackView
from projections.views.pack_activation import PackActivationView
from projections.views.pack_component import PackComponentView
from projections.views.pack_generation import PackGenerationView
from publisher.catalog import (
    Audience,
    BindingRow,
    BuiltCatalog,
    CatalogInput,
    PackAuthority,
    ParentState,
    PublicationRejected,
    validate,
)
from publisher.fragments import GRANTS, NextRevision, next_revision
from publisher.planning import BindingChange, PublishPlan

#: Above this share of the parent's audiences changed, a full build is cheaper.
INCREMENTAL_LIMIT = 0.25


@dataclass
class CatalogInForce:
    """The catalog in force as of one log position, anchored in the log: the bindings,
    every pack's authority and the parent revision (the publisher's complete input)."""

    position: int
    bindings: list[BindingRow]
    packs: dict[str, PackAuthority]
    parent: ParentState
    newest: dict[str, str] = field(default_factory=dict)  # pack -> newest install id
    #: The revision in force as the log committed it (``None``: none yet).
    head: LogHead | None = None

    def input(self) -> CatalogInput:
        return CatalogInput(self.bindings, self.packs)


#: The inline views a release's append feeds. A release is refused while one of them is
#: stopped at a poison event (R20): it decides from the log (R28), but it would append
#: what that view cannot follow, widening a gap that only a code fix and a rebuild close.
MAINTAINED = (
    AudienceBindingView.name,
    CatalogView.name,
    InstalledPackView.name,
    PackActivationView.name,
    PackComponentView.name,
    PackGenerationView.name,
)


def read_catalog_in_force(
    ledger: Ledger,
    conn: Connection,
    *,
    states: Mapping[PackName, PackState] | None = None,
    extra: Iterable[str] = (),
) -> CatalogInForce:
    """Every input of a full publication, in the caller's (one) read transaction: the
    bindings in force (the parent's grants and the binding events since its cut), the
    authority of every pack they, the parent or ``extra`` name (``states`` already read
    are reused), the parent revision with every audience's digest."""
    recorder = ledger.recorder
    require_running(conn, *MAINTAINED)
    position = recorder.head_in(conn).position
    head = state.log_head(recorder, conn)
    parent = ParentContent(*state.parent_fragments(conn, head))
    now: dict[tuple[str, ...], BindingRow] = {}
    for audience in sorted(parent.audiences()):
        for row in parent.bindings_of(audience):
            now[row.ident] = row
    state.apply_changes(now, state.pending_changes(recorder, conn, head.cut if head else 0))
    bindings = [now[k] for k in sorted(now)]
    wanted = {b.pack for b in bindings} | parent.packs() | set(extra)
    packs, newest = state.log_authorities(ledger.repository(conn), wanted, states)
    return CatalogInForce(position, bindings, packs, _parent_state(head, parent), newest, head)


def _parent_state(
    head: LogHead | None,
    parent: ParentContent,
    packs: Iterable[str] | None = None,
    audiences: Iterable[Audience] | None = None,
) -> ParentState:
    """The parent as a delta is computed against it: the activation entries of ``packs``
    and the view digests of ``audiences`` (default: all of them)."""
    if head is None:
        return ParentState()
    facts: dict[str, Any] = {}
    served = parent.audiences()
    return ParentState(
        revision=head.revision,
        content_digest=head.content_digest,
        activations={
            p: e
            for p in (parent.packs() if packs is None else packs)
            if (e := parent.entry(p)) is not None
        },
        audiences={
            a: parent.digest_of(a, facts)
            for a in (served if audiences is None else audiences)
            if a in served
        },
    )


@dataclass
class IncrementalRevision:
    """An incremental publication built from the parent's verified fragments: the parent
    as far as the revision event's delta needs it, the next revision, what it used."""

    position: int
    parent: ParentState
    built: BuiltCatalog
    next: NextRevision
    used: set[str]
    head: LogHead
    content: ParentContent
    affected: set[Audience]

    def everything(self) -> Mapping[Audience, str]:
        """Every audience's view digest after this revision (for a map made afresh)."""
        facts: dict[str, Any] = {}
        out = {
            a: self.content.digest_of(a, facts)
            for a in self.content.audiences()
            if a not in self.affected
        }
        out.update(self.next.audience_digests)
        return out


class FullBuildDue(Exception):
    """An incremental publication gives way to the full build (which names problems)."""


@dataclass
class Anchor:
    """The revision in force as the log committed it and what happened after its cut."""

    position: int
    head: LogHead
    parent: ParentContent
    changes: list[Change]
    moved: set[str]


def read_anchor(ledger: Ledger, conn: Connection, reuse: Anchor | None = None) -> Anchor | None:
    """The anchor at this snapshot (``None``: no revision with grants to build on).
    ``reuse``: an anchor read earlier; its verified content is reused when the revision
    in force is still the same event."""
    recorder = ledger.recorder
    require_running(conn, *MAINTAINED)
    position = recorder.head_in(conn).position
    head = state.log_head(recorder, conn)
    if head is None:
        return None
    if reuse is not None and reuse.head == head:
        parent = reuse.parent
    else:
        parent = ParentContent(*state.parent_fragments(conn, head))
    if not parent.fragments.sections[GRANTS]:
        return None
    changes = state.pending_changes(recorder, conn, head.cut)
    moved = state.moved_packs(recorder, conn, head.cut)
    return Anchor(position, head, parent, changes, moved)


def read_from_fragments(ledger: Ledger, conn: Connection) -> IncrementalRevision | None:
    """The next revision from the parent's content, or ``None`` when there is no parent
    revision to build on.

    What it reads follows the change: the revision event, the parent's content (kept
    fragments, checked against it), the binding and lifecycle events since the parent's
    cut; for the affected audiences (a binding changed, or a pack they bind had a
    lifecycle event) their bindings, validated completely (R16); for the packs those bind
    or bound, their authority (R13) and the components bound by any audience.
    Raises ``PublicationRejected`` as the full build would reject, and ``FullBuildDue``
    when the full build is the one to run."""
    anchor = read_anchor(ledger, conn)
    if anchor is None:
        return None
    position, head, parent = anchor.position, anchor.head, anchor.parent
    changes, moved = anchor.changes, anchor.moved
    affected = {c.row.audience for c in changes}
    for users in parent.binding_audiences(moved & parent.packs()).values():
        affected |= users
    limit_reuse(parent, affected)
    now: dict[tuple[str, ...], BindingRow] = {}
    for audience in affected:
        for row in parent.bindings_of(audience):
            now[row.ident] = row
    state.apply_changes(now, changes)
    bindings = [now[k] for k in sorted(now)]
    return incremental_build(ledger, conn, position, head, parent, affected, bindings, moved)


def limit_reuse(parent: ParentContent, affected: Collection[Audience]) -> None:
    """``FullBuildDue`` when so many audiences changed that the full build is cheaper."""
    if len(affected) > INCREMENTAL_LIMIT * len(parent.fragments.sections[GRANTS]):
        raise FullBuildDue("too much changed for reuse to pay")


def incremental_build(
    ledger: Ledger,
    conn: Connection,
    position: int,
    head: LogHead,
    parent: ParentContent,
    affected: set[Audience],
    bindings: list[BindingRow],
    moved: Collection[str],
    given: Mapping[str, PackAuthority | None] | None = None,
) -> IncrementalRevision:
    """The next revision after ``parent`` once the ``affected`` audiences have
    ``bindings`` (all theirs, sorted by ident), validated completely (R16).

    ``moved``: packs whose authority is not the parent's (re-read from the log);
    ``given``: authorities the caller already decided (a release's simulated
    candidates; ``None``: the pack is removed), used as they are. Every other pack
    these audiences bind or bound has the parent's authority: its activation entry
    and that generation's components (R13). Raises ``PublicationRejected`` as the full
    build would reject, and ``FullBuildDue`` when the full build is the one to run."""
    given = given or {}
    parent_packs = parent.packs()
    touched = {b.pack for b in bindings}
    for audience in affected:
        touched.update(g[2] for g in parent.grants_of(audience))
    steady = (touched & parent_packs) - set(moved) - set(given)
    packs = state.parent_authorities(ledger.recorder, conn, parent, steady)
    fresh, _ = state.log_authorities(ledger.repository(conn), touched - steady - set(given))
    packs.update(fresh)
    packs.update({p: a for p, a in given.items() if a is not None and p in touched})
    problems = validate(CatalogInput(bindings, packs))
    if problems:
        raise PublicationRejected(problems)
    bound: dict[str, set[tuple[str, str, str]]] = {p: set() for p in touched}
    for pack, users in parent.binding_audiences(touched).items():
        for audience in users - affected:
            bound[pack].update(
                (g[6], g[3], g[4]) for g in parent.grants_of(audience) if g[2] == pack
            )
    for b in bindings:
        bound[b.pack].add((b.install_id, b.kind, b.key))
    if any(
        (auth := packs.get(pack)) is None
        or install_id != auth.install_id
        or (kind, key) not in auth.components
        for pack, rows in bound.items()
        for install_id, kind, key in rows
    ):
        raise FullBuildDue("a pack is bound to what its active generation does not hold")
    following = next_revision(
        parent.fragments, bindings, affected, {p: sorted(v) for p, v in bound.items()}, packs
    )
    built = BuiltCatalog(
        activations=following.activations,
        facts=[],
        grants=[],
        content_digest=following.fragments.content_digest,
        audience_digests=following.audience_digests,
        totals=following.fragments.counts(),
    )
    return IncrementalRevision(
        position,
        _parent_state(head, parent, touched & parent_packs, affected),
        built,
        following,
        parent_packs | touched,  # what the parent or this revision binds
        head,
        parent,
        affected,
    )


def fence_ids(
    newest: Mapping[str, str],
    packs: Iterable[str],
    audiences: Iterable[tuple[str, str]],
) -> list[UUID]:
    """Every aggregate a revision over ``packs`` and ``audiences`` depends on
    (``newest``: the snapshot's newest install id of each pack)."""
    ids = [catalog_id()]
    for pack in sorted(set(packs)):
        ids.extend([activation_id(pack), history_id(pack)])
        if pack in newest:
            ids.append(generation_id(pack, newest[pack]))
    ids.extend(audience_bindings_id(k, i) for k, i in sorted(set(audiences)))
    return ids


def binding_aggregates(
    reader: Repository, changes: Iterable[BindingChange], versions: Mapping[UUID, int]
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


def positioned_catalog(reader: Repository, parent: ParentState, version: int) -> Catalog:
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


def revision_aggregates(
    reader: Repository,
    head: LogHead | None,
    plan: PublishPlan,
    everything: Callable[[], Mapping[Audience, str]],
) -> tuple[list[Aggregate], dict[UUID, int]]:
    """The aggregates that append ``plan``'s revision, and the versions they were read at.

    One ``audience_view.published`` event for each audience whose view digest changed
    against the parent (every audience in force, when the parent carries no audience map:
    the first revision of this format, or the first of all), then the revision event with
    the audience map's root (``catalog_state.audiences_root``; ``everything()`` gives every
    audience's digest after the revision, for a map made afresh)."""
    assert plan.event is not None
    event = dict(plan.event)
    revision = event.pop("revision")
    delta = event.pop("audiences")
    changed: dict[Audience, str | None] = {(kind, ident): value for kind, ident, value in delta}
    if head is None or head.audiences_root is None:
        # No audience has a view event yet: every audience in force gets one (and the
        # ones the parent served that are gone, ``None``: their rows are closed).
        changed.update(everything())
    root = state.audiences_root(reader.conn, head, changed, plan.parent.audiences, everything)
    ids = {a: published_view_id(*a) for a in changed}
    versions = reader.ledger.recorder.versions(reader.conn, [catalog_id(), *ids.values()])
    views: list[Aggregate] = []
    for audience in sorted(changed):
        aid, version = ids[audience], versions[ids[audience]]
        kind, ident = audience
        view = (
            reader.positioned(PublishedView, aid, version, audience_kind=kind, audience_id=ident)
            if version
            else PublishedView(audience_kind=kind, audience_id=ident)
        )
        view.publish(revision=revision, digest=changed[audience])
        views.append(view)
    lineage = positioned_catalog(reader, plan.parent, versions[catalog_id()])
    lineage.publish(**event, audiences_root=root)
    return [*views, lineage], versions
