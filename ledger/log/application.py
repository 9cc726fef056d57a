"""The ``eventsourcing`` application wired to this project's recorder and transcoder.

``eventsourcing`` supplies aggregates and the repository; this module swaps
in the hash-chained ``LedgerRecorder``, the canonical ``OrjsonTranscoder`` and
the ``LogMapper`` that stores product type names (log format v1).
``save(..., fence=..., precommit=...)`` passes the read fence and the
terminal check straight to the append transaction.

The library's settings are pinned, not read from the process environment
(``eventsourcing`` merges ``os.environ`` into every application's settings by
default): the aggregate cache stays off (every decision reads the log), and
snapshotting stays off whatever ``IS_SNAPSHOTTING_ENABLED`` says, because this
store has no snapshot table and the library would read the newest *event* of an
aggregate as its snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    InfrastructureFactory,
    Mapper,
    ProcessRecorder,
    TrackingRecorder,
    Transcoder,
)
from eventsourcing.utils import Environment

from ledger.log.append import InlineHook
from ledger.log.db import Database
from ledger.log.mapper import LogMapper
from ledger.log.recorder import LedgerRecorder
from ledger.log.transcoder import OrjsonTranscoder


class LedgerFactory(InfrastructureFactory[TrackingRecorder]):
    """Builds the one recorder of a store; tracking is done by projections instead."""

    def __init__(self, env: Environment, recorder: LedgerRecorder) -> None:
        super().__init__(env)
        self._recorder = recorder

    def transcoder(self) -> Transcoder:
        return OrjsonTranscoder()

    def is_snapshotting_enabled(self) -> bool:
        """Never: the store has no snapshot table (see the module docstring)."""
        return False

    def aggregate_recorder(self, purpose: str = "events") -> AggregateRecorder:
        return self._recorder

    def application_recorder(self) -> ApplicationRecorder:
        return self._recorder

    def tracking_recorder(
        self, tracking_recorder_class: type[TrackingRecorder] | None = None
    ) -> TrackingRecorder:
        raise NotImplementedError("projections track their position in their own tables")

    def process_recorder(self) -> ProcessRecorder:
        raise NotImplementedError("projections track their position in their own tables")


#: The library settings every ledger application runs with, whatever its caller's
#: environment or ``env`` says (the module docstring says why).
PINNED_ENV: Mapping[str, str] = {
    "AGGREGATE_CACHE_MAXSIZE": "",
    "IS_SNAPSHOTTING_ENABLED": "n",
}


class LedgerApplication(Application[UUID]):
    """An ``eventsourcing`` application over the hash-chained log."""

    name = "CatalogLedger"

    def __init__(
        self,
        db: Database,
        inline_hooks: Sequence[InlineHook] = (),
        *,
        recorder: LedgerRecorder | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.db = db
        self.ledger_recorder = recorder or LedgerRecorder(db, inline_hooks)
        super().__init__(env=env)

    def construct_env(self, name: str, env: Mapping[str, str] | None = None) -> Environment:
        """``env`` (never ``os.environ``) with ``PINNED_ENV`` over it; a name-prefixed
        spelling of a pinned key (``CATALOGLEDGER_IS_SNAPSHOTTING_ENABLED``), which the
        library would read first, is dropped."""
        given = dict(env or {})
        for key in PINNED_ENV:
            given.pop(f"{name.upper()}_{key}", None)
        return Environment(name, {**given, **PINNED_ENV})

    def construct_factory(self, env: Environment) -> InfrastructureFactory[Any]:
        return LedgerFactory(env, self.ledger_recorder)

    def construct_transcoder(self) -> Transcoder:
        return OrjsonTranscoder()

    def construct_mapper(self) -> Mapper[UUID]:
        """Log format v1 on write, v0 and v1 on read (``domain.event_types``), built the
        library's way (``InfrastructureFactory.mapper``): a cipher or compressor asked
        for in ``env`` is refused (``LogMapper``)."""
        return self.factory.mapper(transcoder=self.construct_transcoder(), mapper_class=LogMapper)
