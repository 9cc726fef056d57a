"""``apply``: converge the store to a release manifest (packs, bindings, one revision).

1. resolve every pack of the manifest and read its state in one snapshot;
2. decide (install, adopt, advance, local update, unchanged, remove) and reject,
   naming every pack and reason, before any append;
3. under the writer lease: recover abandoned attempts, prepare candidates,
   then activate every candidate, re-bind and publish in one final append (R8).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, cast
from uuid import UUID

from eventsourcing.domain import Aggregate

from domain.classifier import PackState
from domain.coordination import CommandRecord
from domain.errors import Conflict, LedgerError, Unavailable
from domain.identity import PackName
from domain.lifecycle import install_id_for
from domain.manifest import BindingSpec, Manifest
from domain.matrix import (
    Command,
    Decision,
    Remove,
    after_recovery,
    decide,
    decide_removal,
    rejection,
)
from ledger.commands.lease import LeaseHandler, abandoned_attempts, preparing_in
from ledger.commands.publishing import (
    CatalogInForce,
    binding_aggregates,
    catalog_outcome,
    fence_ids,
    publication_summary,
    read_catalog_in_force,
    revision_aggregates,
)
from ledger.commands.results import (
    ApplyResult,
    BindingChanges,
    BindingOutcome,
    PackOutcome,
    RecoveredAttempt,
)
from ledger.commands.steps import LifecycleSteps
from ledger.commands.unit_of_work import UnitOfWork
from ledger.commands.writer_lease import WRITER_LEASE, LeaseBusy, LeaseHandle, LeaseLost
from ledger.observability import bind, get_logger, logged_command, phase, phased
from ledger.sources.resolve import ResolvedPack, resolve_manifest
from ledger.store.runtime import Ledger
from publisher.catalog import CatalogInput, PackAuthority
from publisher.planning import (
    BindingChange,
    PublishPlan,
    check_binding_credentials,
    check_removals,
    content_authority,
    plan_bindings,
    plan_publication,
)


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


def _after_recovery(catalog: CatalogInForce, abandoned: set[str]) -> CatalogInForce:
    """The publisher's input once the next lease holder has recovered ``abandoned`` packs:
    their newest attempt is failed_dirty, which blocks publication (R12)."""
    packs = {p: replace(a, dirty=True) if p in abandoned else a for p, a in catalog.packs.items()}
    return replace(catalog, packs=packs)


def lost_race(error: LedgerError) -> bool:
    """Whether ``error`` is a lost race that re-reading and deciding again can win: a
    conflict (a concurrent append, a certification failure, a busy lease), or a failure
    the server asks to retry (a lock wait timeout). A command id already used for another
    request (R10) is not: no retry changes what was recorded. Nor is a lost writer
    lease: the release stops and names the new holder (R12)."""
    if isinstance(error, LeaseLost):
        return False
    if isinstance(error, Conflict):
        return error.details.get("rule") != "R10"
    return isinstance(error, Unavailable) and error.details.get("retryable") is True


@dataclass(frozen=True)
class _Decided:
    """A release that has work to do: its command id, the states it read, a busy lease."""

    cid: str
    states: dict[PackName, PackState]
    busy: LedgerError | None


log = get_logger("apply")


class ApplyHandler:
    """The ``apply`` command, over its collaborators: the store it reads (``ledger``),
    the unit of work it appends through (``uow``: checked append, fence, R10), the
    writer lease (``lease``: holder, wait budget, clock, recovery) and the lifecycle
    steps (``steps``: prepare, activate, fail)."""

    def __init__(
        self, ledger: Ledger, uow: UnitOfWork, lease: LeaseHandler, steps: LifecycleSteps
    ) -> None:
        self.ledger = ledger
        self.uow = uow
        self.lease = lease
        self.steps = steps

    @logged_command(log, "apply", publication_summary)
    def apply(
        self, manifest_path: Path, *, command_id: str | None = None, publish: bool = True
    ) -> ApplyResult:
        """Converge the store to a release manifest: packs, bindings, one published revision.

        Everything knowable is validated before any append: every pack's
        lifecycle step (R11) and the complete catalog the release would publish
        (R15, R16) — a rejected closure appends nothing at all. Then, under the
        writer lease: prepare candidates, and one final append activating them,
        converging bindings and publishing the revision (R8, R16). With
        ``publish=False`` the release is validated the same way but the revision
        is left to a later ``publish``. Each phase is logged with its duration and
        the command id: resolve, preflight, lease, recover, prepare, final_append
        (and views, for each append).
        """
        with phase("resolve") as resolving:
            manifest, resolved = resolve_manifest(manifest_path)
            resolving["packs"] = len(resolved)
        request = {
            "kind": "apply",
            "packs": [
                {
                    "pack": r.name,
                    "source_kind": r.source.kind.value,
                    "revision": r.source.revision,
                    "payload_hash": r.content.payload_hash_v1,
                    "category": r.content.category,
                }
                for r in resolved
            ],
            "bindings": None
            if manifest.bindings is None
            else [list(b.sort_key()) for b in manifest.bindings],
            "publish": publish,
        }
        # "remove" only when there is one: releases without it keep their digests (R10).
        removal = {"remove": list(manifest.remove)} if manifest.remove else {}
        request_digest = self.uow.request_digest({**request, **removal})
        deadline = time.monotonic() + self.lease.wait
        pause = 0.05
        lost = 0
        while True:
            # Decide from one snapshot; a busy lease means another writer may be doing
            # this very release, so wait for it to end and decide again rather than
            # appending anything (an identical copy then finds the recorded result or
            # nothing left to do, R10).
            decided = self._decide(manifest, resolved, command_id, request_digest, publish)
            if not isinstance(decided, _Decided):
                return decided
            if decided.busy is None:
                try:
                    also = preparing_in(decided.states.values())
                    with self.lease.leased(wait=0, also=also) as handle:
                        return self._under_lease(
                            handle, decided, manifest, resolved, request_digest, publish
                        )
                except LeaseBusy as exc:  # lost the race to take it
                    busy: LedgerError = exc
                except (Conflict, Unavailable) as exc:
                    if not lost_race(exc):
                        raise
                    # Lost a race for the log (a concurrent append moved what we read, a
                    # Galera certification failure): nothing of ours is in it, so re-read
                    # and decide again within the --wait budget, then CONFLICT (R11).
                    lost += 1
                    if time.monotonic() >= deadline:
                        if isinstance(exc, Conflict):
                            raise Conflict(
                                f"lost the race for the log {lost} time(s) within the "
                                f"--wait budget ({self.lease.wait:g} s): {exc.message}",
                                **{**exc.details, "attempts": lost},
                            ) from exc
                        raise
                    busy = exc
            else:
                busy = decided.busy
            if time.monotonic() >= deadline:
                raise LeaseBusy(
                    f"the writer lease is busy: {busy.message}", **{**busy.details, "rule": "R12"}
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    @phased("preflight")
    def _decide(
        self,
        manifest: Manifest,
        resolved: Sequence[ResolvedPack],
        command_id: str | None,
        request_digest: str,
        publish: bool,
    ) -> ApplyResult | _Decided:
        """The preflight: a final result (exact retry, nothing to do) or what to run."""
        with self.ledger.snapshot() as reader:
            cid = self.uow.command_id(command_id, "apply", request_digest, reader)
            bind(command_id=cid)
            prior = self.uow.recorded(reader, cid, "apply", request_digest)
            if prior is not None:
                return cast(ApplyResult, {**prior, "replayed": True})
            states = reader.pack_states(_names(resolved, manifest))
            catalog = read_catalog_in_force(
                self.ledger, reader.conn, states=states, extra=_bound(manifest.bindings)
            )
            lease = reader.lease(WRITER_LEASE)
            attempts = {*abandoned_attempts(self.ledger.recorder, reader.conn)}
            attempts.update(preparing_in(states.values()))
            abandoned = {pack for pack, _ in attempts}
        recovered_states = {p: after_recovery(s) for p, s in states.items()}
        plan = self._plan(resolved, recovered_states, manifest)
        preview = simulate_release(
            resolved,
            plan,
            recovered_states,
            catalog,
            manifest.bindings,
            candidates=None,
            publish=publish,
        )
        if preview.noop:
            return apply_result(cid, resolved, plan, {}, preview, recovered=[], noop=True)
        free = lease is None or lease.is_free(self.lease.now_us())
        if abandoned and free:
            # This release will be the next lease holder: its recovery turns every
            # abandoned attempt into failed_dirty (R12), so judge the catalog it will
            # publish after that, before any append (R11).
            simulate_release(
                resolved,
                plan,
                recovered_states,
                _after_recovery(catalog, abandoned),
                manifest.bindings,
                candidates=None,
                publish=publish,
            )
        busy = None
        if not free and lease is not None and lease.holder != self.lease.holder:
            busy = LeaseBusy(
                f"lease {lease.name!r} is held by {lease.holder!r} (epoch {lease.epoch})",
                holder=lease.holder,
                epoch=lease.epoch,
            )
        return _Decided(cid, states, busy)

    def _under_lease(
        self,
        handle: LeaseHandle,
        decided: _Decided,
        manifest: Manifest,
        resolved: Sequence[ResolvedPack],
        request_digest: str,
        publish: bool,
    ) -> ApplyResult:
        """Prepare the candidates, then the one final append (R8), holding the lease."""
        cid = decided.cid
        with self.ledger.snapshot() as reader:
            prior = self.uow.recorded(reader, cid, "apply", request_digest)
            states = reader.pack_states(decided.states)
        if prior is not None:  # an identical copy finished between our read and our lease
            return cast(ApplyResult, {**prior, "replayed": True})
        plan = self._plan(resolved, states, manifest)
        to_prepare = [
            (r, cmd)
            for r in resolved
            for decision, cmd in [plan[r.name]]
            if cmd is not None and decision in (Decision.INSTALL, Decision.ADVANCE)
        ]
        with phase("prepare", packs=len(to_prepare)):
            # Fenced on the states this plan was made from (no second read of them).
            prepared = {p: states[p] for p in (PackName.trusted(r.name) for r, _ in to_prepare)}
            candidates = (
                self.steps.prepare(handle, to_prepare, states=prepared) if to_prepare else {}
            )
        try:
            with phase("final_append"):
                return self._finish(
                    handle,
                    cid,
                    request_digest,
                    resolved,
                    plan,
                    candidates,
                    manifest.bindings,
                    publish=publish,
                )
        except LedgerError as exc:
            self._abandon(handle, candidates, exc)
            raise

    def _finish(
        self,
        handle: LeaseHandle,
        cid: str,
        request_digest: str,
        resolved: Sequence[ResolvedPack],
        plan: Mapping[str, tuple[Decision, Command | None]],
        candidates: Mapping[str, str],
        desired: Sequence[BindingSpec] | None,
        *,
        publish: bool,
    ) -> ApplyResult:
        """The final append of a release: activations + bindings + revision + record."""
        with self.ledger.snapshot() as reader:
            states = reader.pack_states(_names(resolved, None, plan))
            catalog = read_catalog_in_force(
                self.ledger, reader.conn, states=states, extra=_bound(desired)
            )
            release = simulate_release(
                resolved, plan, states, catalog, desired, candidates=candidates, publish=publish
            )
            versions = self.ledger.recorder.versions(reader.conn, release.fence_ids)
            extra: list[Aggregate] = list(binding_aggregates(reader, release.changes, versions))
            publication = release.publication
            if publication.event is not None:
                assert publication.built is not None
                digests = publication.built.audience_digests
                revision, read_at = revision_aggregates(
                    reader, catalog.head, publication, lambda: digests
                )
                extra.extend(revision)
                versions.update(read_at)
        result = apply_result(
            cid, resolved, plan, candidates, release, recovered=list(handle.recovered), noop=False
        )
        record = CommandRecord(
            command_id=cid, kind="apply", request_digest=request_digest, result=dict(result)
        )
        self.steps.activate(
            handle,
            candidates,
            adoptions=[r for r in resolved if plan[r.name][0] is Decision.ADOPT],
            local_updates=[r for r in resolved if plan[r.name][0] is Decision.LOCAL_UPDATE],
            removals=_removals(plan),
            record=record,
            extra=extra,
            fence=versions,
            states=states,
        )
        return result

    def _plan(
        self,
        resolved: Sequence[ResolvedPack],
        states: Mapping[PackName, PackState],
        manifest: Manifest,
    ) -> dict[str, tuple[Decision, Command | None]]:
        plan: dict[str, tuple[Decision, Command | None]] = {}
        commands: dict[PackName, Command] = {}
        for r in resolved:
            pack = PackName.trusted(r.name)
            decision, command = decide(states[pack], r.target)
            plan[r.name] = (decision, command)
            if command is not None:
                commands[pack] = command
        for index, pack in enumerate(manifest.remove):  # after packs: R7, `remove[i]`
            plan[pack] = removal = decide_removal(states[pack], index, file=manifest.file)
            commands[pack] = removal[1]
        self.uow.check(commands, states)
        return plan

    def _abandon(
        self, handle: LeaseHandle, candidates: Mapping[str, str], cause: LedgerError
    ) -> None:
        """Close our own candidates as failed_clean when activation was refused."""
        for pack, install_id in candidates.items():
            # If this fails too, the next lease holder recovers it as failed_dirty.
            with suppress(LedgerError):
                self.steps.fail(
                    handle,
                    pack,
                    install_id,
                    dirty=False,
                    reason=f"activation refused: {cause.code}: {cause.message}"[:500],
                )


def _names(
    resolved: Sequence[ResolvedPack],
    manifest: Manifest | None,
    plan: Mapping[str, tuple[Decision, Command | None]] | None = None,
) -> list[PackName]:
    """Every pack a release reads the state of: its packs, then its removals."""
    removals = list(manifest.remove) if manifest is not None else _removals(plan or {})
    return [PackName.trusted(r.name) for r in resolved] + removals


def _bound(desired: Sequence[BindingSpec] | None) -> set[str]:
    """The packs a manifest's bindings name (their authority is read with the release's)."""
    return {spec.pack for spec in desired or ()}


def _removals(plan: Mapping[str, tuple[Decision, Command | None]]) -> list[PackName]:
    return [PackName.trusted(p) for p, (d, _) in plan.items() if d is Decision.REMOVE]


def _removal_outcome(state: PackState) -> PackOutcome:
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
    resolved: Sequence[ResolvedPack],
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
    for r in resolved:
        decision, _ = plan[r.name]
        state = states[PackName.trusted(r.name)]
        revision = r.source.revision or ""
        if decision in (Decision.INSTALL, Decision.ADVANCE):
            install_id = (candidates or {}).get(r.name) or install_id_for(
                r.name, revision, r.content.payload_hash_v1, state.next_ordinal
            )
            epoch = state.activation.epoch + 1 if state.activation else 1
            packs[r.name] = content_authority(r.name, install_id, revision, epoch, r.content)
        elif decision is Decision.ADOPT:
            assert state.legacy is not None
            packs[r.name] = content_authority(
                r.name, state.legacy.install_id, revision, 1, r.content
            )
        elif decision is Decision.LOCAL_UPDATE:
            packs[r.name] = PackAuthority(pack=r.name, source_kind="local_path")
    removals = _removals(plan)
    removed = [_removal_outcome(states[p]) for p in removals]
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
    resolved: Sequence[ResolvedPack],
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
                "source_kind": r.source.kind.value,
                "revision": r.source.revision,
                "payload_hash": r.content.payload_hash_v1,
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
