"""The writer lease (R12): acquire with a wait, release, and recover abandoned attempts.

The next lease holder turns every abandoned ``preparing`` attempt into
``failed_dirty`` before it creates a new candidate.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import replace

from eventsourcing.domain import Aggregate

from domain.classifier import PackState
from domain.coordination import Lease
from domain.errors import Conflict, LedgerError
from domain.identity import PackName
from domain.matrix import Command, Fail
from ledger.commands.core import WRITER_LEASE, LeaseHandle, ServiceCore
from ledger.commands.results import RecoveredAttempt
from projections.queries import preparing_generations


class LeaseBusy(Conflict):
    """Another live writer holds the lease, or won the race to take it (exit 4)."""


class LeaseCommands(ServiceCore):
    """Taking, holding and giving back the writer lease."""

    def acquire_lease(self, *, wait: float | None = None) -> LeaseHandle:
        """Take the writer lease, waiting up to ``wait`` seconds for a live holder.

        Losing the race to create or take the lease is a busy lease, never an
        error of the caller's: it waits like for any other holder.
        """
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
                    raise LeaseBusy(
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
    def leased(self, *, wait: float | None = None) -> Iterator[LeaseHandle]:
        """Hold the writer lease; recover abandoned attempts before anything else."""
        handle = self.acquire_lease(wait=wait)
        try:
            yield replace(handle, recovered=tuple(self.recover(handle)))
        finally:
            # Lost or taken over: the fence already rejects our appends.
            with suppress(LedgerError):
                self.release_lease(handle)

    # -- recovery (R12) ------------------------------------------------------------------

    def recover(self, handle: LeaseHandle) -> list[RecoveredAttempt]:
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
