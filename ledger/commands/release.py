"""A release whose cost follows its change (R30): what ``apply`` decides on when a
parent revision exists, read in time proportional to what moved.

The anchor is the revision in force as the log committed it (``catalog_state``): its
verified content (the kept fragments), and the binding and lifecycle events after its
cut (O(events since)). From it:

* **frozen packs** — an ``official_repo`` pack of the manifest whose
  ``(repo, revision, path)`` equals the frozen source of the generation the parent
  binds, with no lifecycle event since the cut and no attempt after that generation
  (its history's newest attempt is it), is left as it is without being resolved
  again (an ``official_repo@commit`` is immutable, R9): its payload hash and category
  come from the pointer event that activated that generation, for the request digest
  (R10) too. Two batched reads of small events over the manifest's packs (the
  activation pointer's and the attempt history's last), no git, no parsing;
* **the release's revision** is built as ``publish``'s incremental path builds one
  (``publishing.incremental_build``): only the audiences whose bindings change, or
  that bind a pack the release or the log moved, are validated and re-encoded, and the
  fragments are kept for the next publication.

Anything the fast path cannot decide alone (no parent, abandoned attempts to recover,
too much changed, a rejection to name) gives way to the full build, whose errors are
the ones users see.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from sqlalchemy.engine import Connection

from domain.catalog import audience_bindings_id, catalog_id
from domain.classifier import PackState
from domain.event_types import T_ADVANCED, T_REINSTALLED, T_STARTED
from domain.identity import PackName
from domain.lifecycle import SourceFacts, SourceKind, activation_id, history_id, install_id_for
from domain.manifest import BindingSpec, LocalSource, Manifest, OfficialSource
from domain.matrix import Decision, Target, decide
from ledger.commands import catalog_state as state
from ledger.commands.catalog_state import ParentContent
from ledger.commands.catalog_state import authority_of as catalog_authority
from ledger.commands.publishing import (
    Anchor,
    IncrementalRevision,
    incremental_build,
    limit_reuse,
)
from ledger.log.recorder import LedgerRecorder
from ledger.sources.git import repo_path
from ledger.sources.local import KnownLocal, known_local
from ledger.sources.resolve import resolve_packs
from ledger.store.runtime import Ledger
from publisher.catalog import BindingRow, BuiltCatalog, PackAuthority, ParentState
from publisher.planning import (
    BindingChange,
    BindingDelta,
    PublishPlan,
    check_binding_credentials,
    check_removals,
    content_authority,
    plan_bindings,
    plan_built,
)

#: The pointer events that leave a pack active at a generation, with its frozen source.
POINTED = frozenset({T_STARTED, T_ADVANCED, T_REINSTALLED})


@dataclass(frozen=True)
class FrozenPack:
    """A manifest pack left as it is, known from the log without reading its source."""

    index: int
    name: str
    source: SourceFacts
    payload_hash: str
    category: str
    #: The parent's activation entry of the pack (``PackAuthority.entry()``'s order).
    entry: list[Any]

    @property
    def target(self) -> Target:
        return Target(category=self.category, source=self.source, payload_hash=self.payload_hash)


def frozen_packs(
    recorder: LedgerRecorder, conn: Connection, anchor: Anchor, manifest: Manifest, base: Path
) -> dict[int, FrozenPack]:
    """The manifest's packs (by index) that the release leaves as they are, from the log."""
    wanted: dict[int, tuple[OfficialSource, list[Any]]] = {}
    for index, pack in enumerate(manifest.packs):
        source = pack.source
        if not isinstance(source, OfficialSource) or pack.name in anchor.moved:
            continue
        entry = anchor.parent.entry(pack.name)
        if entry is None or entry[2] != source.revision or not isinstance(entry[4], str):
            continue
        wanted[index] = (source, entry)
    if not wanted:
        return {}
    names = {index: str(manifest.packs[index].name) for index in wanted}
    pointers = recorder.last_events(conn, [activation_id(n) for n in names.values()])
    # The newest attempt is the active generation when attempt number <history version>
    # has its install id: attempt ids are minted from (pack, revision, payload hash,
    # ordinal), and each history event records one attempt (R6). A version, not an event.
    attempts = recorder.versions(conn, [history_id(n) for n in names.values()])
    locators: dict[str, str] = {}
    out: dict[int, FrozenPack] = {}
    for index, (source, entry) in wanted.items():
        name, install_id = names[index], entry[1]
        pointer = pointers.get(activation_id(name))
        if (
            pointer is None
            or pointer.type not in POINTED
            or install_id_for(name, entry[2], entry[4], attempts[history_id(name)]) != install_id
        ):
            continue
        data = pointer.data
        frozen = data.get("source")
        if (
            data.get("pack") != name
            or data.get("install_id") != install_id
            or data.get("payload_hash") != entry[4]
            or data.get("epoch") != entry[3]
            or not isinstance(frozen, dict)
            or not isinstance(data.get("category"), str)
        ):
            continue
        if source.repo not in locators:  # the manifest's repo, as resolving it would name it
            locators[source.repo] = str(repo_path(source.repo, base, index))
        if (
            frozen.get("kind") != SourceKind.OFFICIAL_REPO.value
            or frozen.get("locator") != locators[source.repo]
            or frozen.get("revision") != source.revision
            or frozen.get("path") != source.path
        ):
            continue
        out[index] = FrozenPack(
            index=index,
            name=name,
            source=SourceFacts(
                SourceKind.OFFICIAL_REPO, locators[source.repo], source.revision, source.path
            ),
            payload_hash=entry[4],
            category=data["category"],
            entry=list(entry),
        )
    return out


