"""The writer lease as its holder sees it (R12, R27): the handle whose version fences
every append, the keeper renewing it in the background, and how its loss reads.

The lease's log aggregate records acquisitions, releases and breaks; its coordination
row (``ledger.log.lease_rows``) carries the current expiry, which a keeper renews by
compare-and-set on (holder, epoch) without appending anything. Taking, renewing and
giving back the lease are the lease handler's (``ledger.commands.lease``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol
from uuid import UUID

from domain.coordination import Lease, lease_id
from domain.errors import Conflict, LedgerError
from ledger.commands.results import RecoveredAttempt
from ledger.log import lease_rows
from ledger.observability import get_logger
from ledger.store.runtime import Ledger

WRITER_LEASE = "writer"

log = get_logger("lease")


class LeaseLost(Conflict):
    """The writer lease ended under its holder (expired and taken over, or broken):
    the work stopped before its final append (exit 4, naming the new holder)."""


class LeaseBusy(Conflict):
    """Another live writer holds the lease, or won the race to take it (exit 4)."""


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


def renewed_until(lease: Lease, row: lease_rows.LeaseRow | None) -> int | None:
    """The expiry a renewal of the lease's current epoch recorded, if any."""
    if row is None or lease.released or row.epoch != lease.epoch or row.holder != lease.holder:
        return None
    return row.expires_at_us


def read_lease(ledger: Ledger, name: str = WRITER_LEASE) -> tuple[Lease | None, int | None]:
    """The lease as the log and its coordination row have it: the aggregate, and the
    expiry its current epoch's renewals recorded."""
    with ledger.snapshot() as reader:
        lease = reader.lease(name)
        row = lease_rows.read(reader.conn, name)
    return lease, (renewed_until(lease, row) if lease is not None else None)


def still_held(ledger: Ledger, handle: LeaseHandle) -> bool:
    lease, _ = read_lease(ledger, handle.name)
    return (
        lease is not None
        and not lease.released
        and lease.epoch == handle.epoch
        and lease.holder == handle.holder
    )


def lease_lost(ledger: Ledger, handle: LeaseHandle, *, fenced: bool = False) -> LeaseLost:
    """The loss of ``handle``'s lease, naming who holds it now."""
    lease, _ = read_lease(ledger, handle.name)
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


class LeaseKeeper:
    """Renews a held lease in the background until stopped; remembers a loss.

    ``renew`` moves the lease's expiry or raises ``LeaseLost`` (the lease handler's
    ``renew_lease``)."""

    def __init__(
        self, renew: Callable[[LeaseHandle], int], handle: LeaseHandle, every: float
    ) -> None:
        self.renew = renew
        self.handle = handle
        self.every = every
        self.lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"lease-keeper-{handle.epoch}", daemon=True
        )

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def check(self) -> None:
        """Raise the loss the keeper noticed (the work stops before its next append)."""
        if self.lost is not None:
            raise self.lost

    def renew_once(self) -> bool:
        """One renewal; ``False`` (and the loss remembered) when the lease is gone."""
        if self.lost is not None:
            return False
        try:
            self.renew(self.handle)
        except LeaseLost as exc:
            self.lost = exc
            log.warning(
                "lease lost", extra={"epoch": self.handle.epoch, "holder": exc.details["holder"]}
            )
            return False
        except LedgerError as exc:  # transient: the next renewal retries; the fence guards
            log.warning("lease renewal failed", extra={"error": exc.code, "reason": exc.message})
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            if not self.renew_once():
                return
