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
from dataclasses import dataclass
from typing import Any, cast
from uuid import UUID

from eventsourcing.domain import Aggregate
from sqlalchemy.engine import Connection

from domain.canonical import canonical_bytes
from domain.classifier import PackState
from domain.coordination import lease_id
from domain.digests import Purpose, digest, lp
from domain.errors import Conflict, LifecycleRejected
from domain.identity import CommandId, PackName
from domain.lifecycle import MAX_EPOCH
from domain.matrix import Command, Rejection, rejection
from ledger.commands.results import CommandResult, RecoveredAttempt
from ledger.store.runtime import Ledger, LogReader

WRITER_LEASE = "writer"


@dataclass(frozen=True)
class LeaseHandle:
    """The writer lease as acquired: its version is the fencing token."""

    name: str
    holder: str
    epoch: int
    version: int
    #: Abandoned attempts this holder turned into ``failed_dirty`` on acquisition.
    recovered: tuple[RecoveredAttempt, ...] = ()

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

    def _now_us(self) -> int:
        return int(self.clock() * 1_000_000)

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

    # -- idempotency (R10) ---------------------------------------------------------------

    @staticmethod
    def request_digest(request: Any) -> str:
        return digest(Purpose.REQUEST, canonical_bytes(request)).hex()

    @staticmethod
    def recorded(
        reader: LogReader, command_id: str, kind: str, request_digest: str
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