@dataclass(frozen=True)
class FastRelease:
    """What the release publishes, built incrementally, and what its append relies on."""

    changes: list[BindingChange]
    publication: PublishPlan
    fence_ids: list[UUID]
    authorities: dict[str, PackAuthority]
    #: The incremental revision (``None``: nothing to publish).
    revision: IncrementalRevision | None
    #: Every pack the decision read: the append's read fence (R11), with every
    #: binding event (the revision claims all of them before it: its cut is None).
    relied_packs: set[str]

    @property
    def unchanged(self) -> bool:
        return not self.changes and not self.publication.changed


def simulate_fast(
    ledger: Ledger,
    conn: Connection,
    anchor: Anchor,
    frozen: Collection[FrozenPack],
    given: Mapping[str, PackAuthority | None],
    desired: Sequence[BindingSpec] | None,
    removals: Mapping[str, int],
    *,
    publish: bool,
) -> FastRelease:
    """The release's bindings and revision on top of ``anchor``.

    ``given``: the authority after the release of every manifest pack that was read
    (candidates simulated, unchanged ones from their log state; ``None``: removed);
    ``frozen`` packs keep the parent's. Raises what the full build raises before any
    append for a binding problem it can name (R7 removals, R15 credential sets), and
    ``PublicationRejected``/``FullBuildDue`` when the full build must decide."""
    parent = anchor.parent
    parent_packs = parent.packs()
    auth: dict[str, PackAuthority] = {
        f.name: PackAuthority.official(f.entry, {}, dirty=False) for f in frozen
    }
    auth.update({p: a for p, a in given.items() if a is not None})
    moved = anchor.moved | set(given)
    if desired is not None or removals:
        current = state.apply_changes(parent.all_bindings(), anchor.changes)
    else:  # bindings kept as they are: only those of what moved can be re-bound (R14)
        current = _bindings_of_moved(parent, anchor, moved)
    bound = (
        {s.pack for s in desired}
        if desired is not None
        else parent_packs | {r.pack for r in current.values()}
    )
    missing = bound - auth.keys() - set(given)
    steady = (missing & parent_packs) - anchor.moved
    auth.update({p: PackAuthority.official(parent.entry(p) or [], {}, dirty=False) for p in steady})
    read, _ = state.log_authorities(ledger.repository(conn), missing - steady)
    auth.update(read)
    log_read: dict[str, PackAuthority | None] = {**given, **read}
    check_removals(current.values(), desired, removals)
    if desired is not None:
        delta = BindingDelta.of(current, desired, auth)
        changes, rows_of = delta.changes, delta.rows_of
    else:  # the current set, re-bound to what moved
        rows, changes = plan_bindings(current.values(), None, auth)
        rows_of = lambda audiences: [r for r in rows if r.audience in audiences]  # noqa: E731
    granted = {c.row.ident for c in changes if c.op != "revoke"}
    specs = [s for s in desired or () if s.credential_set is not None and s.sort_key() in granted]
    if specs:  # R15 on the bindings this release grants or rebinds, with their components
        lean = {s.pack for s in specs} - set(log_read)
        with_components = {**auth, **state.parent_authorities(ledger.recorder, conn, parent, lean)}
        check_binding_credentials(specs, with_components)
    affected = {c.row.audience for c in anchor.changes} | {c.row.audience for c in changes}
    for users in parent.binding_audiences(moved & parent_packs).values():
        affected |= users
    relied_packs = parent_packs | bound | set(given) | {f.name for f in frozen}
    fence = [
        catalog_id(),
        *(audience_bindings_id(*a) for a in sorted({c.row.audience for c in changes})),
    ]
    head = anchor.head
    if not affected:  # nothing served changes: the parent stays in force
        built = BuiltCatalog([], [], [], head.content_digest, {}, totals=dict(head.counts))
        plan = plan_built(built, ParentState(head.revision, head.content_digest), None)
        return FastRelease(changes, plan, fence, auth, None, relied_packs)
    limit_reuse(parent, affected)
    bindings = rows_of(affected)
    revision = incremental_build(
        ledger, conn, anchor.position, head, parent, affected, bindings, anchor.moved, log_read
    )
    plan = plan_built(revision.built, revision.parent, None)
    if not publish:
        plan = PublishPlan(plan.built, plan.parent, None)
    auth.update({p: a for p, a in given.items() if a is not None})
    return FastRelease(changes, plan, fence, auth, revision, relied_packs)


