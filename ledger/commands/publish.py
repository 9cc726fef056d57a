"""The ``publish`` handler: validate every audience and append one revision (R16).

Reading and building the revision is ``ledger.commands.publishing``'s; this handler
decides between the incremental build and the full one, records the command (R10),
and appends the revision as one append fenced on everything it read (R11).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast
from uuid import UUID

from eventsourcing.domain import Aggregate
from sqlalchemy.engine import Connection

from domain.coordination import CommandRecord
from ledger.commands.catalog_state import LogHead
from ledger.commands.publishing import (
    FullBuildDue,
    catalog_outcome,
    log,
    publication_summary,
    read_catalog_in_force,
    read_from_fragments,
    revision_aggregates,
)
from ledger.commands.results import PublishResult
from ledger.commands.unit_of_work import UnitOfWork, then
from ledger.log.append import Precommit
from ledger.observability import bind, logged_command
from ledger.store import kept_fragments
from ledger.store.runtime import Ledger
from publisher.catalog import Audience, PublicationRejected
from publisher.planning import PublishPlan, plan_built, plan_publication


@dataclass(frozen=True)
class StagedPublication:
    """A validated revision built in memory, not yet appended.

    ``fence`` holds the catalog lineage's version; ``unchanged`` refuses the append if
    any other aggregate the revision was built from moved after the snapshot.
    """

    result: PublishResult
    aggregates: list[Aggregate]
    fence: dict[UUID, int]
    unchanged: Precommit


@dataclass(frozen=True)
class _Planned:
    """A publication plan and what its append needs: the parent as the log committed it,
    every audience's digest after it, the packs it relied on, what keeps its fragments."""

    plan: PublishPlan
    position: int
    head: LogHead | None
    everything: Callable[[], Mapping[Audience, str]]
    used: set[str]
    audiences: set[Audience]
    keep: Precommit | None


class PublishHandler:
    """The ``publish`` command: validate every audience, append one revision (R16).

    ``incremental`` (default) reuses the parent revision's validation and digests
    of the audiences whose inputs did not change (``read_from_fragments``); ``False``
    always rebuilds the whole revision. Both publish identical revisions.
    """

    def __init__(self, ledger: Ledger, uow: UnitOfWork, *, incremental: bool = True) -> None:
        self.ledger = ledger
        self.uow = uow
        self.incremental = incremental

    @logged_command(log, "publish", publication_summary)
    def publish(self, *, command_id: str | None = None) -> PublishResult:
        """Validate every audience and append one revision, or nothing if unchanged (R16)."""
        staged = self.stage_publication(command_id=command_id)
        if isinstance(staged, StagedPublication):
            return self.commit_publication(staged)
        return staged

    def stage_publication(
        self, *, command_id: str | None = None
    ) -> PublishResult | StagedPublication:
        """Read, build and validate the whole revision in memory (no write).

        Returns the final result when there is nothing to append (exact retry or
        unchanged content), else the staged revision for ``commit_publication``.
        """
        request_digest = self.uow.request_digest({"kind": "publish"})
        with self.ledger.snapshot() as reader:
            cid = self.uow.command_id(command_id, "publish", request_digest, reader)
            bind(command_id=cid)
            prior = self.uow.recorded(reader, cid, "publish", request_digest)
            if prior is not None:
                return cast(PublishResult, {**prior, "replayed": True})
            planned = self._plan_publication(reader.conn)
            publication = planned.plan
            result: PublishResult = {
                "command_id": cid,
                "noop": publication.event is None,
                "replayed": False,
                **catalog_outcome(publication),
            }
            if publication.event is None:
                return result
            aggregates, versions = revision_aggregates(
                reader, planned.head, publication, planned.everything
            )
        record = CommandRecord(
            command_id=cid, kind="publish", request_digest=request_digest, result=dict(result)
        )
        # Fenced on everything it decided on, by the snapshot's position: the catalog
        # lineage, every pack and every audience the parent or this revision binds.
        unchanged = self.uow.read_fence(planned.position, planned.used, planned.audiences)
        if planned.keep is not None:  # the revision's fragments, kept in its own transaction
            unchanged = then(unchanged, planned.keep)
        return StagedPublication(result, [*aggregates, record], versions, unchanged)

    def _plan_publication(self, conn: Connection) -> _Planned:
        """The publication plan, incremental when the parent revision can be reused."""
        if self.incremental:
            try:
                snap = read_from_fragments(self.ledger, conn)
            except (PublicationRejected, FullBuildDue):
                snap = None  # the full build below names every problem, as it always has
            if snap is not None:
                plan = plan_built(snap.built, snap.parent, snap.position)
                keep = None
                if plan.event is not None:
                    changes = snap.next.changes if snap.content.kept else None
                    keep = kept_fragments.writer(snap.next.fragments, changes)
                audiences = snap.content.audiences() | snap.affected
                return _Planned(
                    plan, snap.position, snap.head, snap.everything, snap.used, audiences, keep
                )
        catalog = read_catalog_in_force(self.ledger, conn)
        plan = plan_publication(catalog.input(), catalog.parent, catalog.position, keep_rows=False)
        used = {row.pack for row in catalog.bindings} | set(catalog.parent.activations)
        audiences = {row.audience for row in catalog.bindings} | set(catalog.parent.audiences)
        built = plan.built
        digests: Mapping[Audience, str] = built.audience_digests if built is not None else {}
        return _Planned(
            plan, catalog.position, catalog.head, lambda: digests, used, audiences, None
        )

    def commit_publication(self, staged: StagedPublication) -> PublishResult:
        """Append the staged revision as one append, fenced on everything it read."""
        self.ledger.app.save(*staged.aggregates, fence=staged.fence, precommit=staged.unchanged)
        return staged.result
