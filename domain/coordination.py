"""Leases with fencing epochs (R12) and idempotency records (R10), as aggregates.

A lease is an aggregate in the log. Every acquisition, release and break is an
event, so the lease aggregate's version moves exactly when its epoch or its
holder does: a holder passes the version it acquired at as a read fence on
every append, and any later acquisition or break moves it, so a stale holder's
append is rejected inside the append transaction. Renewals are *not* events:
they move only the expiry, in the lease's coordination row (compare-and-set on
holder and epoch), so the fence is the epoch and never the expiry. Expiry only
decides whether a *new* holder may take the lease; it never lets two holders
append. (``Renewed`` stays decodable: a log may hold one; nothing writes it.)

A command record stores, in the same append as the command's effects, the
command id, the digest of its request and its result. An exact retry finds
it and returns the result without appending; the same id with another
request is a conflict.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.digests import aggregate_id
from domain.errors import Conflict

#: Default writer lease TTL, seconds; a held lease is renewed every third of it (R12, R27).
DEFAULT_LEASE_TTL = 30.0


class Lease(Aggregate):
    """An exclusive writer lease; ``epoch`` counts acquisitions."""

    class Opened(Aggregate.Created):
        name: str

    class Acquired(Aggregate.Event):
        holder: str
        epoch: int
        expires_at_us: int

    class Renewed(Aggregate.Event):
        epoch: int
        expires_at_us: int

    class Released(Aggregate.Event):
        epoch: int

    class Broken(Aggregate.Event):
        """An operator freed a presumed-dead holder's lease: epoch + 1, free (R27)."""

        holder: str
        epoch: int

    @staticmethod
    def create_id(name: str, **_: Any) -> UUID:
        return lease_id(name)

    @event(Opened)
    def __init__(self, name: str) -> None:
        self.name = name
        self.holder: str | None = None
        self.epoch = 0
        self.expires_at_us = 0
        self.released = True

    @event(Acquired)
    def _acquired(self, holder: str, epoch: int, expires_at_us: int) -> None:
        self.holder = holder
        self.epoch = epoch
        self.expires_at_us = expires_at_us
        self.released = False

    @event(Renewed)
    def _renewed(self, epoch: int, expires_at_us: int) -> None:
        self.expires_at_us = expires_at_us

    @event(Released)
    def _released(self, epoch: int) -> None:
        self.released = True

    @event(Broken)
    def _broken(self, holder: str, epoch: int) -> None:
        self.epoch = epoch
        self.released = True

    def break_for(self, holder: str) -> None:
        """Free the lease of ``holder`` now. Refused unless ``holder`` holds it; the epoch
        moves on, so the broken holder's next append is fenced out (R27)."""
        if self.released or self.holder != holder:
            raise Conflict(
                f"lease {self.name!r} is not held by {holder!r}"
                + ("" if self.released else f" (it is held by {self.holder!r})"),
                rule="R27",
                lease=self.name,
                holder=None if self.released else self.holder,
                epoch=self.epoch,
            )
        self._broken(holder=holder, epoch=self.epoch + 1)

    def expiry(self, renewed_until: int | None = None) -> int:
        """The lease's expiry: as acquired, or as a renewal of this epoch moved it."""
        return max(self.expires_at_us, renewed_until or 0)

    def is_free(self, now_us: int, renewed_until: int | None = None) -> bool:
        return self.released or now_us >= self.expiry(renewed_until)

    def acquire(
        self, holder: str, now_us: int, ttl_us: int, renewed_until: int | None = None
    ) -> None:
        """Take the lease at epoch + 1 once it is free; ``renewed_until`` is the current
        holder's renewed expiry (the coordination row), if it renewed this epoch."""
        if not self.is_free(now_us, renewed_until):
            raise Conflict(
                f"lease {self.name!r} is held by {self.holder!r} (epoch {self.epoch}) "
                f"until its expiry",
                rule="R12",
                lease=self.name,
                holder=self.holder,
                epoch=self.epoch,
                expires_at_us=self.expiry(renewed_until),
            )
        self._acquired(holder=holder, epoch=self.epoch + 1, expires_at_us=now_us + ttl_us)

    def release(self, epoch: int) -> None:
        self._require(epoch)
        self._released(epoch=epoch)

    def _require(self, epoch: int) -> None:
        if self.released or self.epoch != epoch:
            raise Conflict(
                f"lease {self.name!r} is no longer held at epoch {epoch} (now epoch {self.epoch})",
                rule="R12",
                lease=self.name,
                epoch=self.epoch,
            )


class CommandRecord(Aggregate):
    """The idempotency record of one command id (R10)."""

    class Recorded(Aggregate.Created):
        command_id: str
        kind: str
        request_digest: str
        result: dict[str, Any]

    @staticmethod
    def create_id(command_id: str, **_: Any) -> UUID:
        return command_record_id(command_id)

    @event(Recorded)
    def __init__(
        self, command_id: str, kind: str, request_digest: str, result: dict[str, Any]
    ) -> None:
        self.command_id = command_id
        self.kind = kind
        self.request_digest = request_digest
        self.result = result


def lease_id(name: str) -> UUID:
    return aggregate_id("lease", name)


def command_record_id(command_id: str) -> UUID:
    return aggregate_id("command", command_id)
