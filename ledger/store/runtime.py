"""The running store: recorder + inline projections + ``eventsourcing`` application.

``Ledger`` wires the pieces once; ``Repository`` loads aggregates from the log
inside one connection, so a decision is made on one consistent snapshot
(preflight) and re-checked on the locked current state (inside the append).

"Snapshot" means one consistent read of the store, nothing else: a published catalog
is a revision, and the ``eventsourcing`` ``Snapshot`` event that ``positioned`` seeds an
aggregate with is named as the library's class wherever it appears.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar, cast
from uuid import UUID

from eventsourcing.domain import Aggregate, Snapshot
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import get_topic
from sqlalchemy.engine import Connection

from domain.classifier import PackState
from domain.coordination import CommandRecord, Lease, command_record_id, lease_id
from domain.errors import IntegrityFailure
from domain.event_types import unreadable
from domain.identity import PackName
from domain.lifecycle import (
    Generation,
    PackActivation,
    PackHistory,
    activation_id,
    generation_id,
    history_id,
)
from domain.records import LegacyRecord, LocalPack, legacy_id, local_id
from ledger.log.application import LedgerApplication
from ledger.log.db import Database
from ledger.log.recorder import LedgerRecorder
from projections.registry import ALL_PROJECTIONS
from projections.runner import ProjectionRunner

A = TypeVar("A", bound=Aggregate)


class Ledger:
    """One opened store with its recorder, projections and application."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.recorder = LedgerRecorder(db)
        self.runner = ProjectionRunner(ALL_PROJECTIONS, self.recorder)
        self.recorder.inline_hooks.append(self.runner.inline_hook)
        self.app = LedgerApplication(db, recorder=self.recorder)

    def repository(self, conn: Connection) -> Repository:
        """Aggregates as ``conn`` reads them (inside a transaction the caller holds)."""
        return Repository(self, conn)

    @contextmanager
    def snapshot(self) -> Iterator[Repository]:
        """Aggregates as of one consistent read snapshot."""
        with self.db.read() as conn:
            yield Repository(self, conn)

    def close(self) -> None:
        self.db.close()


