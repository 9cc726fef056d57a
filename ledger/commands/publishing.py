"""Publishing: read the publisher's input from the views, fence it, append one revision.

Everything is read in one consistent snapshot: bindings in force, every pack's
authority (active generation, source kind, dirty flag) with the components of
the active generations, the parent revision, and the versions of every
aggregate the decision depends on. The revision is built and validated in
memory (``publisher.catalog``) and appended as one event with a read fence on
the catalog, the activations, pack histories and newest attempts of every pack
it uses, and every audience's bindings (R16); a concurrent activation makes it
fail with a conflict instead of publishing a stale binding.

``publish`` is incremental when a parent revision exists: only the audiences
whose bindings changed since the parent's cut (the catalog view's pending
changes) or whose bound packs' authority changed are read and validated
completely; every other audience keeps the parent's validation and digest. The
content digest still covers the whole revision. When the parent's fragments are
kept (``ledger.store.fragments``) it is digested from them, re-encoding only the
affected audiences and the packs they bind or bound (``read_from_fragments``);
otherwise it is streamed from the views (``read_incremental``,
``stream_content``), and the fragments are kept for the next publication. Any
rejection falls back to the full build, so errors are exactly the full build's.
The fence is the full build's.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast
from uuid import UUID

import orjson
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
from ledger.log.db import stream_rows
from ledger.log.recorder import Precommit
from ledger.log.sqltypes import dec, enc
from ledger.observability import bind, get_logger, logged_command
from ledger.store import fragments
from ledger.store.runtime import Ledger, LogReader
from projections.catalog_views import (
    AUDIENCE_BINDING,
    CATALOG_ACTIVATION,
    CATALOG_AUDIENCE,
    CATALOG_PENDING,
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
    Audience,
    BindingRow,
    BuiltCatalog,
    CatalogContent,
    CatalogInput,
    Chunk,
    EncodedChunk,
    Fact,
    PackAuthority,
    ParentState,
    PublicationRejected,
    build_incremental,
    validate,
)
from publisher.fragments import (
    ACTIVATIONS,
    FACTS,
    GRANTS,
    Fragment,
    Fragments,
    NextRevision,
    Unit,
    audience_unit,
    encoded,
    next_revision,
    pack_unit,
)
from publisher.planning import BindingChange, PublishPlan, plan_built, plan_publication

#: Rows per ``IN (...)`` list.
_IN_CHUNK = 500
#: Above this share of the parent's audiences changed, a full build is cheaper.
INCREMENTAL_LIMIT = 0.25

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
    bindings = _binding_rows(conn, ab.c.view_version == v[AudienceBindingView.name], stream=True)
    packs, newest = read_authorities(conn, v)
    return CatalogSnapshot(
        position, bindings, packs, read_parent(conn, v[CatalogView.name]), newest
    )


def _binding_rows(conn: Connection, where: Any, *, stream: bool = False) -> list[BindingRow]:
    """The binding rows ``where`` selects, their repeated strings shared (one object per
    distinct pack, kind, key, install id... instead of one per row: most of a binding's
    memory). ``stream``: a query with only integer parameters, read through ``stream_rows``."""
    ab = AUDIENCE_BINDING.physical
    query = sa.select(
        ab.c.audience_kind,
        ab.c.audience_id,
        ab.c.pack,
        ab.c.kind,
        ab.c.key,
        ab.c.credential_set,
        ab.c.install_id,
        ab.c.payload_hash,
    ).where(where)
    chunks: Iterable[Sequence[Any]] = (
        stream_rows(conn, query) if stream else [[tuple(r) for r in conn.execute(query)]]
    )
    shared: dict[str, str] = {}
    one = shared.setdefault
    out: list[BindingRow] = []
    for rows in chunks:
        for r in rows:
            try:
                t = [one(s, s) for s in map(bytes.decode, r)]
            except (TypeError, UnicodeDecodeError):
                t = [one(s, s) for s in map(dec, r)]  # names the tampered value
            out.append(BindingRow(t[0], t[1], t[2], t[3], t[4], t[5] or None, t[6], t[7]))
    return out


def read_authorities(
    conn: Connection,
    versions: Mapping[str, int],
    component_packs: Collection[str] | None = None,
    *,
    only: Collection[str] | None = None,
) -> tuple[dict[str, PackAuthority], dict[str, str]]:
    """Every pack's authority (or ``only`` those packs'): active generation + components,
    source kind, dirty flag; and each pack's newest attempt.

    With ``component_packs``, only those packs' components are read (the others'
    authorities carry no components).
    """
    ip, act = INSTALLED_PACK.physical, PACK_ACTIVATION.physical
    gen = PACK_GENERATION.physical

    def rows_of(query: Any, pack: Any) -> Iterator[Sequence[Any]]:
        if only is None:  # every pack's rows (thousands at scale), as plain tuples
            yield from stream_rows(conn, query)
            return
        wanted = sorted(enc(p) for p in only)
        for start in range(0, len(wanted), _IN_CHUNK):
            chunk = wanted[start : start + _IN_CHUNK]
            yield [tuple(r) for r in conn.execute(query.where(pack.in_(chunk)))]

    kinds = {
        dec(pack): (dec(source_kind), dec(status))
        for rows in rows_of(
            sa.select(ip.c.pack, ip.c.source_kind, ip.c.status).where(
                ip.c.view_version == versions[InstalledPackView.name]
            ),
            ip.c.pack,
        )
        for pack, source_kind, status in rows
    }
    newest: dict[str, tuple[str, str]] = {}
    generations: dict[tuple[str, str], tuple[str, str | None, int | None]] = {}
    for rows in rows_of(
        sa.select(
            gen.c.pack, gen.c.install_id, gen.c.status, gen.c.applied_payload_hash, gen.c.epoch
        )
        .where(gen.c.view_version == versions[PackGenerationView.name])
        .order_by(gen.c.pack, gen.c.ordinal),
        gen.c.pack,
    ):
        for stored_pack, stored_id, stored_status, stored_applied, epoch in rows:
            pack, install_id, status = dec(stored_pack), dec(stored_id), dec(stored_status)
            newest[pack] = (install_id, status)
            applied = dec(stored_applied) if stored_applied is not None else None
            generations[(pack, install_id)] = (status, applied, epoch)
    components = read_components(conn, versions, component_packs)
    packs: dict[str, PackAuthority] = {}
    for rows in rows_of(
        sa.select(
            act.c.pack, act.c.install_id, act.c.revision, act.c.epoch, act.c.payload_hash
        ).where(act.c.view_version == versions[PackActivationView.name]),
        act.c.pack,
    ):
        for stored_pack, stored_id, stored_revision, stored_epoch, stored_hash in rows:
            pack, install_id, payload_hash = dec(stored_pack), dec(stored_id), dec(stored_hash)
            epoch = int(stored_epoch)
            _check_activation(pack, install_id, payload_hash, epoch, generations)
            packs[pack] = PackAuthority(
                pack=pack,
                source_kind="official_repo",
                install_id=install_id,
                revision=dec(stored_revision),
                epoch=epoch,
                payload_hash=payload_hash,
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


def read_components(
    conn: Connection, versions: Mapping[str, int], component_packs: Collection[str] | None
) -> dict[str, dict[tuple[str, str], Fact]]:
    """The components of the active generation of every pack (or of ``component_packs``)."""
    act, comp = PACK_ACTIVATION.physical, PACK_COMPONENT.physical
    components: dict[str, dict[tuple[str, str], Fact]] = {}
    if component_packs is not None and not component_packs:
        return components
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
    if component_packs is None:
        rows: Iterable[Any] = conn.execute(query)
    else:
        wanted = sorted(enc(p) for p in component_packs)
        rows = (
            c
            for start in range(0, len(wanted), _IN_CHUNK)
            for c in conn.execute(query.where(comp.c.pack.in_(wanted[start : start + _IN_CHUNK])))
        )
    for c in rows:
        fact = Fact.parse(bytes(c.fact), bytes(c.fact_digest))
        components.setdefault(dec(c.pack), {})[(fact.kind, fact.key)] = fact
    return components


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
    ca, cu = CATALOG_ACTIVATION.physical, CATALOG_AUDIENCE.physical
    head = read_head(conn, version)
    if head is None:
        return ParentState()
    activations: dict[str, list[Any]] = {}
    for rows in stream_rows(
        conn,
        sa.select(ca.c.pack, ca.c.install_id, ca.c.revision, ca.c.epoch, ca.c.payload_hash).where(
            ca.c.view_version == version, ca.c.to_revision == OPEN
        ),
    ):
        for pack, install_id, revision, epoch, payload_hash in rows:
            name = dec(pack)
            activations[name] = [
                name,
                dec(install_id),
                dec(revision),
                int(epoch),
                dec(payload_hash),
            ]
    audiences = {
        (dec(kind), dec(ident)): dec(digest)
        for rows in stream_rows(
            conn,
            sa.select(cu.c.audience_kind, cu.c.audience_id, cu.c.digest).where(
                cu.c.view_version == version, cu.c.to_revision == OPEN
            ),
        )
        for kind, ident, digest in rows
    }
    return ParentState(head[0], head[1], activations, audiences)


@dataclass
class IncrementalSnapshot:
    """What an incremental publication reads: the parent, every pack's authority
    (components only for the packs the affected audiences bind), the affected
    audiences and all their bindings."""

    position: int
    parent: ParentState
    packs: dict[str, PackAuthority]
    newest: dict[str, str]
    affected: set[Audience]
    bindings: list[BindingRow]
    changed_packs: set[str]
    versions: Mapping[str, int]


def read_incremental(ledger: Ledger, conn: Connection) -> IncrementalSnapshot | None:
    """The inputs of an incremental publication, or ``None`` when a full build is due
    (no parent revision, or too much changed for reuse to pay).

    An audience is *affected* when one of its bindings changed since the parent
    revision (a pending binding change of the catalog view: the changes after the
    parent's cut) or when a pack it binds no longer has the authority the parent
    bound (another active generation, activation entry, source kind, or a
    failed_dirty newest attempt). Every other audience has exactly the inputs the
    parent validated, and its generations' components are immutable.
    """
    v = require_running(conn, *_VIEWS)
    position = ledger.recorder.head_in(conn).position
    parent = read_parent(conn, v[CatalogView.name])
    if parent.revision == 0 or not parent.audiences:
        return None
    packs, newest = read_authorities(conn, v, component_packs=())
    changed_packs = _changed_packs(parent.activations, packs)
    affected = _affected(conn, v, changed_packs)
    if len(affected) > INCREMENTAL_LIMIT * len(parent.audiences):
        return None
    bindings = _bindings_of(conn, v, affected)
    components = read_components(conn, v, {b.pack for b in bindings})
    for pack, found in components.items():
        packs[pack] = replace(packs[pack], components=found)
    return IncrementalSnapshot(
        position, parent, packs, newest, affected, bindings, changed_packs, v
    )


def _changed_packs(
    parent_activations: Mapping[str, list[Any]], packs: Mapping[str, PackAuthority]
) -> set[str]:
    """The packs the parent bound whose authority is not the one it bound."""
    return {
        pack
        for pack, entry in parent_activations.items()
        if (auth := packs.get(pack)) is None
        or auth.source_kind != "official_repo"
        or auth.dirty
        or auth.entry() != entry
    }


def _affected(
    conn: Connection, versions: Mapping[str, int], changed_packs: Collection[str]
) -> set[Audience]:
    """The audiences with a binding change after the parent's cut, or binding a pack of
    ``changed_packs``."""
    pending = CATALOG_PENDING.physical
    affected: set[Audience] = {
        (dec(r.audience_kind), dec(r.audience_id))
        for r in conn.execute(
            sa.select(pending.c.audience_kind, pending.c.audience_id)
            .where(pending.c.view_version == versions[CatalogView.name])
            .distinct()
        )
    }
    ab = AUDIENCE_BINDING.physical
    vb = versions[AudienceBindingView.name]
    moved = sorted(enc(p) for p in changed_packs)
    for start in range(0, len(moved), _IN_CHUNK):
        affected.update(
            (dec(r.audience_kind), dec(r.audience_id))
            for r in conn.execute(
                sa.select(ab.c.audience_kind, ab.c.audience_id)
                .where(ab.c.view_version == vb, ab.c.pack.in_(moved[start : start + _IN_CHUNK]))
                .distinct()
            )
        )
    return affected


def _bindings_of(
    conn: Connection, versions: Mapping[str, int], audiences: Collection[Audience]
) -> list[BindingRow]:
    """Every binding in force of ``audiences``."""
    ab = AUDIENCE_BINDING.physical
    by_kind: dict[str, list[bytes]] = {}
    for kind, ident in audiences:
        by_kind.setdefault(kind, []).append(enc(ident))
    bindings: list[BindingRow] = []
    for kind, idents in sorted(by_kind.items()):
        idents.sort()
        for start in range(0, len(idents), _IN_CHUNK):
            bindings.extend(
                _binding_rows(
                    conn,
                    sa.and_(
                        ab.c.view_version == versions[AudienceBindingView.name],
                        ab.c.audience_kind == enc(kind),
                        ab.c.audience_id.in_(idents[start : start + _IN_CHUNK]),
                    ),
                )
            )
    return bindings


def _bound_components(
    conn: Connection, versions: Mapping[str, int], packs: Collection[str]
) -> dict[str, list[tuple[str, str, str]]]:
    """Each of ``packs``' distinct bound ``(install_id, kind, key)``, by any audience."""
    ab = AUDIENCE_BINDING.physical
    out: dict[str, list[tuple[str, str, str]]] = {p: [] for p in packs}
    wanted = sorted(enc(p) for p in packs)
    for start in range(0, len(wanted), _IN_CHUNK):
        for r in conn.execute(
            sa.select(ab.c.pack, ab.c.install_id, ab.c.kind, ab.c.key)
            .where(
                ab.c.view_version == versions[AudienceBindingView.name],
                ab.c.pack.in_(wanted[start : start + _IN_CHUNK]),
            )
            .distinct()
        ):
            out[dec(r.pack)].append((dec(r.install_id), dec(r.kind), dec(r.key)))
    return out


def _audience_digests(
    conn: Connection, version: int, audiences: Collection[Audience]
) -> dict[Audience, str]:
    """The parent revision's digests of those of ``audiences`` it has."""
    cu = CATALOG_AUDIENCE.physical
    by_kind: dict[str, list[bytes]] = {}
    for kind, ident in audiences:
        by_kind.setdefault(kind, []).append(enc(ident))
    out: dict[Audience, str] = {}
    for kind, idents in sorted(by_kind.items()):
        idents.sort()
        for start in range(0, len(idents), _IN_CHUNK):
            for r in conn.execute(
                sa.select(cu.c.audience_id, cu.c.digest).where(
                    cu.c.view_version == version,
                    cu.c.to_revision == OPEN,
                    cu.c.audience_kind == enc(kind),
                    cu.c.audience_id.in_(idents[start : start + _IN_CHUNK]),
                )
            ):
                out[(kind, dec(r.audience_id))] = dec(r.digest)
    return out


@dataclass
class FragmentSnapshot:
    """An incremental publication built from the parent's kept fragments: the parent
    as far as the revision event's delta needs it (the packs and audiences re-encoded),
    the snapshot's newest attempts (for the fence) and the next revision."""

    position: int
    parent: ParentState
    newest: dict[str, str]
    built: BuiltCatalog
    next: NextRevision
    used: set[str]
    audiences: set[Audience]


class FullBuildDue(Exception):
    """An incremental publication gives way to the full build (which names problems)."""


def read_from_fragments(ledger: Ledger, conn: Connection) -> FragmentSnapshot | None:
    """The next revision from the parent's kept fragments (``ledger.store.fragments``),
    or ``None`` when there are none to trust or too much changed.

    What it reads follows the change, not the catalog, but for each pack's newest
    attempt, one join of the parent's activations with the current ones, and the kept
    fragments: the affected audiences (as ``read_incremental`` finds them) with all
    their bindings, validated completely (R16); the packs those bind or bound, with
    their authorities (R13) and the components bound by any audience.
    Raises ``PublicationRejected`` as the full build would reject, and ``FullBuildDue``
    when the full build is the one to run (the caller then runs it; it names every
    problem).
    """
    v = require_running(conn, *_VIEWS)
    position = ledger.recorder.head_in(conn).position
    head = read_head(conn, v[CatalogView.name])
    if head is None:
        return None
    kept = fragments.read(conn, *head)
    if kept is None or not kept.sections[GRANTS]:
        return None
    newest, dirty = _newest_attempts(conn, v)
    try:
        parent_packs = kept.packs()
    except UnicodeDecodeError:
        return None  # not fragments this code wrote, though they digest right: not used
    affected = _affected(conn, v, (_moved_packs(conn, v) | dirty) & parent_packs)
    if len(affected) > INCREMENTAL_LIMIT * len(kept.sections[GRANTS]):
        raise FullBuildDue("too much changed for reuse to pay")
    bindings = _bindings_of(conn, v, affected)
    touched = {b.pack for b in bindings}
    try:
        for audience in affected:
            touched.update(e[2] for e in kept.entries(GRANTS, audience_unit(audience)))
    except (orjson.JSONDecodeError, IndexError, TypeError):
        return None
    # Only the packs re-encoded: their authority, checked (R13) and with components.
    packs, _ = read_authorities(conn, v, component_packs=touched, only=touched)
    problems = validate(CatalogInput(bindings, packs))
    if problems:
        raise PublicationRejected(problems)
    bound = _bound_components(conn, v, touched)
    if any(
        (auth := packs.get(pack)) is None
        or install_id != auth.install_id
        or (kind, key) not in auth.components
        for pack, rows in bound.items()
        for install_id, kind, key in rows
    ):
        raise FullBuildDue("a pack is bound to what its active generation does not hold")
    following = next_revision(kept, bindings, affected, bound, packs)
    try:
        parent_activations = {
            p: kept.entries(ACTIVATIONS, pack_unit(p))[0] for p in touched & parent_packs
        }
    except (orjson.JSONDecodeError, IndexError):
        return None
    parent = ParentState(
        revision=kept.revision,
        content_digest=kept.content_digest,
        activations=parent_activations,
        audiences=_audience_digests(conn, v[CatalogView.name], affected),
    )
    built = BuiltCatalog(
        activations=following.activations,
        facts=[],
        grants=[],
        content_digest=following.fragments.content_digest,
        audience_digests=following.audience_digests,
        totals=following.fragments.counts(),
    )
    return FragmentSnapshot(
        position,
        parent,
        newest,
        built,
        following,
        parent_packs | touched,  # what the parent or this revision binds
        kept.audiences() | affected,
    )


def _newest_attempts(
    conn: Connection, versions: Mapping[str, int]
) -> tuple[dict[str, str], set[str]]:
    """Each pack's newest attempt (install id), and the packs whose newest attempt is
    failed_dirty (their publication is blocked, R12)."""
    gen = PACK_GENERATION.physical
    newest: dict[str, tuple[str, str]] = {}
    for rows in stream_rows(
        conn,
        sa.select(gen.c.pack, gen.c.install_id, gen.c.status)
        .where(gen.c.view_version == versions[PackGenerationView.name])
        .order_by(gen.c.pack, gen.c.ordinal),
    ):
        for pack, install_id, status in rows:
            newest[dec(pack)] = (dec(install_id), dec(status))
    return (
        {p: i for p, (i, _) in newest.items()},
        {p for p, (_, status) in newest.items() if status == "failed_dirty"},
    )


def _moved_packs(conn: Connection, versions: Mapping[str, int]) -> set[str]:
    """The packs the parent revision bound whose activation is gone or is not the one
    it bound (one query: every other pack keeps the parent's authority, but for a
    failed_dirty newest attempt, ``_newest_attempts``)."""
    ca, act = CATALOG_ACTIVATION.physical, PACK_ACTIVATION.physical
    query = (
        sa.select(ca.c.pack)
        .select_from(
            ca.outerjoin(
                act,
                sa.and_(
                    act.c.view_version == versions[PackActivationView.name],
                    act.c.pack == ca.c.pack,
                ),
            )
        )
        .where(
            ca.c.view_version == versions[CatalogView.name],
            ca.c.to_revision == OPEN,
            sa.or_(
                act.c.pack.is_(None),
                act.c.install_id != ca.c.install_id,
                act.c.revision != ca.c.revision,
                act.c.epoch != ca.c.epoch,
                act.c.payload_hash != ca.c.payload_hash,
            ),
        )
    )
    return {dec(r[0]) for r in conn.execute(query)}


def read_head(conn: Connection, version: int) -> tuple[int, str, dict[str, int]] | None:
    """The head revision's number, content digest and counts (``None``: none yet)."""
    rev = CATALOG_REVISION.physical
    head = conn.execute(
        sa.select(
            rev.c.revision,
            rev.c.content_digest,
            rev.c.audiences,
            rev.c.activations,
            rev.c.facts,
            rev.c.grants,
        )
        .where(rev.c.view_version == version)
        .order_by(rev.c.revision.desc())
        .limit(1)
    ).one_or_none()
    if head is None:
        return None
    counts = {k: int(head._mapping[k]) for k in ("audiences", "activations", "facts", "grants")}
    return int(head.revision), dec(head.content_digest), counts


def stream_content(
    conn: Connection,
    versions: Mapping[str, int],
    packs: Mapping[str, PackAuthority],
    keep: Fragments | None = None,
) -> CatalogContent:
    """The whole revision's content from the views, in canonical (bytewise) order:
    what an incremental publication digests. Streamed in chunks; nothing per row is
    kept, but with ``keep`` each pack's and audience's fragment (``publisher.fragments``)
    is collected there as it streams by. Call it only after every binding is known
    valid (then every binding names its pack's active generation, whose components
    hold the facts)."""
    ab, comp = AUDIENCE_BINDING.physical, PACK_COMPONENT.physical
    vb = versions[AudienceBindingView.name]
    used = sorted(
        dec(r.pack)
        for r in conn.execute(sa.select(ab.c.pack).where(ab.c.view_version == vb).distinct())
    )
    activations = [packs[p].entry() for p in used]
    if keep is not None:
        for entry in activations:
            keep.sections[ACTIVATIONS][pack_unit(entry[0])] = encoded([entry])
    # The distinct bound components first, then one component lookup each (not one per
    # binding): SQLite's plan for a DISTINCT over the join joins every binding first.
    bound = (
        sa.select(ab.c.pack, ab.c.install_id, ab.c.kind, ab.c.key)
        .where(ab.c.view_version == vb)
        .distinct()
        .subquery("bound")
    )
    facts_query = (
        sa.select(bound.c.pack, bound.c.install_id, bound.c.kind, bound.c.key, comp.c.fact_digest)
        .join(
            comp,
            sa.and_(
                comp.c.view_version == versions[PackComponentView.name],
                comp.c.pack == bound.c.pack,
                comp.c.install_id == bound.c.install_id,
                comp.c.kind == bound.c.kind,
                comp.c.key == bound.c.key,
            ),
        )
        .order_by(bound.c.pack, bound.c.install_id, bound.c.kind, bound.c.key)
    )
    grants_query = (
        sa.select(
            ab.c.audience_kind,
            ab.c.audience_id,
            ab.c.pack,
            ab.c.kind,
            ab.c.key,
            ab.c.credential_set,
            ab.c.install_id,
        )
        .where(ab.c.view_version == vb)
        .order_by(
            ab.c.audience_kind,
            ab.c.audience_id,
            ab.c.pack,
            ab.c.kind,
            ab.c.key,
            ab.c.credential_set,
        )
    )

    def fact_chunk(rows: Sequence[Any]) -> Chunk:
        return _encoded(rows, _fact_json, 4) or [
            [dec(p), dec(i), dec(k), dec(key), bytes(d).hex()] for p, i, k, key, d in rows
        ]

    def grant_chunk(rows: Sequence[Any]) -> Chunk:
        return _encoded(rows, _grant_json, 7) or [
            [dec(a), dec(b), dec(p), dec(k), dec(key), dec(c) or None, dec(i)]
            for a, b, p, k, key, c, i in rows
        ]

    def chunks(
        query: Any, chunk: Callable[[Sequence[Any]], Chunk], section: int, width: int
    ) -> Iterator[Chunk]:
        for rows in stream_rows(conn, query):
            if keep is None:
                yield chunk(rows)
                continue
            for key, run in itertools.groupby(rows, key=lambda r: r[:width]):
                piece = chunk(list(run))
                unit = (enc(dec(key[0])), enc(dec(key[1])) if width > 1 else b"")
                _keep(keep.sections[section], unit, piece)
                yield piece

    return CatalogContent(
        activations,
        chunks(facts_query, fact_chunk, FACTS, 1),
        chunks(grants_query, grant_chunk, GRANTS, 2),
    )


def _keep(section: dict[Unit, Fragment], unit: Unit, chunk: Chunk) -> None:
    """Add ``chunk`` (entries of ``unit``) to its fragment (a unit may span two reads)."""
    count, body = (chunk.count, chunk.body) if isinstance(chunk, EncodedChunk) else encoded(chunk)
    if count:
        kept = section.get(unit)
        section[unit] = (count, body) if kept is None else (kept[0] + count, kept[1] + b"," + body)


#: Bytes that canonical JSON escapes inside a string (orjson: control, quote, backslash).
_ESCAPED = re.compile(rb'[\x00-\x1f"\\]')


def _encoded(
    rows: Sequence[Any], encode: Callable[[Any], bytes], texts: int
) -> EncodedChunk | None:
    """``rows`` as canonical JSON entries, without decoding each value: their first
    ``texts`` columns are stored identity bytes, valid when every one is bytes, valid
    UTF-8 and needs no JSON escape (a JSON string is then the bytes between quotes).
    ``None`` otherwise: the caller decodes (``dec`` names a tampered value) and lets
    orjson escape."""
    try:
        # "," ends any UTF-8 sequence, so each value is checked on its own.
        values = b",".join(itertools.chain.from_iterable(r[:texts] for r in rows))
        values.decode("utf-8")
        if _ESCAPED.search(values) is not None:
            return None
        return EncodedChunk(b",".join(map(encode, rows)), len(rows))
    except (TypeError, AttributeError, UnicodeDecodeError):
        return None


def _fact_json(r: Any) -> bytes:
    return b'["%s","%s","%s","%s","%s"]' % (r[0], r[1], r[2], r[3], r[4].hex().encode())


def _grant_json(r: Any) -> bytes:
    cred = b'"%s"' % r[5] if r[5] else b"null"
    return b'["%s","%s","%s","%s","%s",%s,"%s"]' % (r[0], r[1], r[2], r[3], r[4], cred, r[6])


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
    """A validated revision built in memory, not yet appended.

    ``fence`` holds the catalog lineage's version; ``unchanged`` refuses the append if
    any other aggregate the revision was built from moved after the snapshot.
    """

    result: PublishResult
    aggregates: list[Aggregate]
    fence: dict[UUID, int]
    unchanged: Precommit


log = get_logger("publish")


def _then(first: Precommit, second: Precommit) -> Precommit:
    def both(conn: Connection) -> None:
        first(conn)
        second(conn)

    return both


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
    """The ``publish`` command: validate every audience, append one revision (R16).

    ``incremental`` (default) reuses the parent revision's validation and digests
    of the audiences whose inputs did not change (``read_incremental``); ``False``
    always rebuilds the whole revision. Both publish identical revisions.
    """

    incremental: bool = True

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
            catalog, publication, used, audiences, keep = self._plan_publication(reader.conn)
            result: PublishResult = {
                "command_id": cid,
                "noop": publication.event is None,
                "replayed": False,
                **catalog_outcome(publication),
            }
            if publication.event is None:
                return result
            versions = self.ledger.recorder.versions(reader.conn, [catalog_id()])
            lineage = positioned_catalog(reader, catalog.parent, versions[catalog_id()])
        lineage.publish(**{k: v for k, v in publication.event.items() if k != "revision"})
        record = CommandRecord(
            command_id=cid, kind="publish", request_digest=request_digest, result=dict(result)
        )
        # Fenced on everything it read, by the snapshot's position: the aggregate ids
        # (thousands at scale) are derived only if anything was appended since. (The
        # lambda keeps the small inputs of the ids, not the snapshot and its bindings.)
        newest = catalog.newest
        unchanged = self.ledger.recorder.unchanged_since(
            catalog.position, lambda: fence_ids(newest, used, audiences)
        )
        if keep is not None:  # the revision's fragments, kept in its own transaction
            unchanged = _then(unchanged, keep)
        return StagedPublication(result, [lineage, record], versions, unchanged)

    def _plan_publication(
        self, conn: Connection
    ) -> tuple[
        CatalogSnapshot | IncrementalSnapshot | FragmentSnapshot,
        PublishPlan,
        set[str],
        set[tuple[str, str]],
        Precommit | None,
    ]:
        """The publication plan, incremental when the parent revision can be reused.

        Returns the snapshot read, the plan, the packs and audiences the decision
        depends on (every one is fenced, as for a full build), and what keeps the new
        revision's fragments in its append transaction (``None``: nothing to keep).
        """
        if self.incremental:
            try:
                planned = self._plan_from_fragments(conn) or self._plan_streamed(conn)
            except (PublicationRejected, FullBuildDue):
                planned = None  # the full build below names every problem, as it always has
            if planned is not None:
                return planned
        catalog = read_snapshot(self.ledger, conn)
        plan = plan_publication(catalog.input(), catalog.parent, catalog.position, keep_rows=False)
        used = {row.pack for row in catalog.bindings} | set(catalog.parent.activations)
        audiences = {row.audience for row in catalog.bindings} | set(catalog.parent.audiences)
        return catalog, plan, used, audiences, None

    def _plan_from_fragments(
        self, conn: Connection
    ) -> tuple[FragmentSnapshot, PublishPlan, set[str], set[Audience], Precommit | None] | None:
        """The plan from the parent's kept fragments (``read_from_fragments``)."""
        snap = read_from_fragments(self.ledger, conn)
        if snap is None:
            return None
        plan = plan_built(snap.built, snap.parent, snap.position)
        keep = None
        if plan.event is not None:
            keep = fragments.writer(snap.next.fragments, snap.next.changes)
        return snap, plan, snap.used, snap.audiences, keep

    def _plan_streamed(
        self, conn: Connection
    ) -> tuple[IncrementalSnapshot, PublishPlan, set[str], set[Audience], Precommit | None] | None:
        """The plan of an incremental build that digests the revision from the views
        (``read_incremental``), keeping its fragments for the next publication."""
        inc = read_incremental(self.ledger, conn)
        if inc is None:
            return None
        kept = Fragments(inc.parent.revision + 1, "") if fragments.present(conn) else None
        built = build_incremental(
            CatalogInput(inc.bindings, inc.packs),
            inc.affected,
            inc.parent,
            lambda: stream_content(conn, inc.versions, inc.packs, kept),
        )
        plan = plan_built(built, inc.parent, inc.position)
        keep = None
        if kept is not None and plan.event is not None:
            kept.content_digest = built.content_digest
            if kept.digest() == built.content_digest:
                keep = fragments.writer(kept, None)
        used = {a[0] for a in built.activations} | set(inc.parent.activations)
        audiences = set(built.audience_digests) | set(inc.parent.audiences)
        return inc, plan, used, audiences, keep

    def commit_publication(self, staged: StagedPublication) -> PublishResult:
        """Append the staged revision as one event, fenced on everything it read."""
        self.ledger.app.save(*staged.aggregates, fence=staged.fence, precommit=staged.unchanged)
        return staged.result
