"""The lease handler (R12, R27): acquire with a wait, keep alive, release, break, recover.

The log records every acquisition, release and break; the lease's coordination
row (``ledger.log.lease_rows``) carries its current expiry, which a holder's
keeper thread renews every ``renew_every`` seconds by compare-and-set on
(holder, epoch) — nothing is appended for a renewal. Appends are fenced on the
lease aggregate's version, which only epoch changes move, so a holder that
lost the lease (expired and taken over, or broken by an operator) is rejected
inside its next append whatever its renewals did. The keeper notices a loss
first and cancels the work before its final append (``LeaseLost``, naming the
new holder).

The next lease holder turns every abandoned ``preparing`` attempt into
``failed_dirty`` before it creates a new candidate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import replace

from eventsourcing.domain import Aggregate
from sqlalchemy.engine import Connection

from domain.classifier import PackState
from domain.coordination import Lease
from domain.errors import Conflict, IntegrityFailure, LedgerError
from domain.event_types import T_PREPARED
from domain.identity import PackName
from domain.lifecycle import GenerationStatus, generation_id
from domain.matrix import Command, Fail
from ledger.commands.results import RecoveredAttempt
from ledger.commands.unit_of_work import UnitOfWork
from ledger.commands.writer_lease import (
    WRITER_LEASE,
    LeaseBusy,
    LeaseHandle,
    LeaseKeeper,
    lease_lost,
    read_lease,
)
from ledger.log import lease_rows
from ledger.log.db import translate_errors
from ledger.log.recorder import LedgerRecorder
from ledger.observability import get_logger, phased
from ledger.store.runtime import Ledger
from projections import checks
from projections.queries.status import preparing_generations
from projections.views.pack_generation import PACK_GENERATION

log = get_logger("lease")


class LeaseHandler:
    """Taking, holding, renewing, breaking and giving back the writer lease, as
    ``holder``, with expiries from ``clock``; recovery appends through ``uow``."""

    def __init__(
        self,
        ledger: Ledger,
        uow: UnitOfWork,
        *,
        holder: str,
        lease_ttl: float,
        lease_wait: float,
        renew_every: float,
        clock: Callable[[], float],
    ) -> None:
        self.ledger = ledger
        self.uow = uow
        self.holder = holder
        self.ttl_us = int(lease_ttl * 1_000_000)
        self.wait = lease_wait
        #: Renew a held lease this often.
        self.renew_every = renew_every
        self.clock = clock

    def now_us(self) -> int:
        return int(self.clock() * 1_000_000)

    def read(self, name: str = WRITER_LEASE) -> tuple[Lease | None, int | None]:
        """The lease as the log and its coordination row have it."""
        return read_lease(self.ledger, name)

    @phased("lease")  # a phase of the command taking the lease (apply), with its id
    def acquire_lease(self, *, wait: float | None = None) -> LeaseHandle:
        """Take the writer lease, waiting up to ``wait`` seconds for a live holder.

        Losing the race to create or take the lease is a busy lease, never an
        error of the caller's: it waits like for any other holder.
        """
        deadline = time.monotonic() + (self.wait if wait is None else wait)
        pause = 0.05
        while True:
            found, renewed = self.read()
            lease = found or Lease(name=WRITER_LEASE)
            prior = (lease.epoch, lease.holder, lease.released)
            try:
                now = self.now_us()
                lease.acquire(self.holder, now, self.ttl_us, renewed)
                claim = self.claim(prior, now, lease)
                self.ledger.app.save(lease, precommit=claim)
                log.info("lease acquired", extra={"epoch": lease.epoch, "holder": self.holder})
                return LeaseHandle(WRITER_LEASE, self.holder, lease.epoch, lease.version)
            except Conflict as exc:
                if time.monotonic() >= deadline:
                    raise LeaseBusy(
                        f"the writer lease is busy: {exc.message}", **{**exc.details, "rule": "R12"}
                    ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def claim(
        self, prior: tuple[int, str | None, bool], now_us: int, lease: Lease
    ) -> Callable[[Connection], None]:
        """Inside the acquisition's append: refuse if the previous holder renewed since we
        read the row, then point the row at us (the takeover and a renewal never both win)."""
        epoch, holder, released = prior
        taker = self.holder

        def claim(conn: Connection) -> None:
            row = lease_rows.read(conn, lease.name, for_update=True)
            if (
                row is not None
                and not released
                and row.epoch == epoch
                and row.holder == holder
                and row.expires_at_us > now_us
            ):
                raise Conflict(
                    f"lease {lease.name!r} was renewed by {holder!r} (epoch {epoch})",
                    rule="R12",
                    lease=lease.name,
                    holder=holder,
                    epoch=epoch,
                )
            lease_rows.claim(conn, lease.name, taker, lease.epoch, lease.expires_at_us)

        return claim

    def renew_lease(self, handle: LeaseHandle) -> int:
        """Move the lease's expiry to now + TTL (one conditional UPDATE, no event).

        Raises ``LeaseLost`` naming the new holder when the epoch has moved on.
        """
        expires = self.now_us() + self.ttl_us
        with translate_errors(), self.ledger.db.write() as conn:
            renewed = lease_rows.renew(conn, handle.name, handle.holder, handle.epoch, expires)
        if not renewed:
            raise lease_lost(self.ledger, handle)
        log.debug("lease renewed", extra={"epoch": handle.epoch, "expires_at_us": expires})
        return expires

    def release_lease(self, handle: LeaseHandle) -> None:
        lease, _ = self.read(handle.name)
        if lease is None:
            raise Conflict("the writer lease does not exist", rule="R12")
        lease.release(handle.epoch)

        def free(conn: Connection) -> None:
            lease_rows.claim(conn, lease.name, handle.holder, handle.epoch, 0)

        self.ledger.app.save(lease, precommit=free)
        log.info("lease released", extra={"epoch": handle.epoch})

    def break_lease(self, holder: str) -> Lease:
        """Free ``holder``'s lease at once (CONFLICT unless it holds it): epoch + 1 and
        free, so a wrongly presumed-dead holder is fenced out of every append (R27)."""
        lease, _ = self.read()
        if lease is None:
            raise Conflict(f"lease {WRITER_LEASE!r} has never been held", rule="R27")
        lease.break_for(holder)

        def free(conn: Connection) -> None:
            lease_rows.claim(conn, lease.name, holder, lease.epoch, 0)

        self.ledger.app.save(lease, precommit=free)
        log.warning("lease broken", extra={"broken_holder": holder, "epoch": lease.epoch})
        return lease

    def lease_state(self) -> tuple[Lease | None, int]:
        """The lease as the log has it, and its effective expiry (renewals included)."""
        lease, renewed = self.read()
        return lease, (0 if lease is None else lease.expiry(renewed))

    @contextmanager
    def leased(
        self, *, wait: float | None = None, also: Collection[tuple[str, str]] = ()
    ) -> Iterator[LeaseHandle]:
        """Hold the writer lease, renewed in the background; recover abandoned attempts
        (and ``also``, attempts the caller found ``preparing`` in the log) before anything
        else."""
        handle = self.acquire_lease(wait=wait)
        keeper = LeaseKeeper(self.renew_lease, handle, self.renew_every).start()
        handle = replace(handle, keeper=keeper)
        try:
            yield replace(handle, recovered=tuple(self.recover(handle, also)))
        finally:
            keeper.stop()
            if keeper.lost is None:
                # Lost or taken over: the fence already rejects our appends.
                with suppress(LedgerError):
                    self.release_lease(handle)

    # -- recovery (R12) ------------------------------------------------------------------

    @phased("recover")  # a phase of the command holding the lease (apply), with its id
    def recover(
        self, handle: LeaseHandle, also: Collection[tuple[str, str]] = ()
    ) -> list[RecoveredAttempt]:
        """Turn every abandoned ``preparing`` attempt into ``failed_dirty``: those the
        generation view names (each checked against the log) and ``also``."""
        with self.ledger.db.read() as conn:
            found = sorted({*abandoned_attempts(self.ledger.recorder, conn), *also})
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

        self.uow.checked_append(handle, commands, build)
        log.info("recovered abandoned attempts", extra={"count": len(found), "epoch": handle.epoch})
        return [{"pack": p, "install_id": i} for p, i in found]


def abandoned_attempts(recorder: LedgerRecorder, conn: Connection) -> list[tuple[str, str]]:
    """(pack, install_id) of every attempt the generation view says is ``preparing``,
    each checked against the generation's last event in the log (R28): a hint the log
    does not confirm is an edited view row, INTEGRITY, never a failure appended for a
    generation that isn't preparing."""
    found = preparing_generations(conn)
    if not found or not checks.on(checks.PREPARING):
        return found
    last = recorder.last_events(conn, [generation_id(p, i) for p, i in found])
    for pack, install_id in found:
        event = last.get(generation_id(pack, install_id))
        if event is None or event.type != T_PREPARED:
            raise IntegrityFailure(
                f"the generation view says attempt {install_id} of {pack!r} is preparing; "
                "the log does not: a view row was edited or added; `catalog-ledger projections "
                "rebuild pack_generation` restores the view from the log",
                rule="R28",
                table=PACK_GENERATION.physical.name,
                key={"pack": pack, "install_id": install_id},
            )
    return found


def preparing_in(states: Iterable[PackState]) -> list[tuple[str, str]]:
    """(pack, install_id) of each pack's newest attempt that the log says is preparing."""
    return sorted(
        (str(s.pack), s.newest.install_id)
        for s in states
        if s.newest is not None and s.newest.status is GenerationStatus.PREPARING
    )