class Repository:
    """Loads aggregates (packs, leases, command records) from the log through one
    connection."""

    def __init__(self, ledger: Ledger, conn: Connection) -> None:
        self.ledger = ledger
        self.conn = conn
        self._mapper = ledger.app.mapper

    def get(self, aggregate: UUID, cls: type[A]) -> A | None:
        stored = self.ledger.recorder.checked_events_of(self.conn, [aggregate])
        if not stored:
            return None
        result = self._mutated(stored)
        if not isinstance(result, cls):
            raise IntegrityFailure(
                f"aggregate {aggregate} is a {type(result).__name__}, expected {cls.__name__}",
                aggregate_id=str(aggregate),
            )
        return result

    def get_many(self, wanted: Mapping[UUID, type[Aggregate]]) -> dict[UUID, Aggregate | None]:
        """``get`` of many aggregates, their events read in a few statements (one per
        ``_MANY`` ids) instead of one statement each."""
        found: dict[UUID, Aggregate | None] = dict.fromkeys(wanted)
        by_id: dict[UUID, list[tuple[int, StoredEvent]]] = {}
        for item in self.ledger.recorder.checked_events_of(self.conn, list(wanted)):
            by_id.setdefault(item[1].originator_id, []).append(item)  # type: ignore[arg-type]
        for aggregate, events in by_id.items():
            result = self._mutated(events)
            cls = wanted[aggregate]
            if not isinstance(result, cls):
                raise IntegrityFailure(
                    f"aggregate {aggregate} is a {type(result).__name__}, expected {cls.__name__}",
                    aggregate_id=str(aggregate),
                )
            found[aggregate] = result
        return found

    def _mutated(self, events: Sequence[tuple[int, StoredEvent]]) -> Any:
        """The aggregate ``events`` (position, stored event) build; an event whose fields
        do not build it (a value of another type) is INTEGRITY naming its position."""
        result: Any = None
        for expected, (position, item) in enumerate(events, start=1):
            if item.originator_version != expected:  # a row of it was edited away
                raise IntegrityFailure(
                    f"the log row at position {position} is version {item.originator_version} "
                    f"of aggregate {item.originator_id}, whose version {expected} the log "
                    "does not hold; the log was edited outside the store",
                    position=position,
                    aggregate_id=str(item.originator_id),
                )
            try:
                result = cast(Any, self._mapper.to_domain_event(item)).mutate(result)
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                raise unreadable(position, exc) from None
        return result

    def pack_states(self, packs: Iterable[PackName]) -> dict[PackName, PackState]:
        """``pack_state`` of every pack in ``packs``, read in bulk (two rounds: the
        per-pack aggregates, then the generations they name)."""
        names = list(dict.fromkeys(packs))
        first: dict[UUID, type[Aggregate]] = {}
        for pack in names:
            first[history_id(pack)] = PackHistory
            first[activation_id(pack)] = PackActivation
            first[legacy_id(pack)] = LegacyRecord
            first[local_id(pack)] = LocalPack
        got = self.get_many(first)
        second: dict[UUID, type[Aggregate]] = {}
        for pack in names:
            history = cast(PackHistory | None, got[history_id(pack)])
            activation = cast(PackActivation | None, got[activation_id(pack)])
            if history is not None:
                second[generation_id(pack, history.newest)] = Generation
            if activation is not None and activation.install_id is not None:
                second[generation_id(pack, activation.install_id)] = Generation
        got.update(self.get_many(second))
        states = {}
        for pack in names:
            history = cast(PackHistory | None, got[history_id(pack)])
            activation = cast(PackActivation | None, got[activation_id(pack)])
            newest = (
                cast(Generation | None, got[generation_id(pack, history.newest)])
                if history
                else None
            )
            active: Generation | None = None
            if activation is not None and activation.install_id is not None:  # not removed
                if newest is not None and newest.install_id == activation.install_id:
                    active = newest
                else:
                    active = cast(
                        Generation | None, got[generation_id(pack, activation.install_id)]
                    )
            states[pack] = PackState(
                pack=pack,
                legacy=cast(LegacyRecord | None, got[legacy_id(pack)]),
                local=cast(LocalPack | None, got[local_id(pack)]),
                activation=activation,
                history=history,
                newest=newest,
                active=active,
            )
        return states

    def pack_state(self, pack: PackName) -> PackState:
        history = self.get(history_id(pack), PackHistory)
        activation = self.get(activation_id(pack), PackActivation)
        newest = self.get(generation_id(pack, history.newest), Generation) if history else None
        active: Generation | None = None
        if activation is not None and activation.install_id is not None:  # not removed
            if newest is not None and newest.install_id == activation.install_id:
                active = newest
            else:
                active = self.get(generation_id(pack, activation.install_id), Generation)
        return PackState(
            pack=pack,
            legacy=self.get(legacy_id(pack), LegacyRecord),
            local=self.get(local_id(pack), LocalPack),
            activation=activation,
            history=history,
            newest=newest,
            active=active,
        )

    def lease(self, name: str) -> Lease | None:
        return self.get(lease_id(name), Lease)

    def command(self, command_id: str) -> CommandRecord | None:
        return self.get(command_record_id(command_id), CommandRecord)

    def version(self, aggregate: UUID) -> int:
        return self.ledger.recorder.current_version(self.conn, aggregate)

    def positioned(self, cls: type[A], aggregate: UUID, version: int, **state: Any) -> A:
        """``cls`` at ``version`` with ``state`` read from an inline view, without replay.

        For aggregates whose decisions are made against views (bindings, the
        catalog lineage) and which only need their identity and version to
        append: an ``eventsourcing`` ``Snapshot`` event built from the view state in this
        same read transaction. The version is the log's, so the read fence still
        guards every decision made on that state.
        """
        stamp = Snapshot.create_timestamp()
        seed = Snapshot(
            originator_id=aggregate,
            originator_version=version,
            timestamp=stamp,
            topic=get_topic(cls),
            state={**state, "_created_on": stamp, "_modified_on": stamp},
        )
        result = seed.mutate(None)
        assert isinstance(result, cls)
        return result
