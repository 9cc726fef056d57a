"""``apply``: converge the store to a release manifest (packs, bindings, one revision).

1. read the manifest; find, from the log, the packs it leaves as they are (frozen:
   their immutable source is the one their active generation froze, R9, R30) and
   resolve only the others;
2. decide (install, adopt, advance, local update, unchanged, remove) and reject,
   naming every pack and reason, before any append;
3. under the writer lease: recover abandoned attempts, prepare candidates,
   then activate every candidate, re-bind and publish in one final append (R8).

When a parent revision exists, what is read and validated follows the change
(``ledger.commands.release``): the revision is built as ``publish``'s incremental path
builds one and keeps its fragments, and the final append is fenced by position on
everything the decision read (R11), so the head lock is held for time independent of
the catalog. Otherwise (the first release, attempts to recover, too much changed, a
rejection to name) the release is simulated as a full build.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import cast

from eventsourcing.domain import Aggregate

from domain.classifier import PackState
from domain.coordination import CommandRecord
from domain.errors import Conflict, InvalidInput, LedgerError, Unavailable
from domain.identity import PackName
from domain.manifest import Manifest
from domain.matrix import Command, Decision, after_recovery, decide, decide_removal
from ledger.commands.decided import Decided, fenced_states, still_frozen, still_preview
from ledger.commands.lease import LeaseHandler, abandoned_attempts, preparing_in
from ledger.commands.publishing import (
    Anchor,
    FullBuildDue,
    binding_aggregates,
    publication_summary,
    read_anchor,
    read_catalog_in_force,
    revision_aggregates,
)
from ledger.commands.release import (
    FrozenPack,
    confirm_frozen,
    known_packs,
    release_authorities,
    simulate_fast,
    thaw_locals,
)
from ledger.commands.results import ApplyResult
from ledger.commands.simulate import (
    Pack,
    Plan,
    Preflight,
    Release,
    after_recovery_of,
    apply_result,
    bound_packs,
    merged,
    pack_names,
    removal_outcome,
    removals_of,
    simulate_release,
)
from ledger.commands.steps import LifecycleSteps
from ledger.commands.unit_of_work import UnitOfWork, then
from ledger.commands.writer_lease import WRITER_LEASE, LeaseBusy, LeaseHandle, LeaseLost
from ledger.log.append import Head, Precommit
from ledger.observability import bind, get_logger, logged_command, phase, phased
from ledger.sources.local import KnownLocal
from ledger.sources.resolve import ResolvedPack, load_manifest, resolve_packs
from ledger.store import kept_fragments
from ledger.store.runtime import Ledger, Repository
from publisher.catalog import PublicationRejected
from publisher.fragments import fragments_of

__all__ = ["ApplyHandler", "Release", "lost_race", "simulate_release"]


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
        #: ``plan``: shown the preflight (the plan, or why the release is refused), and
        #: the result just before the final append (``apply --plan-file`` confirms it).
        self.observe: Callable[[Preflight], None] | None = None
        self.confirm: Callable[[ApplyResult], None] | None = None

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
        manifest, base, anchor, packs, request_digest = self.resolve(manifest_path, publish)
        deadline = time.monotonic() + self.lease.wait
        pause = 0.05
        lost = 0
        while True:
            # Decide from one snapshot; a busy lease means another writer may be doing
            # this very release, so wait for it to end and decide again rather than
            # appending anything (an identical copy then finds the recorded result or
            # nothing left to do, R10).
            decided = self.decide(
                manifest, packs, base, anchor, command_id, request_digest, publish
            )
            if not isinstance(decided, Decided):
                return decided
            packs, anchor = decided.packs, decided.anchor or anchor
            if decided.busy is None:
                try:
                    also = preparing_in(decided.states.values())
                    with self.lease.leased(wait=0, also=also) as handle:
                        return self._under_lease(handle, decided, manifest, request_digest, publish)
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

    def resolve(
        self, manifest_path: Path, publish: bool
    ) -> tuple[Manifest, Path, Anchor | None, list[Pack], str]:
        """Read the manifest, know the packs the log already knows, resolve the others;
        and the request's digest (R10)."""
        with phase("resolve") as resolving:
            manifest = load_manifest(manifest_path)
            base = manifest_path.resolve().parent
            with self.ledger.snapshot() as reader:
                anchor = read_anchor(self.ledger, reader.conn)
                try:
                    known = known_packs(self.ledger, reader.conn, anchor, manifest, base)
                except InvalidInput:
                    # Name the first bad source in manifest order, as resolving does.
                    resolve_packs(manifest.packs, base=base)
                    raise
            packs = merged(known, resolve_packs(manifest.packs, base=base, skip=known))
            resolving["packs"] = len(packs)
            resolving["known"] = len(known)
        request = {
            "kind": "apply",
            "packs": [
                {
                    "pack": r.name,
                    "source_kind": r.source.kind._value_,  # no enum descriptor per pack
                    "revision": r.source.revision,
                    "payload_hash": r.payload_hash,
                    "category": r.category,
                }
                for r in packs
            ],
            "bindings": None
            if manifest.bindings is None
            else [list(b.sort_key()) for b in manifest.bindings],
            "publish": publish,
        }
        # "remove" only when there is one: releases without it keep their digests (R10).
        removal = {"remove": list(manifest.remove)} if manifest.remove else {}
        # Every leaf is a validated manifest field or a hash (R10: the same bytes).
        request_digest = self.uow.request_digest({**request, **removal}, trusted=True)
        return manifest, base, anchor, packs, request_digest

    @phased("preflight")
    def decide(
        self,
        manifest: Manifest,
        packs: list[Pack],
        base: Path,
        seen: Anchor | None,
        command_id: str | None,
        request_digest: str,
        publish: bool,
    ) -> ApplyResult | Decided:
        """The preflight: a final result (exact retry, nothing to do) or what to run."""
        with self.ledger.snapshot() as reader:
            cid = self.uow.command_id(command_id, "apply", request_digest, reader)
            bind(command_id=cid)
            # Where a plan was made: the head and the command id derived there.
            seen_at: tuple[Head, str] | None = None
            if self.observe is not None:
                derived = self.uow.command_id(None, "apply", request_digest, reader)
                seen_at = (self.ledger.recorder.head_in(reader.conn), derived)
            prior = self.uow.recorded(reader, cid, "apply", request_digest)
            if prior is not None:
                return cast(ApplyResult, {**prior, "replayed": True})
            anchor = read_anchor(self.ledger, reader.conn, reuse=seen)
            packs = confirm_frozen(self.ledger, reader.conn, seen, anchor, manifest, packs, base)
            attempts = {*abandoned_attempts(self.ledger.recorder, reader.conn)}
            fast = anchor is not None and not attempts
            names = pack_names(packs, manifest, frozen=not fast)
            states = reader.pack_states(names)
            attempts.update(preparing_in(states.values()))
            lease = reader.lease(WRITER_LEASE)
            abandoned = {pack for pack, _ in attempts}
            recovered_states = {p: after_recovery(s) for p, s in states.items()}
            packs = thaw_locals(packs, recovered_states, manifest, base)
            plan = self._plan(packs, recovered_states, manifest)
            preview = None
            if fast and not abandoned:
                assert anchor is not None
                preview = self._fast(
                    reader,
                    anchor,
                    packs,
                    plan,
                    recovered_states,
                    manifest,
                    candidates=None,
                    publish=publish,
                )
            if preview is None:
                anchor = None
                if fast:  # the full build reads every pack's state
                    states = reader.pack_states(pack_names(packs, manifest))
                    recovered_states = {p: after_recovery(s) for p, s in states.items()}
                catalog = read_catalog_in_force(
                    self.ledger,
                    reader.conn,
                    states=states,
                    extra=bound_packs(manifest.bindings),
                )
        free = lease is None or lease.is_free(self.lease.now_us())
        try:
            if preview is None:
                preview = simulate_release(
                    packs,
                    plan,
                    recovered_states,
                    catalog,
                    manifest.bindings,
                    candidates=None,
                    publish=publish,
                )
            if not preview.noop and abandoned and free and preview.fast is None:
                # This release will be the next lease holder: its recovery turns every
                # abandoned attempt into failed_dirty (R12), so judge the catalog it will
                # publish after that, before any append (R11).
                simulate_release(
                    packs,
                    plan,
                    recovered_states,
                    after_recovery_of(catalog, abandoned),
                    manifest.bindings,
                    candidates=None,
                    publish=publish,
                )
        except PublicationRejected as exc:
            if self.observe is not None and seen_at is not None:
                self.observe(Preflight(cid, *seen_at, packs, plan, recovered_states, None, exc))
            raise
        if self.observe is not None and seen_at is not None:
            self.observe(Preflight(cid, *seen_at, packs, plan, recovered_states, preview, None))
        if preview.noop:
            return apply_result(cid, packs, plan, {}, preview, recovered=[], noop=True)
        busy = None
        if not free and lease is not None and lease.holder != self.lease.holder:
            busy = LeaseBusy(
                f"lease {lease.name!r} is held by {lease.holder!r} (epoch {lease.epoch})",
                holder=lease.holder,
                epoch=lease.epoch,
            )
        return Decided(cid, packs, states, anchor, busy, plan, preview, manifest, base)

    def _fast(
        self,
        reader: Repository,
        anchor: Anchor,
        packs: Sequence[Pack],
        plan: Plan,
        states: Mapping[PackName, PackState],
        manifest: Manifest,
        *,
        candidates: Mapping[str, str] | None,
        publish: bool,
    ) -> Release | None:
        """The release built on the parent revision (R30), or ``None`` when the full
        build must decide (it names every problem)."""
        given = release_authorities(packs, plan, states, candidates)
        removals = removals_of(plan)
        removed = [removal_outcome(states[p]) for p in removals]
        for pack in removals:
            given[pack] = None
        frozen = [r for r in packs if isinstance(r, FrozenPack)]
        try:
            fast = simulate_fast(
                self.ledger,
                reader.conn,
                anchor,
                frozen,
                given,
                manifest.bindings,
                {p: i for i, p in enumerate(removals)},
                publish=publish,
            )
        except (PublicationRejected, FullBuildDue):
            return None
        unchanged = all(decision is Decision.UNCHANGED for decision, _ in plan.values())
        return Release(
            changes=fast.changes,
            publication=fast.publication,
            fence_ids=fast.fence_ids,
            noop=unchanged and fast.unchanged,
            authorities=fast.authorities,
            removed=removed,
            fast=fast,
        )

    def _under_lease(
        self,
        handle: LeaseHandle,
        decided: Decided,
        manifest: Manifest,
        request_digest: str,
        publish: bool,
    ) -> ApplyResult:
        """Prepare the candidates, then the one final append (R8), holding the lease."""
        cid, packs = decided.cid, decided.packs
        with self.ledger.snapshot() as reader:
            prior = self.uow.recorded(reader, cid, "apply", request_digest)
            states = reader.pack_states(decided.states)
        if prior is not None:  # an identical copy finished between our read and our lease
            return cast(ApplyResult, {**prior, "replayed": True})
        plan = self._plan(packs, states, manifest)
        to_prepare = [
            (r, cmd)
            for r in packs
            for decision, cmd in [plan[r.name]]
            if cmd is not None and decision in (Decision.INSTALL, Decision.ADVANCE)
        ]
        with phase("prepare", packs=len(to_prepare)):
            # Fenced on the states this plan was made from (no second read of them).
            prepared = {p: states[p] for p in (PackName.trusted(r.name) for r, _ in to_prepare)}
            candidates = (
                self.steps.prepare(
                    handle, [(cast(ResolvedPack, r), c) for r, c in to_prepare], states=prepared
                )
                if to_prepare
                else {}
            )
        try:
            with phase("final_append"):
                return self._finish(
                    handle,
                    decided,
                    cid,
                    request_digest,
                    manifest,
                    plan,
                    candidates,
                    publish,
                    states,
                )
        except LedgerError as exc:
            self._abandon(handle, candidates, exc)
            raise

    def _finish(
        self,
        handle: LeaseHandle,
        decided: Decided,
        cid: str,
        request_digest: str,
        manifest: Manifest,
        plan: Plan,
        candidates: Mapping[str, str],
        publish: bool,
        planned: Mapping[PackName, PackState],
    ) -> ApplyResult:
        """The final append of a release: activations + bindings + revision + record.

        ``planned``: the states the plan was made from under the lease. A pack the plan
        leaves unchanged is fenced on those (R11: a change to it since refuses the
        append); the packs with a step are fenced on this read and re-checked inside."""
        packs, desired = decided.packs, manifest.bindings
        precommit: Precommit | None = None
        with self.ledger.snapshot() as reader:
            names = pack_names(packs, None, plan, frozen=False)
            states = reader.pack_states(names)
            release: Release | None = None
            anchor = None
            head = None
            if decided.anchor is not None:
                anchor = read_anchor(self.ledger, reader.conn, reuse=decided.anchor)
                if anchor is None or not still_frozen(self.ledger, reader, decided, anchor):
                    raise Conflict(
                        "state changed since it was read: a pack the release leaves as it is moved",
                        rule="R11",
                    )
                release = still_preview(decided, anchor, plan, candidates) or self._fast(
                    reader,
                    anchor,
                    packs,
                    plan,
                    states,
                    manifest,
                    candidates=candidates,
                    publish=publish,
                )
                head = anchor.head
            if release is None:
                states = reader.pack_states(pack_names(packs, None, plan))
                catalog = read_catalog_in_force(
                    self.ledger, reader.conn, states=states, extra=bound_packs(desired)
                )
                release = simulate_release(
                    packs, plan, states, catalog, desired, candidates=candidates, publish=publish
                )
                head = catalog.head
            versions = self.ledger.recorder.versions(reader.conn, release.fence_ids)
            extra: list[Aggregate] = list(binding_aggregates(reader, release.changes, versions))
            publication = release.publication
            if publication.event is not None:
                assert publication.built is not None
                fast = release.fast
                if fast is not None and fast.revision is not None:
                    everything = fast.revision.everything
                    inc = fast.revision
                    precommit = kept_fragments.writer(
                        inc.next.fragments, inc.next.changes if inc.content.kept else None
                    )
                else:
                    built = publication.built
                    digests = built.audience_digests
                    everything = lambda: digests  # noqa: E731
                    # The full build kept its rows: keep them as the next one's fragments.
                    whole = fragments_of(built, publication.event["revision"])
                    precommit = kept_fragments.writer(whole, None)
                revision, read_at = revision_aggregates(reader, head, publication, everything)
                extra.extend(revision)
                versions.update(read_at)
            # The revision claims every binding event before it (its cut is None): a
            # grant to any audience after this read, even one the release never saw,
            # refuses the append (R11), as a lifecycle event of a pack it relied on does.
            if release.fast is not None and anchor is not None:
                fence = self.uow.read_fence(anchor.position, release.fast.relied_packs, None)
            else:
                fence = self.uow.read_fence(catalog.position, (), None)
            precommit = fence if precommit is None else then(fence, precommit)
        result = apply_result(
            cid, packs, plan, candidates, release, recovered=list(handle.recovered), noop=False
        )
        if self.confirm is not None:
            self.confirm(result)
        record = CommandRecord(
            command_id=cid, kind="apply", request_digest=request_digest, result=dict(result)
        )
        resolved = [r for r in packs if isinstance(r, ResolvedPack)]
        self.steps.activate(
            handle,
            candidates,
            adoptions=[r for r in resolved if plan[r.name][0] is Decision.ADOPT],
            local_updates=[r for r in resolved if plan[r.name][0] is Decision.LOCAL_UPDATE],
            removals=removals_of(plan),
            record=record,
            extra=extra,
            fence=versions,
            states=fenced_states(plan, planned, states),
            precommit=precommit,
        )
        return result

    def _plan(
        self,
        packs: Sequence[Pack],
        states: Mapping[PackName, PackState],
        manifest: Manifest,
    ) -> dict[str, tuple[Decision, Command | None]]:
        plan: dict[str, tuple[Decision, Command | None]] = {}
        commands: dict[PackName, Command] = {}
        for r in packs:
            pack = PackName.trusted(r.name)
            if isinstance(r, FrozenPack) and pack not in states:
                # Confirmed at the anchor, and fenced on it until the final append (R30).
                plan[r.name] = (Decision.UNCHANGED, None)
                continue
            decision, command = decide(states[pack], r.target)
            if isinstance(r, FrozenPack | KnownLocal) and decision is not Decision.UNCHANGED:
                raise Conflict(
                    f"pack {r.name!r} moved since the release found it unchanged",
                    rule="R11",
                    pack=r.name,
                )
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
