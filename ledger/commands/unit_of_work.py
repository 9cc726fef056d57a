"""The unit of work every command appends through: the checked append (R11), the
writer lease's fence (R12) and exact retries (R10).

``checked_append`` runs the preflight half of the lifecycle matrix on every pack a
command touches, builds the events, and appends them in one recorder transaction,
fenced by the versions read and by the writer lease, with the terminal half re-run on
the locked current state inside that transaction. The terminal check is a closure over
what it needs (the commands, the epoch limit, a reader factory): it never calls back
into a command object. A read fence (``unchanged_since``) refuses an append when
anything read at a log position moved since. Exact retries are read-only: a command
id with the same request digest returns the recorded result (R10).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, cast
from uuid import UUID

from eventsourcing.domain import Aggregate
from sqlalchemy.engine import Connection

from domain.canonical import canonical_bytes, canonical_bytes_trusted
from domain.classifier import PackState
from domain.digests import Purpose, digest, lp
from domain.errors import Conflict, LifecycleRejected
from domain.event_types import (
    BINDING_TYPES,
    LIFECYCLE_TYPES,
    T_PUBLISHED,
    T_VIEW_OPENED,
    T_VIEW_PUBLISHED,
)
from domain.identity import CommandId, PackName
from domain.lifecycle import MAX_EPOCH
from domain.matrix import Command, Rejection, rejection
from ledger.commands.results import CommandResult
from ledger.commands.writer_lease import LeaseHandle, lease_lost, still_held
from ledger.log.append import Precommit
from ledger.log.recorder import LedgerRecorder
from ledger.store.runtime import Ledger, Repository


def rejected(rejections: Sequence[tuple[str, Rejection]]) -> LifecycleRejected:
    """One rejection naming every pack and reason, before any write."""
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


def check_commands(
    commands: Mapping[PackName, Command],
    states: Mapping[PackName, PackState],
    *,
    max_epoch: int = MAX_EPOCH,
) -> None:
    """The lifecycle matrix on every pack a command touches (R11): reject, naming every
    pack and reason, or return."""
    found: list[tuple[str, Rejection]] = []
    for pack, command in commands.items():
        try:
            problem = rejection(command, states[pack], max_epoch=max_epoch)
        except LifecycleRejected as exc:
            problem = Rejection(
                exc.reason,
                exc.message,
                {k: v for k, v in exc.details.items() if k not in ("reason", "pack")},
            )
        if problem is not None:
            found.append((pack, problem))
    if found:
        raise rejected(found)


def terminal_check(
    reader_of: Callable[[Connection], Repository],
    commands: Mapping[PackName, Command],
    *,
    max_epoch: int,
) -> Precommit:
    """The terminal half of the matrix, run inside the append's transaction on the
    locked current state of every pack in ``commands`` (R11)."""

    def terminal(conn: Connection) -> None:
        reader = reader_of(conn)
        states = {pack: reader.pack_state(pack) for pack in commands}
        check_commands(commands, states, max_epoch=max_epoch)

    return terminal


def then(first: Precommit, second: Precommit) -> Precommit:
    """A precommit running ``first``, then ``second``."""

    def both(conn: Connection) -> None:
        first(conn)
        second(conn)

    return both


# -- read fences --------------------------------------------------------------------------

#: What a read fence watches: lifecycle and binding events, the catalog lineage.
FENCED_TYPES = frozenset(
    {*LIFECYCLE_TYPES, *BINDING_TYPES, T_PUBLISHED, T_VIEW_OPENED, T_VIEW_PUBLISHED}
)


def unchanged_since(
    recorder: LedgerRecorder,
    position: int,
    packs: Collection[str],
    audiences: Collection[tuple[str, str]] | None,
) -> Precommit:
    """A precommit refusing the append (``Conflict``) if, after ``position``, the catalog
    lineage moved, any of ``packs`` had a lifecycle event (the authority it decided on) or
    any of ``audiences`` a binding event (the bindings it validated or reused; ``None``:
    any audience, for a revision that claims every binding event before it). Reads the
    (usually no) events appended since, by position."""
    wanted = set(packs)
    who = None if audiences is None else set(audiences)

    def check(conn: Connection) -> None:
        for event in recorder.decoded_after(conn, after=position, topics=FENCED_TYPES):
            d = event.data
            if event.type in LIFECYCLE_TYPES and d.get("pack") not in wanted:
                continue
            if (
                event.type in BINDING_TYPES
                and who is not None
                and (d.get("audience_kind"), d.get("audience_id")) not in who
            ):
                continue
            raise Conflict(
                "state changed since it was read: the read fence moved",
                read_at_position=position,
                position=event.position,
                event=event.type,
            )

    return check


class UnitOfWork:
    """One store's appends: checked, fenced, and idempotent by command id."""

    def __init__(self, ledger: Ledger, *, max_epoch: int = MAX_EPOCH) -> None:
        self.ledger = ledger
        self.max_epoch = max_epoch

    def check(
        self, commands: Mapping[PackName, Command], states: Mapping[PackName, PackState]
    ) -> None:
        """The preflight half of the matrix (R11)."""
        check_commands(commands, states, max_epoch=self.max_epoch)

    def checked_append(
        self,
        handle: LeaseHandle,
        commands: Mapping[PackName, Command],
        build: Callable[[Mapping[PackName, PackState]], Sequence[Aggregate]],
        *,
        extra: Sequence[Aggregate] = (),
        states: Mapping[PackName, PackState] | None = None,
        fence: Mapping[UUID, int] | None = None,
        precommit: Precommit | None = None,
    ) -> None:
        """Preflight, build, and append with the terminal re-check inside the transaction.

        ``fence`` adds versions of aggregates read for the decision besides the
        packs' own (catalog, audiences, packs the catalog uses); ``precommit`` runs
        after the terminal check, under the same lock (a read fence, kept fragments).
        """
        if states is None:
            with self.ledger.snapshot() as reader:
                states = {pack: reader.pack_state(pack) for pack in commands}
        self.check(commands, states)
        versions = dict(fence or {})
        versions.update(handle.fence)
        for state in states.values():
            versions.update(state.fence())
        aggregates = build(states)  # after the fence: building moves aggregate versions
        terminal = terminal_check(self.ledger.repository, commands, max_epoch=self.max_epoch)
        checks = terminal if precommit is None else then(terminal, precommit)
        self.fenced_save(handle, *aggregates, *extra, fence=versions, precommit=checks)

    def fenced_save(
        self,
        handle: LeaseHandle,
        *aggregates: Aggregate,
        fence: Mapping[UUID, int],
        precommit: Precommit | None = None,
    ) -> None:
        """Append under the lease: stop first if its keeper saw it lost, and report a
        fence that moved because the lease ended as the loss it is (R12)."""
        if handle.keeper is not None:
            handle.keeper.check()
        try:
            self.ledger.app.save(*aggregates, fence=fence, precommit=precommit)
        except Conflict:
            if not still_held(self.ledger, handle):
                raise lease_lost(self.ledger, handle, fenced=True) from None
            raise

    def read_fence(
        self,
        position: int,
        packs: Collection[str],
        audiences: Collection[tuple[str, str]] | None,
    ) -> Precommit:
        """``unchanged_since`` on this store: refuse the append if what was read at
        ``position`` moved (R11)."""
        return unchanged_since(self.ledger.recorder, position, packs, audiences)

    # -- idempotency (R10) ---------------------------------------------------------------

    @staticmethod
    def request_digest(request: Any, *, trusted: bool = False) -> str:
        """The digest of a command's request (R10); ``trusted``: built by the command
        from validated parts only (the same bytes, without the canonical walk)."""
        encode = canonical_bytes_trusted if trusted else canonical_bytes
        return digest(Purpose.REQUEST, encode(request)).hex()

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

    def command_id(
        self, given: str | None, kind: str, request_digest: str, reader: Repository
    ) -> str:
        """The caller's command id, or one derived from the request and the log head."""
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
