"""Rows of the event log as plain values, and the pure chain check (R22).

The log stores, per row, the exact ``state`` bytes of an event together with
its ``event_id`` and ``chain``. Identity is over stored bytes: verification
recomputes from what is stored, never from a re-serialized object.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID

from domain.digests import ZERO_CHAIN, event_id, next_chain


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One stored row of the log."""

    position: int
    aggregate_id: UUID
    version: int
    topic: str
    state: bytes
    event_id: bytes
    chain: bytes

    def recomputed_event_id(self) -> bytes:
        return event_id(self.aggregate_id.bytes, self.version, self.topic.encode(), self.state)


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """The first position where stored rows disagree with the chain rule."""

    position: int
    problem: str


def first_chain_break(
    rows: Iterable[LoggedEvent], *, start_position: int = 0, start_chain: bytes = ZERO_CHAIN
) -> ChainBreak | None:
    """Walk rows in position order; name the first one that does not verify."""
    expected_position = start_position
    chain = start_chain
    for row in rows:
        expected_position += 1
        if row.position != expected_position:
            return ChainBreak(
                expected_position,
                f"expected position {expected_position}, found {row.position}",
            )
        eid = row.recomputed_event_id()
        if eid != row.event_id:
            return ChainBreak(row.position, "event_id does not match the stored bytes")
        chain = next_chain(chain, eid)
        if chain != row.chain:
            return ChainBreak(row.position, "chain does not follow from the previous row")
    return None
