"""Every stored event's topic, in one place (projections, audit and schema use these)."""

from __future__ import annotations

from eventsourcing.domain import Aggregate
from eventsourcing.utils import get_topic

from domain.catalog import AudienceBindings, Catalog
from domain.coordination import CommandRecord, Lease
from domain.lifecycle import Generation, LegacyRecord, LocalPack, PackActivation, PackHistory

#: Every aggregate of the store; their nested event classes are the log's events.
AGGREGATES: tuple[type[Aggregate], ...] = (
    Generation,
    PackActivation,
    PackHistory,
    LocalPack,
    LegacyRecord,
    Lease,
    CommandRecord,
    AudienceBindings,
    Catalog,
)

T_PREPARED = get_topic(Generation.Prepared)
T_ACTIVATED = get_topic(Generation.Activated)
T_RETIRED = get_topic(Generation.Retired)
T_FAILED = get_topic(Generation.Failed)
T_STARTED = get_topic(PackActivation.Started)
T_ADVANCED = get_topic(PackActivation.Advanced)
T_LOCAL_INSTALLED = get_topic(LocalPack.Installed)
T_LOCAL_UPDATED = get_topic(LocalPack.Updated)
T_LEGACY = get_topic(LegacyRecord.Imported)
T_GRANTED = get_topic(AudienceBindings.Granted)
T_REBOUND = get_topic(AudienceBindings.Rebound)
T_REVOKED = get_topic(AudienceBindings.Revoked)
T_PUBLISHED = get_topic(Catalog.Published)
T_RECORDED = get_topic(CommandRecord.Recorded)


def event_classes() -> list[type[Aggregate.Event]]:
    """Every event class that is ever stored, in a stable order."""
    found: list[type[Aggregate.Event]] = []
    for aggregate in AGGREGATES:
        for name in sorted(vars(aggregate)):
            value = vars(aggregate)[name]
            if (
                isinstance(value, type)
                and issubclass(value, Aggregate.Event)
                and name not in ("Created", "Event")  # bases eventsourcing adds, never stored
                and value.__qualname__.startswith(aggregate.__name__ + ".")
            ):
                found.append(value)
    return found


#: Events the audit replays (lifecycle, leases, the catalog lineage and bindings).
REPLAY_TOPICS = frozenset(
    get_topic(c)
    for c in event_classes()
    if get_topic(c).startswith(
        ("domain.lifecycle:", "domain.catalog:", "domain.coordination:Lease")
    )
)
