"""The command service: every mutation of the store goes through here (R7-R12).

Each command follows one pattern:

1. read the state of every pack it touches in one consistent snapshot;
2. run the preflight half of the matrix (``domain.lifecycle.rejection``) on all
   of them and reject, naming every pack and reason, before any append;
3. build the events on the aggregates just read;
4. append them in one transaction, fenced by the versions read and by the
   writer lease, with the terminal half of the same matrix re-run on the
   locked current state inside that transaction (R11).

Multi-step work (``apply``) holds the exclusive writer lease; the next lease
holder first turns every abandoned ``preparing`` attempt into
``failed_dirty`` (R12). Exact retries are read-only (R10).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate
from sqlalchemy.engine import Connection

from domain.canonical import canonical_bytes, parse_json
from domain.catalog import catalog_id
from domain.coordination import CommandRecord, Lease, lease_id
from domain.digests import Purpose, digest, lp
from domain.errors import Conflict, LedgerError, LifecycleRejected
from domain.identity import CommandId, PackName
from domain.lifecycle import (
    MAX_EPOCH,
    Activate,
    Adopt,
    Command,
    Decision,
    Fail,
    Generation,
    ImportLegacy,
    LegacyRecord,
    LocalPack,
    LocalUpdate,
    Origin,
    PackActivation,
    PackHistory,
    PackState,
    Rejection,
    after_recovery,
    decide,
    install_id_for,
    rejection,
)
from domain.manifest import BindingSpec, parse_legacy_records
from ledger.publishing import (
    BindingChange,
    CatalogSnapshot,
    PublishPlan,
    binding_aggregates,
    content_authority,
    fence_ids,
    plan_bindings,
    plan_publication,
    positioned_catalog,
    read_snapshot,
)
from ledger.runtime import Ledger, LogReader
from ledger.sources import ResolvedPack, read_input_file, resolve_manifest
from projections.queries import preparing_generations
from publisher.catalog import CatalogInput, PackAuthority

WRITER_LEASE = "writer"


@dataclass(frozen=True)
class Release:
    """What one ``apply`` appends besides lifecycle events."""

    changes: list[BindingChange]
    publication: PublishPlan
    fence_ids: list[UUID]
    noop: bool
    authorities: dict[str, PackAuthority]


@dataclass(frozen=True)
class StagedPublication:
    """A validated revision built in memory, not yet appended."""

    result: dict[str, Any]
    aggregates: list[Aggregate]
    fence: dict[UUID, int]


@dataclass(frozen=True)
class LeaseHandle:
    """The writer lease as acquired: its version is the fencing token."""

    name: str
    holder: str
    epoch: int
    version: int
    #: Abandoned attempts this holder turned into ``failed_dirty`` on acquisition.
    recovered: tuple[dict[str, str], ...] = ()

    @property
    def fence(self) -> dict[UUID, int]:
        return {lease_id(self.name): self.version}


def _rejected(rejections: Sequence[tuple[str, Rejection]]) -> LifecycleRejected:
    _, first = rejections[0]
    listed = [
        {"pack": p, "reason": r.reason, "message": r.message, **r.details} for p, r in rejections
    ]
    summary = "; ".join(f"{p}: {r.reason}" for p, r in rejections)
    return LifecycleRejected(
        f"rejected before any write: {summary}",
        reason=first.reason if len(rejections) == 1 else "MULTIPLE",
        rejections=listed,
    )


def _after_recovery(catalog: CatalogSnapshot, abandoned: set[str]) -> CatalogSnapshot:
    """The publisher's input once the next lease holder has recovered ``abandoned`` packs:
    their newest attempt is failed_dirty, which blocks publication (R12)."""
    packs = {p: replace(a, dirty=True) if p in abandoned else a for p, a in catalog.packs.items()}
    return replace(catalog, packs=packs)


class CommandService:
    """Commands over one ``Ledger``."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        holder: str | None = None,
        lease_ttl: float = 300.0,
        lease_wait: float = 30.0,
        max_epoch: int = MAX_EPOCH,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = ledger
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.lease_ttl_us = int(lease_ttl * 1_000_000)
        self.lease_wait = lease_wait
        self.max_epoch = max_epoch
        self.clock = clock

    # -- the writer lease (R12) ----------------------------------------------------------

    def _now_us(self) -> int:
        return int(self.clock() * 1_000_000)

    def acquire_lease(self, *, wait: float | None = None) -> LeaseHandle:
        """Take the writer lease, waiting up to ``wait`` seconds for a live holder."""
        deadline = time.monotonic() + (self.lease_wait if wait is None else wait)
        pause = 0.05
        while True:
            with self.ledger.snapshot() as reader:
                lease = reader.lease(WRITER_LEASE)
            lease = lease or Lease(name=WRITER_LEASE)
            try:
                lease.acquire(self.holder, self._now_us(), self.lease_ttl_us)
                self.ledger.app.save(lease)
                return LeaseHandle(WRITER_LEASE, self.holder, lease.epoch, lease.version)
            except Conflict as exc:
                if time.monotonic() >= deadline:
                    raise Conflict(
                        f"the writer lease is busy: {exc.message}", **{**exc.details, "rule": "R12"}
                    ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def release_lease(self, handle: LeaseHandle) -> None:
        with self.ledger.snapshot() as reader:
            lease = reader.lease(handle.name)
        if lease is None:
            raise Conflict("the writer lease does not exist", rule="R12")
        lease.release(handle.epoch)
        self.ledger.app.save(lease)

    @contextmanager
    def leased(self) -> Iterator[LeaseHandle]:
        """Hold the writer lease; recover abandoned attempts before anything else."""
        handle = self.acquire_lease()
        try:
            yield replace(handle, recovered=tuple(self.recover(handle)))
        finally:
            # Lost or taken over: the fence already rejects our appends.
            with suppress(LedgerError):
                self.release_lease(handle)

    # -- the checked append (R11) --------------------------------------------------------

    def _check(
        self, commands: Mapping[PackName, Command], states: Mapping[PackName, PackState]
    ) -> None:
        found: list[tuple[str, Rejection]] = []
        for pack, command in commands.items():
            try:
                problem = rejection(command, states[pack], max_epoch=self.max_epoch)
            except LifecycleRejected as exc:
                problem = Rejection(
                    exc.reason,
                    exc.message,
                    {k: v for k, v in exc.details.items() if k not in ("reason", "pack")},
                )
            if problem is not None:
                found.append((pack, problem))
        if found:
            raise _rejected(found)

    def checked_append(
        self,
        handle: LeaseHandle,
        commands: Mapping[PackName, Command],
        build: Callable[[Mapping[PackName, PackState]], Sequence[Aggregate]],
        *,
        extra: Sequence[Aggregate] = (),
        states: Mapping[PackName, PackState] | None = None,
        fence: Mapping[UUID, int] | None = None,
    ) -> None:
        """Preflight, build, and append with the terminal re-check inside the transaction.

        ``fence`` adds versions of aggregates read for the decision besides the
        packs' own (catalog, audiences, packs the catalog uses).
        """
        if states is None:
            with self.ledger.snapshot() as reader:
                states = {pack: reader.pack_state(pack) for pack in commands}
        self._check(commands, states)
        versions = dict(fence or {})
        versions.update(handle.fence)
        for state in states.values():
            versions.update(state.fence())
        aggregates = build(states)  # after the fence: building moves aggregate versions

        def terminal(conn: Connection) -> None:
            reader = self.ledger.reader(conn)
            self._check(commands, {pack: reader.pack_state(pack) for pack in commands})

        self.ledger.app.save(*aggregates, *extra, fence=versions, precommit=terminal)

    # -- recovery (R12) ------------------------------------------------------------------

    def recover(self, handle: LeaseHandle) -> list[dict[str, str]]:
        """Turn every abandoned ``preparing`` attempt into ``failed_dirty``."""
        with self.ledger.db.read() as conn:
            found = preparing_generations(conn)
        if not found:
            return []
        commands: dict[PackName, Command] = {
            PackName.trusted(pack): Fail(install_id) for pack, install_id in found
        }
        reason = f"abandoned attempt recovered by writer lease epoch {handle.epoch}"

        def build(states: Mapping[PackName, PackState]) -> list[Aggregate]:
            out: list[Aggregate] = []
            for pack in commands:
                newest = states[pack].newest
                assert newest is not None
                newest.fail(dirty=True, reason=reason)
                out.append(newest)
            return out

        self.checked_append(handle, commands, build)
        return [{"pack": p, "install_id": i} for p, i in found]

    # -- single lifecycle steps ----------------------------------------------------------

    def prepare(
        self, handle: LeaseHandle, items: Sequence[tuple[ResolvedPack, Command]]
    ) -> dict[str, str]:
        """Record fresh candidates (install or advance); returns pack -> install id."""
        commands = {PackName.trusted(r.name): cmd for r, cmd in items}
        created: dict[str, str] = {}

        def build(states: Mapping[PackName, PackState]) -> list[Aggregate]:
            out: list[Aggregate] = []
            for resolved, _ in items:
                state = states[PackName.trusted(resolved.name)]
                revision = resolved.source.revision
                assert revision is not None
                origin = Origin.ADVANCE if state.activation is not None else Origin.INSTALL
                install_id = install_id_for(
                    resolved.name, revision, resolved.content.payload_hash_v1, state.next_ordinal
                )
                generation = Generation(
                    pack=resolved.name,
                    install_id=install_id,
                    ordinal=state.next_ordinal,
                    origin=origin.value,
                    category=resolved.content.category,
                    source=resolved.source.to_json(),
                    payload_hash=resolved.content.payload_hash_v1,
                    components=resolved.content.canonical_set(),
                    from_install_id=state.activation.install_id if state.activation else None,
                )
                history = state.history
                if history is None:
                    history = PackHistory(
                        pack=resolved.name, install_id=install_id, origin=origin.value
                    )
                else:
                    history.attempt(install_id=install_id, origin=origin.value)
                out.extend([generation, history])
                created[resolved.name] = install_id
            return out

        self.checked_append(handle, commands, build)
        return created

    def activate(
        self,
        handle: LeaseHandle,
        candidates: Mapping[str, str],
        *,
        adoptions: Sequence[ResolvedPack] = (),
        local_updates: Sequence[ResolvedPack] = (),
        record: CommandRecord | None = None,
        extra: Sequence[Aggregate] = (),
        fence: Mapping[UUID, int] | None = None,
        states: Mapping[PackName, PackState] | None = None,
    ) -> dict[str, int]:
        """One append (R8): candidates active, pointers +1, predecessors retired,
        adoptions and local in-place updates recorded; returns pack -> epoch."""
        commands: dict[PackName, Command] = {
            PackName.trusted(p): Activate(i) for p, i in candidates.items()
        }
        for resolved in adoptions:
            commands[PackName.trusted(resolved.name)] = Adopt(resolved.target)
        for resolved in local_updates:
            commands[PackName.trusted(resolved.name)] = LocalUpdate(resolved.target)
        epochs: dict[str, int] = {}

        def build(states: Mapping[PackName, PackState]) -> list[Aggregate]:
            out: list[Aggregate] = []
            for pack in candidates:
                state = states[PackName.trusted(pack)]
                generation = state.newest
                assert generation is not None
                if state.activation is None:
                    generation.activate(epoch=1)
                    out.extend([generation, PackActivation.start(generation)])
                    epochs[pack] = 1
                else:
                    epoch = state.activation.epoch + 1
                    previous = state.active
                    assert previous is not None
                    generation.activate(epoch=epoch)
                    state.activation.advance(generation)
                    previous.retire(successor_install_id=generation.install_id, epoch=epoch)
                    out.extend([generation, state.activation, previous])
                    epochs[pack] = epoch
            for resolved in adoptions:
                out.extend(self._adopt(states[PackName.trusted(resolved.name)], resolved))
                epochs[resolved.name] = 1
            for resolved in local_updates:
                out.append(self._local(states[PackName.trusted(resolved.name)], resolved))
            return out

        self.checked_append(
            handle,
            commands,
            build,
            extra=[*extra, *([record] if record else [])],
            fence=fence,
            states=states,
        )
        return epochs

    @staticmethod
    def _adopt(state: PackState, resolved: ResolvedPack) -> list[Aggregate]:
        legacy = state.legacy
        assert legacy is not None
        generation = Generation(
            pack=resolved.name,
            install_id=legacy.install_id,
            ordinal=1,
            origin=Origin.ADOPT.value,
            category=resolved.content.category,
            source=resolved.source.to_json(),
            payload_hash=resolved.content.payload_hash_v1,
            components=resolved.content.canonical_set(),
            from_install_id=None,
        )
        generation.activate(epoch=1)
        history = PackHistory(
            pack=resolved.name, install_id=legacy.install_id, origin=Origin.ADOPT.value
        )
        return [generation, PackActivation.start(generation), history]

    @staticmethod
    def _local(state: PackState, resolved: ResolvedPack) -> LocalPack:
        facts = {
            "category": resolved.content.category,
            "locator": resolved.source.locator,
            "path": resolved.source.path,
            "payload_hash": resolved.content.payload_hash_v1,
        }
        if state.local is not None:
            state.local.update(**facts)
            return state.local
        install_id = (
            state.legacy.install_id
            if state.legacy is not None
            else install_id_for(resolved.name, "local_path", resolved.content.payload_hash_v1, 1)
        )
        return LocalPack(pack=resolved.name, install_id=install_id, **facts)

    def fail(
        self, handle: LeaseHandle, pack: str, install_id: str, *, dirty: bool, reason: str
    ) -> None:
        """Terminate the attempt in progress as ``failed_clean`` or ``failed_dirty``."""
        commands: dict[PackName, Command] = {PackName(pack): Fail(install_id)}

        def build(states: Mapping[PackName, PackState]) -> list[Aggregate]:
            newest = states[PackName(pack)].newest
            assert newest is not None
            newest.fail(dirty=dirty, reason=reason)
            return [newest]

        self.checked_append(handle, commands, build)

    # -- idempotency (R10) ---------------------------------------------------------------

    @staticmethod
    def request_digest(request: Any) -> str:
        return digest(Purpose.REQUEST, canonical_bytes(request)).hex()

    @staticmethod
    def recorded(
        reader: LogReader, command_id: str, kind: str, request_digest: str
    ) -> dict[str, Any] | None:
        """The recorded result of an exact retry, ``None`` if new; conflict if reused."""
        record = reader.command(command_id)
        if record is None:
            return None
        if record.kind != kind or record.request_digest != request_digest:
            raise Conflict(
                f"command id {command_id!r} was already used for a different request",
                rule="R10",
                command_id=command_id,
                recorded_kind=record.kind,
            )
        return dict(record.result)

    def _command_id(
        self, given: str | None, kind: str, request_digest: str, reader: LogReader
    ) -> str:
        if given is not None:
            return str(CommandId(given))
        head = self.ledger.recorder.head_in(reader.conn)
        derived = digest(
            Purpose.MANIFEST,
            lp(
                kind.encode(),
                bytes.fromhex(request_digest),
                str(head.position).encode(),
                head.chain,
            ),
        )
        return f"{kind}-{derived[:12].hex()}"

    # -- apply (packs) -------------------------------------------------------------------

    def apply(
        self, manifest_path: Path, *, command_id: str | None = None, publish: bool = True
    ) -> dict[str, Any]:
        """Converge the store to a release manifest: packs, bindings, one published revision.

        Everything knowable is validated before any append: every pack's
        lifecycle step (R11) and the complete catalog the release would publish
        (R15, R16) — a rejected closure appends nothing at all. Then, under the
        writer lease: prepare candidates, and one final append activating them,
        converging bindings and publishing the revision (R8, R16). With
        ``publish=False`` the release is validated the same way but the revision
        is left to a later ``publish``.
        """
        manifest, resolved = resolve_manifest(manifest_path)
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
        request_digest = self.request_digest(request)
        with self.ledger.snapshot() as reader:
            cid = self._command_id(command_id, "apply", request_digest, reader)
            prior = self.recorded(reader, cid, "apply", request_digest)
            if prior is not None:
                return {**prior, "replayed": True}
            states = {
                PackName.trusted(r.name): reader.pack_state(PackName.trusted(r.name))
                for r in resolved
            }
            catalog = read_snapshot(self.ledger, reader.conn)
            lease = reader.lease(WRITER_LEASE)
            abandoned = {pack for pack, _ in preparing_generations(reader.conn)}
        recovered_states = {p: after_recovery(s) for p, s in states.items()}
        plan = self._plan(resolved, recovered_states)
        preview = self._release(
            resolved,
            plan,
            recovered_states,
            catalog,
            manifest.bindings,
            candidates=None,
            publish=publish,
        )
        if preview.noop:
            return self._result(cid, resolved, plan, {}, preview, recovered=[], noop=True)
        if abandoned and (lease is None or lease.is_free(self._now_us())):
            # This release will be the next lease holder: its recovery turns every
            # abandoned attempt into failed_dirty (R12), so judge the catalog it will
            # publish after that, before any append (R11).
            self._release(
                resolved,
                plan,
                recovered_states,
                _after_recovery(catalog, abandoned),
                manifest.bindings,
                candidates=None,
                publish=publish,
            )
        with self.leased() as handle:
            with self.ledger.snapshot() as reader:
                states = {p: reader.pack_state(p) for p in states}
            plan = self._plan(resolved, states)
            to_prepare = [
                (r, cmd)
                for r in resolved
                for decision, cmd in [plan[r.name]]
                if cmd is not None and decision in (Decision.INSTALL, Decision.ADVANCE)
            ]
            candidates = self.prepare(handle, to_prepare) if to_prepare else {}
            try:
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
    ) -> dict[str, Any]:
        """The final append of a release: activations + bindings + revision + record."""
        with self.ledger.snapshot() as reader:
            states = {
                PackName.trusted(r.name): reader.pack_state(PackName.trusted(r.name))
                for r in resolved
            }
            catalog = read_snapshot(self.ledger, reader.conn)
            release = self._release(
                resolved, plan, states, catalog, desired, candidates=candidates, publish=publish
            )
            versions = self.ledger.recorder.versions(reader.conn, release.fence_ids)
            extra: list[Aggregate] = list(binding_aggregates(reader, release.changes, versions))
            if release.publication.event is not None:
                lineage = positioned_catalog(reader, catalog.parent, versions[catalog_id()])
                lineage.publish(
                    **{k: v for k, v in release.publication.event.items() if k != "revision"}
                )
                extra.append(lineage)
        result = self._result(
            cid, resolved, plan, candidates, release, recovered=list(handle.recovered), noop=False
        )
        record = CommandRecord(
            command_id=cid, kind="apply", request_digest=request_digest, result=result
        )
        self.activate(
            handle,
            candidates,
            adoptions=[r for r in resolved if plan[r.name][0] is Decision.ADOPT],
            local_updates=[r for r in resolved if plan[r.name][0] is Decision.LOCAL_UPDATE],
            record=record,
            extra=extra,
            fence=versions,
            states=states,
        )
        return result

    def _release(
        self,
        resolved: Sequence[ResolvedPack],
        plan: Mapping[str, tuple[Decision, Command | None]],
        states: Mapping[PackName, PackState],
        catalog: CatalogSnapshot,
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
        rows, changes = plan_bindings(catalog.bindings, desired, packs)
        publication = plan_publication(CatalogInput(rows, packs), catalog.parent, None)
        if not publish:
            publication = PublishPlan(publication.built, publication.parent, None)
        used = {row.pack for row in rows} | set(catalog.parent.activations)
        audiences = (
            {row.audience for row in rows}
            | {c.row.audience for c in changes}
            | set(catalog.parent.audiences)
        )
        unchanged = all(plan[r.name][0] is Decision.UNCHANGED for r in resolved)
        return Release(
            changes=changes,
            publication=publication,
            fence_ids=fence_ids(catalog, used, audiences),
            noop=unchanged and not changes and not publication.changed,
            authorities=packs,
        )

    def _plan(
        self, resolved: Sequence[ResolvedPack], states: Mapping[PackName, PackState]
    ) -> dict[str, tuple[Decision, Command | None]]:
        plan: dict[str, tuple[Decision, Command | None]] = {}
        commands: dict[PackName, Command] = {}
        for r in resolved:
            pack = PackName.trusted(r.name)
            decision, command = decide(states[pack], r.target)
            plan[r.name] = (decision, command)
            if command is not None:
                commands[pack] = command
        self._check(commands, states)
        return plan

    def _abandon(
        self, handle: LeaseHandle, candidates: Mapping[str, str], cause: LedgerError
    ) -> None:
        """Close our own candidates as failed_clean when activation was refused."""
        for pack, install_id in candidates.items():
            # If this fails too, the next lease holder recovers it as failed_dirty.
            with suppress(LedgerError):
                self.fail(
                    handle,
                    pack,
                    install_id,
                    dirty=False,
                    reason=f"activation refused: {cause.code}: {cause.message}"[:500],
                )

    @staticmethod
    def _result(
        cid: str,
        resolved: Sequence[ResolvedPack],
        plan: Mapping[str, tuple[Decision, Command | None]],
        candidates: Mapping[str, str],
        release: Release,
        *,
        recovered: list[dict[str, str]],
        noop: bool,
    ) -> dict[str, Any]:
        event = release.publication.event
        packs = []
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
        bindings: dict[str, list[dict[str, Any]]] = {"granted": [], "rebound": [], "revoked": []}
        names = {"grant": "granted", "rebind": "rebound", "revoke": "revoked"}
        for change in release.changes:
            bindings[names[change.op]].append(change.to_json())
        return {
            "command_id": cid,
            "noop": noop,
            "replayed": False,
            "packs": packs,
            "bindings": bindings,
            "catalog": {
                "revision": event["revision"] if event else release.publication.parent.revision,
                "content_digest": release.publication.built.content_digest,
                "published": event is not None,
                "counts": release.publication.built.counts,
            },
            "recovered": recovered,
        }

    # -- publish ------------------------------------------------------------------------

    def publish(self, *, command_id: str | None = None) -> dict[str, Any]:
        """Validate every audience and append one revision, or nothing if unchanged (R16)."""
        staged = self.stage_publication(command_id=command_id)
        return staged if isinstance(staged, dict) else self.commit_publication(staged)

    def stage_publication(
        self, *, command_id: str | None = None
    ) -> dict[str, Any] | StagedPublication:
        """Read, build and validate the whole revision in memory (no write).

        Returns the final result when there is nothing to append (exact retry or
        unchanged content), else the staged revision for ``commit_publication``.
        """
        request_digest = self.request_digest({"kind": "publish"})
        with self.ledger.snapshot() as reader:
            cid = self._command_id(command_id, "publish", request_digest, reader)
            prior = self.recorded(reader, cid, "publish", request_digest)
            if prior is not None:
                return {**prior, "replayed": True}
            catalog = read_snapshot(self.ledger, reader.conn)
            publication = plan_publication(catalog.input(), catalog.parent, catalog.position)
            result = {"command_id": cid, "replayed": False, **publication.summary()}
            if publication.event is None:
                return {**result, "noop": True}
            used = {row.pack for row in catalog.bindings} | set(catalog.parent.activations)
            audiences = {row.audience for row in catalog.bindings} | set(catalog.parent.audiences)
            versions = self.ledger.recorder.versions(
                reader.conn, fence_ids(catalog, used, audiences)
            )
            lineage = positioned_catalog(reader, catalog.parent, versions[catalog_id()])
        lineage.publish(**{k: v for k, v in publication.event.items() if k != "revision"})
        result["noop"] = False
        record = CommandRecord(
            command_id=cid, kind="publish", request_digest=request_digest, result=result
        )
        return StagedPublication(result, [lineage, record], versions)

    def commit_publication(self, staged: StagedPublication) -> dict[str, Any]:
        """Append the staged revision as one event, fenced on everything it read."""
        self.ledger.app.save(*staged.aggregates, fence=staged.fence)
        return staged.result

    # -- legacy import -------------------------------------------------------------------

    def import_legacy(self, path: Path, *, command_id: str | None = None) -> dict[str, Any]:
        """Record legacy ``_System_InstalledPack`` rows once per pack (DESIGN "Inputs")."""
        data = read_input_file(path, field="file")
        records = parse_legacy_records(parse_json(data, source=str(path)), file=str(path))
        request = {"kind": "import-legacy", "records": records}
        request_digest = self.request_digest(request)
        with self.ledger.snapshot() as reader:
            cid = self._command_id(command_id, "import-legacy", request_digest, reader)
            prior = self.recorded(reader, cid, "import-legacy", request_digest)
            if prior is not None:
                return {**prior, "replayed": True}
            states = {
                PackName.trusted(r["pack"]): reader.pack_state(PackName.trusted(r["pack"]))
                for r in records
            }
        commands: dict[PackName, Command] = {
            PackName.trusted(r["pack"]): ImportLegacy(r) for r in records
        }
        self._check(commands, states)
        new = [r for r in records if states[PackName.trusted(r["pack"])].legacy is None]
        result = {
            "command_id": cid,
            "replayed": False,
            "imported": [r["pack"] for r in new],
            "unchanged": [r["pack"] for r in records if r not in new],
        }
        if not new:
            return {**result, "noop": True}
        result["noop"] = False
        record = CommandRecord(
            command_id=cid, kind="import-legacy", request_digest=request_digest, result=result
        )
        new_commands = {
            PackName.trusted(r["pack"]): commands[PackName.trusted(r["pack"])] for r in new
        }
        with self.leased() as handle:
            self.checked_append(
                handle,
                new_commands,
                lambda _states: [LegacyRecord(**r) for r in new],
                extra=[record],
            )
        return result