def release_authorities(
    packs: Sequence[Any],
    plan: Mapping[str, tuple[Decision, Any]],
    states: Mapping[PackName, PackState],
    candidates: Mapping[str, str] | None,
) -> dict[str, PackAuthority | None]:
    """The authority after the release of every manifest pack whose state was read:
    candidates as they will be activated (install ids predicted exactly as ``prepare``
    mints them, or the ``candidates`` it minted), adoptions, local updates, and the
    unchanged ones from their log state (R13). Frozen packs are not here: they keep
    the parent's."""
    given: dict[str, PackAuthority | None] = {}
    for r in packs:
        if isinstance(r, FrozenPack):
            continue
        decision = plan[r.name][0]
        state = states[PackName.trusted(r.name)]
        revision = r.source.revision or ""
        if decision in (Decision.INSTALL, Decision.ADVANCE):
            install_id = (candidates or {}).get(r.name) or install_id_for(
                r.name, revision, r.payload_hash, state.next_ordinal
            )
            epoch = state.activation.epoch + 1 if state.activation else 1
            given[r.name] = content_authority(r.name, install_id, revision, epoch, r.content)
        elif decision is Decision.ADOPT:
            assert state.legacy is not None
            given[r.name] = content_authority(
                r.name, state.legacy.install_id, revision, 1, r.content
            )
        elif decision is Decision.LOCAL_UPDATE:
            given[r.name] = PackAuthority(pack=r.name, source_kind="local_path")
        else:
            given[r.name] = catalog_authority(state)
    return given


def known_packs(
    ledger: Ledger, conn: Connection, anchor: Anchor | None, manifest: Manifest, base: Path
) -> dict[int, FrozenPack | KnownLocal]:
    """The manifest's packs (by index) known from the log without reading their
    content: frozen official packs, and local packs whose file's bytes are the ones the
    log recorded (their state is read: local packs are few, development only)."""
    out: dict[int, FrozenPack | KnownLocal] = {}
    if anchor is not None:
        out.update(frozen_packs(ledger.recorder, conn, anchor, manifest, base))
    local = {i: p for i, p in enumerate(manifest.packs) if isinstance(p.source, LocalSource)}
    if local:
        states = ledger.repository(conn).pack_states([p.name for p in local.values()])
        for index, pack in local.items():
            assert isinstance(pack.source, LocalSource)
            known = known_local(index, pack, pack.source, base, states[pack.name])
            if known is not None:
                out[index] = known
    return out


def confirm_frozen(
    ledger: Ledger,
    conn: Connection,
    seen: Anchor | None,
    anchor: Anchor | None,
    manifest: Manifest,
    packs: list[Any],
    base: Path,
) -> list[Any]:
    """The release's packs with every frozen one still frozen at this snapshot;
    any other is resolved from its source now (a pack moved since it was read)."""
    was = {r.index: r for r in packs if isinstance(r, FrozenPack)}
    if not was:
        return packs
    if (
        seen is not None
        and anchor is not None
        and seen.head == anchor.head
        and not any(r.name in anchor.moved for r in was.values())
    ):  # the same revision in force, and none of them moved since its cut
        return packs
    still = (
        frozen_packs(ledger.recorder, conn, anchor, manifest, base) if anchor is not None else {}
    )
    thaw = [i for i in was if i not in still]
    skip = [i for i in range(len(manifest.packs)) if i not in thaw]
    fresh = (
        {r.index: r for r in resolve_packs(manifest.packs, base=base, skip=skip)} if thaw else {}
    )
    # A pack still frozen is taken at this anchor: its entry may be a newer generation.
    return [still.get(r.index) or fresh.get(r.index, r) if r.index in was else r for r in packs]


def thaw_locals(
    packs: list[Any], states: Mapping[PackName, PackState], manifest: Manifest, base: Path
) -> list[Any]:
    """The release's packs with every local one whose unchanged bytes no longer mean
    "unchanged" at this snapshot (its record moved) parsed from its file after all."""
    thaw = [
        r.index
        for r in packs
        if isinstance(r, KnownLocal)
        and decide(states[PackName.trusted(r.name)], r.target)[0] is not Decision.UNCHANGED
    ]
    if not thaw:
        return packs
    skip = [i for i in range(len(manifest.packs)) if i not in thaw]
    fresh = {r.index: r for r in resolve_packs(manifest.packs, base=base, skip=skip)}
    return [fresh.get(r.index, r) for r in packs]


def _bindings_of_moved(
    parent: ParentContent, anchor: Anchor, moved: Collection[str]
) -> dict[tuple[str, ...], BindingRow]:
    """The bindings in force of the audiences a release without ``bindings`` can change:
    those binding a pack whose authority moved (by the release or since the cut), and
    those with a binding event since the cut. Every other audience's bindings name the
    parent's generations of packs that did not move: re-bound, they are the same."""
    audiences = {c.row.audience for c in anchor.changes}
    for users in parent.binding_audiences(set(moved) & parent.packs()).values():
        audiences |= users
    rows: dict[tuple[str, ...], BindingRow] = {
        (r.audience_kind, r.audience_id, r.pack, r.kind, r.key, r.credential_set or ""): r
        for a in sorted(audiences)
        for r in parent.bindings_of(a)
    }
    return state.apply_changes(rows, anchor.changes)
