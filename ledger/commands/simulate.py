"""What a release will serve, simulated before anything is appended (the full build),
and the result ``apply`` reports. ``ledger.commands.release`` builds the same on top
of the parent revision when only part of the catalog changes (R30)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, cast
from uuid import UUID

from domain.classifier import PackState
from domain.errors import LedgerError
from domain.identity import PackName
from domain.manifest import BindingSpec, Manifest
from domain.matrix import Command, Decision, Remove, rejection
from ledger.commands.publishing import CatalogInForce, catalog_outcome, fence_ids
from ledger.commands.release import FastRelease, FrozenPack, release_authorities
from ledger.commands.results import (
    ApplyResult,
    BindingChanges,
    BindingOutcome,
    PackOutcome,
    RecoveredAttempt,
)
from ledger.log.append import Head
from ledger.sources.local import KnownLocal
from ledger.sources.resolve import ResolvedPack
from publisher.catalog import CatalogInput, PackAuthority
from publisher.planning import (
    BindingChange,
    PublishPlan,
    check_binding_credentials,
    check_removals,
    plan_bindings,
    plan_publication,
)

#: A manifest pack as a release knows it: resolved from its source, or known from the
#: log without reading it (frozen official, or a local file whose bytes did not change).
Pack = ResolvedPack | FrozenPack | KnownLocal
#: pack -> (decision, the command it takes).
Plan = Mapping[str, tuple[Decision, Command | None]]


@dataclass(frozen=True)
class Release:
    """What one ``apply`` appends besides lifecycle events."""

    changes: list[BindingChange]
    publication: PublishPlan
    fence_ids: list[UUID]
    noop: bool
    authorities: dict[str, PackAuthority]
    #: What the release's removals retire (R7), in ``remove`` order.
    removed: list[PackOutcome] = field(default_factory=list)
    #: Built on the parent revision (R30): what it relied on and the fragments it keeps.
    fast: FastRelease | None = None


@dataclass(frozen=True)
class Preflight:
    """What ``apply``'s preflight decided, in one snapshot, before any append: what
    ``plan`` reports (``ledger.commands.plan``). ``preview`` is ``None`` when
    ``refused`` says why the release would be rejected."""

    command_id: str
    #: The log head the decision read, and the command id derived there (R10).
    head: Head
    derived_id: str
    packs: list[Pack]
    plan: Plan
    states: Mapping[PackName, PackState]
    preview: Release | None
    refused: LedgerError | None


def after_recovery_of(catalog: CatalogInForce, abandoned: set[str]) -> CatalogInForce:
    """The publisher's input once the next lease holder has recovered ``abandoned`` packs:
    their newest attempt is failed_dirty, which blocks publication (R12)."""
    packs = {p: replace(a, dirty=True) if p in abandoned else a for p, a in catalog.packs.items()}
    return replace(catalog, packs=packs)


def pack_names(
    resolved: Sequence[Pack],
    manifest: Manifest | None,
    plan: Mapping[str, tuple[Decision, Command | None]] | None = None,
    *,
    frozen: bool = True,
) -> list[PackName]:
    """Every pack a release reads the state of: its packs, then its removals
    (``frozen=False``: but the frozen ones, which the release knows from the anchor)."""
    removals = list(manifest.remove) if manifest is not None else removals_of(plan or {})
    return [
        PackName.trusted(r.name) for r in resolved if frozen or not isinstance(r, FrozenPack)
    ] + removals


def bound_packs(desired: Sequence[BindingSpec] | None) -> set[str]:
    """The packs a manifest's bindings name (their authority is read with the release's)."""
    return {spec.pack for spec in desired or ()}


def removals_of(plan: Mapping[str, tuple[Decision, Command | None]]) -> list[PackName]:
    return [PackName.trusted(p) for p, (d, _) in plan.items() if d is Decision.REMOVE]


def removal_outcome(state: PackState) -> PackOutcome:
    """What removing ``state``'s pack retires: its active generation (the pointer moves
    to none with epoch + 1) or its local_path record (R7)."""
    problem = rejection(Remove(), state)
    if problem is not None:  # the state moved since the plan: the matrix names why
        raise problem.error(state.pack)
    if state.local is not None and not state.local.removed:
        local = state.local
        return {
            "pack": state.pack,
            "decision": Decision.REMOVE.value,
            "source_kind": "local_path",
            "revision": None,
            "payload_hash": local.payload_hash,
            "install_id": local.install_id,
            "epoch": None,
        }
    activation = state.activation
    assert activation is not None and activation.payload_hash is not None
    return {
        "pack": state.pack,
        "decision": Decision.REMOVE.value,
        "source_kind": "official_repo",
        "revision": activation.revision,
        "payload_hash": activation.payload_hash,
        "install_id": activation.install_id,
        "epoch": activation.epoch + 1,
    }


def simulate_release(
    resolved: Sequence[Pack],
    plan: Mapping[str, tuple[Decision, Command | None]],
    states: Mapping[PackName, PackState],
    catalog: CatalogInForce,
    desired: Sequence[BindingSpec] | None,
    *,
    candidates: Mapping[str, str] | None,
    publish: bool,
) -> Release:
    """What the release will serve: simulated authorities, bindings, the revision.

    With ``candidates=None`` (preflight) install ids are predicted exactly as
    ``prepare`` will mint them; validation raises before anything is written.
    """
    packs = dict(catalog.packs)
    moved = (Decision.INSTALL, Decision.ADVANCE, Decision.ADOPT, Decision.LOCAL_UPDATE)
    stepped = [r for r in resolved if plan[r.name][0] in moved]
    for pack, authority in release_authorities(stepped, plan, states, candidates).items():
        assert authority is not None  # a step always has one
        packs[pack] = authority
    removals = removals_of(plan)
    removed = [removal_outcome(states[p]) for p in removals]
    for pack in removals:  # R7: nothing of a removed pack is served after the release
        packs.pop(pack, None)
    check_removals(catalog.bindings, desired, {p: i for i, p in enumerate(removals)})
    check_binding_credentials(desired, packs)
    rows, changes = plan_bindings(catalog.bindings, desired, packs)
    # A pack left failed_dirty by an abandoned attempt blocks publication (R12),
    # but not a release that does not bind it anew: that release applies and
    # says what still blocks publication.
    publication = plan_publication(
        CatalogInput(rows, packs),
        catalog.parent,
        None,
        defer_if_dirty=[c.row for c in changes if c.op != "revoke"],
    )
    if not publish:
        publication = PublishPlan(publication.built, publication.parent, None, publication.blocked)
    used = {row.pack for row in rows} | set(catalog.parent.activations)
    audiences = (
        {row.audience for row in rows}
        | {c.row.audience for c in changes}
        | set(catalog.parent.audiences)
    )
    unchanged = all(decision is Decision.UNCHANGED for decision, _ in plan.values())
    return Release(
        changes=changes,
        publication=publication,
        fence_ids=fence_ids(catalog.newest, used, audiences),
        noop=unchanged and not changes and not publication.changed,
        authorities=packs,
        removed=removed,
    )


def apply_result(
    cid: str,
    resolved: Sequence[Pack],
    plan: Mapping[str, tuple[Decision, Command | None]],
    candidates: Mapping[str, str],
    release: Release,
    *,
    recovered: list[RecoveredAttempt],
    noop: bool,
) -> ApplyResult:
    packs: list[PackOutcome] = []
    for r in resolved:
        decision = plan[r.name][0]
        authority = release.authorities.get(r.name)
        moved = decision in (Decision.INSTALL, Decision.ADVANCE, Decision.ADOPT)
        epoch = authority.epoch if authority is not None and moved else None
        packs.append(
            {
                "pack": r.name,
                "decision": decision.value,
                "source_kind": r.source.kind._value_,  # no enum descriptor per pack
                "revision": r.source.revision,
                "payload_hash": r.payload_hash,
                "install_id": candidates.get(r.name),
                "epoch": epoch,
            }
        )
    packs.extend(release.removed)
    bindings: BindingChanges = {"granted": [], "rebound": [], "revoked": []}
    names: dict[str, Literal["granted", "rebound", "revoked"]] = {
        "grant": "granted",
        "rebind": "rebound",
        "revoke": "revoked",
    }
    for change in release.changes:
        bindings[names[change.op]].append(cast(BindingOutcome, change.to_json()))
    return {
        "command_id": cid,
        "noop": noop,
        "replayed": False,
        "packs": packs,
        "bindings": bindings,
        "catalog": catalog_outcome(release.publication),
        "recovered": recovered,
    }


def merged(
    known: Mapping[int, FrozenPack | KnownLocal], resolved: Sequence[ResolvedPack]
) -> list[Pack]:
    """The manifest's packs in its order: those known from the log and those resolved."""
    out: dict[int, Pack] = {**known, **{r.index: r for r in resolved}}
    return [out[i] for i in sorted(out)]
