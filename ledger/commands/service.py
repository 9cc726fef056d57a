"""The command service: every mutation of the store goes through here (R7-R12).

This module only wires the handlers to their collaborators; the work is theirs:

* ``unit_of_work.UnitOfWork`` — the checked append (the R11 preflight, and the terminal
  re-check inside the recorder transaction), the lease fence, exact retries (R10);
* ``lease.LeaseHandler`` — taking, keeping, giving back and breaking the writer lease,
  and recovering abandoned attempts (R12, R27);
* ``steps.LifecycleSteps`` — prepare, activate, fail: one checked append each;
* ``apply.ApplyHandler``, ``publish.PublishHandler``, ``import_legacy.ImportLegacyHandler``
  and ``credentials.CredentialHandler`` — one handler per command.

Each command follows one pattern:

1. read the state of every pack it touches in one consistent snapshot;
2. run the preflight half of the matrix (``domain.matrix.rejection``) on all
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
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import cached_property
from pathlib import Path
from typing import Any

from eventsourcing.domain import Aggregate

from domain.classifier import PackState
from domain.coordination import DEFAULT_LEASE_TTL, CommandRecord, Lease
from domain.credentials import DEFAULT_EXPIRES_IN
from domain.errors import UsageError
from domain.identity import PackName
from domain.lifecycle import MAX_EPOCH
from domain.matrix import Command
from ledger.commands.apply import ApplyHandler
from ledger.commands.credentials import (
    CredentialHandler,
    CredentialList,
    IssuedCredential,
    RevokedCredential,
)
from ledger.commands.import_legacy import ImportLegacyHandler
from ledger.commands.lease import LeaseHandler
from ledger.commands.publish import PublishHandler, StagedPublication
from ledger.commands.results import (
    ApplyResult,
    ImportLegacyResult,
    PlanResult,
    PublishResult,
    RecoveredAttempt,
)
from ledger.commands.steps import LifecycleSteps
from ledger.commands.unit_of_work import UnitOfWork
from ledger.commands.writer_lease import LeaseHandle, still_held
from ledger.sources.resolve import ResolvedPack
from ledger.store.runtime import Ledger

__all__ = ["CommandService"]


class CommandService:
    """Every command over one ``Ledger``: apply, publish, import-legacy, the lease steps,
    audience credentials — each delegated to its handler."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        holder: str | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        lease_wait: float = 30.0,
        renew_every: float | None = None,
        max_epoch: int = MAX_EPOCH,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = ledger
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.uow = UnitOfWork(ledger, max_epoch=max_epoch)
        self.lease = LeaseHandler(
            ledger,
            self.uow,
            holder=self.holder,
            lease_ttl=lease_ttl,
            lease_wait=lease_wait,
            # Renew a held lease this often (default: a third of the TTL, 10 s of 30 s).
            renew_every=lease_ttl / 3 if renew_every is None else renew_every,
            clock=clock,
        )
        self.steps = LifecycleSteps(self.uow)
        self.clock = clock

    # The other handlers are built on first use: a command wires only what it runs.

    @cached_property
    def publishing(self) -> PublishHandler:
        return PublishHandler(self.ledger, self.uow)

    @cached_property
    def legacy(self) -> ImportLegacyHandler:
        return ImportLegacyHandler(self.ledger, self.uow, self.lease)

    @cached_property
    def credentials(self) -> CredentialHandler:
        return CredentialHandler(self.ledger, clock=self.clock)

    # -- apply (built per call: over whichever steps this service holds) ---------------------

    def apply(
        self,
        manifest_path: Path | None,
        *,
        command_id: str | None = None,
        publish: bool = True,
        plan_file: Path | None = None,
    ) -> ApplyResult:
        """``apply``; with ``plan_file``, exactly the plan it holds (``ledger.commands.plan``:
        ``manifest_path``, when given, must be the planned manifest's bytes)."""
        handler = ApplyHandler(self.ledger, self.uow, self.lease, self.steps)
        if plan_file is not None:
            from ledger.commands.plan import PlanHandler

            return PlanHandler(handler).apply_plan(plan_file, manifest_path=manifest_path)
        if manifest_path is None:
            raise UsageError("apply needs a MANIFEST or a --plan-file")
        return handler.apply(manifest_path, command_id=command_id, publish=publish)

    def plan(self, manifest_path: Path, *, publish: bool = True) -> PlanResult:
        """What ``apply(manifest_path, publish=publish)`` would do now, from its own
        preflight: appends nothing, takes no lease (``ledger.commands.plan``)."""
        from ledger.commands.plan import PlanHandler

        handler = ApplyHandler(self.ledger, self.uow, self.lease, self.steps)
        return PlanHandler(handler).plan(manifest_path, publish=publish)

    # -- publish --------------------------------------------------------------------------

    @property
    def incremental(self) -> bool:
        return self.publishing.incremental

    @incremental.setter
    def incremental(self, value: bool) -> None:
        self.publishing.incremental = value

    def publish(self, *, command_id: str | None = None) -> PublishResult:
        return self.publishing.publish(command_id=command_id)

    def stage_publication(
        self, *, command_id: str | None = None
    ) -> PublishResult | StagedPublication:
        return self.publishing.stage_publication(command_id=command_id)

    def commit_publication(self, staged: StagedPublication) -> PublishResult:
        return self.publishing.commit_publication(staged)

    # -- import-legacy, credentials ---------------------------------------------------------

    def import_legacy(self, path: Path, *, command_id: str | None = None) -> ImportLegacyResult:
        return self.legacy.import_legacy(path, command_id=command_id)

    def credentials_issue(
        self, audience: str, *, expires_in: str = DEFAULT_EXPIRES_IN
    ) -> IssuedCredential:
        return self.credentials.credentials_issue(audience, expires_in=expires_in)

    def credentials_revoke(self, credential_id: str) -> RevokedCredential:
        return self.credentials.credentials_revoke(credential_id)

    def credentials_list(self, *, audience: str | None = None) -> CredentialList:
        return self.credentials.credentials_list(audience=audience)

    # -- the writer lease -------------------------------------------------------------------

    def acquire_lease(self, *, wait: float | None = None) -> LeaseHandle:
        return self.lease.acquire_lease(wait=wait)

    def renew_lease(self, handle: LeaseHandle) -> int:
        return self.lease.renew_lease(handle)

    def release_lease(self, handle: LeaseHandle) -> None:
        self.lease.release_lease(handle)

    def break_lease(self, holder: str) -> Lease:
        return self.lease.break_lease(holder)

    def lease_state(self) -> tuple[Lease | None, int]:
        return self.lease.lease_state()

    def still_held(self, handle: LeaseHandle) -> bool:
        return still_held(self.ledger, handle)

    def leased(
        self, *, wait: float | None = None, also: Collection[tuple[str, str]] = ()
    ) -> AbstractContextManager[LeaseHandle]:
        return self.lease.leased(wait=wait, also=also)

    def recover(
        self, handle: LeaseHandle, also: Collection[tuple[str, str]] = ()
    ) -> list[RecoveredAttempt]:
        return self.lease.recover(handle, also)

    # -- single lifecycle steps and the checked append ----------------------------------------

    def prepare(
        self,
        handle: LeaseHandle,
        items: Sequence[tuple[ResolvedPack, Command]],
        *,
        states: Mapping[PackName, PackState] | None = None,
    ) -> dict[str, str]:
        return self.steps.prepare(handle, items, states=states)

    def activate(
        self,
        handle: LeaseHandle,
        candidates: Mapping[str, str],
        *,
        adoptions: Sequence[ResolvedPack] = (),
        local_updates: Sequence[ResolvedPack] = (),
        removals: Sequence[PackName] = (),
        record: CommandRecord | None = None,
        extra: Sequence[Aggregate] = (),
        fence: Mapping[Any, int] | None = None,
        states: Mapping[PackName, PackState] | None = None,
    ) -> dict[str, int]:
        return self.steps.activate(
            handle,
            candidates,
            adoptions=adoptions,
            local_updates=local_updates,
            removals=removals,
            record=record,
            extra=extra,
            fence=fence,
            states=states,
        )

    def fail(
        self, handle: LeaseHandle, pack: str, install_id: str, *, dirty: bool, reason: str
    ) -> None:
        self.steps.fail(handle, pack, install_id, dirty=dirty, reason=reason)

    def checked_append(
        self,
        handle: LeaseHandle,
        commands: Mapping[PackName, Command],
        build: Callable[[Mapping[PackName, PackState]], Sequence[Aggregate]],
        *,
        extra: Sequence[Aggregate] = (),
        states: Mapping[PackName, PackState] | None = None,
        fence: Mapping[Any, int] | None = None,
    ) -> None:
        self.uow.checked_append(handle, commands, build, extra=extra, states=states, fence=fence)
