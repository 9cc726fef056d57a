"""The service core every command builds on: the checked append and idempotency.

``checked_append`` runs the preflight half of the lifecycle matrix on every
pack a command touches, builds the events, and appends them fenced by the
versions read and by the writer lease, with the terminal half re-run on the
locked current state inside the append transaction (R11). Exact retries are
read-only: a command id with the same request digest returns the recorded
result (R10).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast
from uuid import UUID

from eventsourcing.domain import Aggregate
from sqlalchemy.engine import Connection

from domain.canonical import canonical_bytes
from domain.classifier import PackState
from domain.coordination import DEFAULT_LEASE_TTL, Lease, lease_id
from domain.digests import Purpose, digest, lp
from domain.errors import Conflict, LifecycleRejected
from domain.identity import CommandId, PackName
from domain.lifecycle import MAX_EPOCH
from domain.matrix import Command, Rejection, rejection
from ledger.commands.results import CommandResult, RecoveredAttempt
from ledger.log import lease_rows
from ledger.store.runtime import Ledger, Repository

WRITER_LEASE = "writer"


def renewed_until(lease: Lease, row: lease_rows.LeaseRow | None) -> int | None:
    """The expiry a renewal of the lease's current epoch recorded, if any."""
    if row is None or lease.released or row.epoch != lease.epoch or row.holder != lease.holder:
        return None
    return row.expires_at_us


class LeaseLost(Conflict):
    """The writer lease ended under its holder (expired and taken over, or broken):
    the work stopped before its final append (exit 4, naming the new holder)."""


class Keeper(Protocol):
    """What a held lease's background renewal offers the work it protects."""

    def check(self) -> None: ...


@dataclass(frozen=True)
class LeaseHandle:
    """The writer lease as acquired: its version is the fencing token."""

    name: str
    holder: str
    epoch: int
    version: int
    #: Abandoned attempts this holder turned into ``failed_dirty`` on acquisition.
    recovered: tuple[RecoveredAttempt, ...] = ()
    #: The background renewal of this lease, when held by ``leased()``.
    keeper: Keeper | None = field(default=None, compare=False, repr=False)

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


class ServiceCore:
    """State shared by every command: the store, the writer identity, the clock."""

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
        self.lease_ttl_us = int(lease_ttl * 1_000_000)
        #: Renew a held lease this often (default: a third of the TTL, 10 s of 30 s).
        self.renew_every = lease_ttl / 3 if renew_every is None else renew_every
        self.lease_wait = lease_wait
        self.max_epoch = max_epoch
        self.clock = clock

    def _now_us(self) -> int:
        return int(self.clock() * 1_000_000)

    # -- the lease as the log and its coordination row have it ----------------------------

    def _read_lease(self, name: str = WRITER_LEASE) -> tuple[Lease | None, int | None]:
        with self.ledger.snapshot() as reader:
            lease = reader.lease(name)
            row = lease_rows.read(reader.conn, name)
        return lease, (renewed_until(lease, row) if lease is not None else None)

    def lost(self, handle: LeaseHandle, *, fenced: bool = False) -> LeaseLost:
        """The loss of ``handle``'s lease, naming who holds it now."""
        lease, _ = self._read_lease(handle.name)
        holder = None if lease is None or lease.released else lease.holder
        epoch = 0 if lease is None else lease.epoch
        return LeaseLost(
            f"the writer lease was lost: epoch {handle.epoch} ended, it is now "
            + (f"held by {holder!r} at epoch {epoch}" if holder else f"free at epoch {epoch}")
            + ("; the append was fenced out" if fenced else "")
            + "; the work stopped before its final append",
            rule="R12",
            lease=handle.name,
            holder=holder,
            epoch=epoch,
            lost_epoch=handle.epoch,
        )

    def still_held(self, handle: LeaseHandle) -> bool:
        lease, _ = self._read_lease(handle.name)
        return (
            lease is not None
            and not lease.released
            and lease.epoch == handle.epoch
            and lease.holder == handle.holder
        )

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
            reader = self.ledger.repository(conn)
            self._check(commands, {pack: reader.pack_state(pack) for pack in commands})

        self.fenced_save(handle, *aggregates, *extra, fence=versions, precommit=terminal)

    def fenced_save(
        self,
        handle: LeaseHandle,
        *aggregates: Aggregate,
        fence: Mapping[UUID, int],
        precommit: Callable[[Connection], None] | None = None,
    ) -> None:
        """Append under the lease: stop first if its keeper saw it lost, and report a
        fence that moved because the lease ended as the loss it is (R12)."""
        if handle.keeper is not None:
            handle.keeper.check()
        try:
            self.ledger.app.save(*aggregates, fence=fence, precommit=precommit)
        except Conflict:
            if not self.still_held(handle):
                raise self.lost(handle, fenced=True) from None
            raise

    # -- idempotency (R10) ---------------------------------------------------------------

    @staticmethod
    def request_digest(request: Any) -> str:
        return digest(Purpose.REQUEST, canonical_bytes(request)).hex()

    @staticmethod
    def recorded(
        reader: Repository, command_id: str, kind: str, request_digest: str
    ) -> CommandResult | None:
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
        return cast(CommandResult, dict(record.result))

    def _command_id(
        self, given: str | None, kind: str, request_digest: str, reader: Repository
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
