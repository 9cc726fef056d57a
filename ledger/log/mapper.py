"""The mapper between domain events and stored rows, driven by the event type table (R23).

``eventsourcing``'s stock mapper stores ``module:Class`` topics and resolves
them by importing code, so a moved class breaks every old store. This one
stores ``<type name>@<version>`` from ``domain.event_types``, keeps no class
path in the state (``originator_topic`` is dropped on write and supplied from
the table on read), reads both log formats, upcasts old schema versions on
read, and fails closed (INTEGRITY) on any topic it does not know.

The stored ``state`` is exactly the transcoder's bytes: log format v1 has no
compression and no encryption (``schema/LOG-FORMAT.md``), and ``event_id`` and the
chain are computed over those stored bytes. ``eventsourcing`` builds mappers as
``Mapper(transcoder=..., cipher=..., compressor=...)`` (``InfrastructureFactory.mapper()``,
``MAPPER_TOPIC``), so both keywords are accepted, and anything but ``None`` is refused
with INVALID naming the setting: a compressed or encrypted state would be another
format, and the log is forever.
"""

from __future__ import annotations

from typing import Any, cast
from uuid import UUID

from eventsourcing.domain import DomainEventProtocol
from eventsourcing.persistence import Cipher, Compressor, Mapper, StoredEvent, Transcoder
from eventsourcing.utils import get_topic

from domain.errors import InvalidInput
from domain.event_types import EVENT_TYPES, NOT_STATE, EventTypeTable

#: Where a library user would have asked for each (``eventsourcing``'s environment keys).
_SETTING = {
    "compressor": "COMPRESSOR_TOPIC",
    "cipher": "CIPHER_TOPIC or CIPHER_KEY",
}


class LogMapper(Mapper[UUID]):
    """Stored topic = product type name and version; state = the event's own fields."""

    def __init__(
        self,
        transcoder: Transcoder,
        compressor: Compressor | None = None,
        cipher: Cipher | None = None,
        *,
        table: EventTypeTable = EVENT_TYPES,
    ) -> None:
        for name, given in (("compressor", compressor), ("cipher", cipher)):
            if given is not None:
                raise InvalidInput(
                    f"the log stores event state uncompressed and unencrypted (log format "
                    f"v1, schema/LOG-FORMAT.md): a {name} ({type(given).__name__}) would "
                    f"change the stored bytes; unset {_SETTING[name]}",
                    field=name,
                    given=type(given).__name__,
                )
        super().__init__(transcoder)
        self.table = table

    def to_stored_event(self, domain_event: DomainEventProtocol[UUID]) -> StoredEvent:
        etype = self.table.of_class(type(domain_event))
        state = {k: v for k, v in vars(domain_event).items() if k not in NOT_STATE}
        return StoredEvent(
            originator_id=domain_event.originator_id,
            originator_version=domain_event.originator_version,
            topic=etype.topic,
            state=self.transcoder.encode(state),
        )

    def to_domain_event(self, stored_event: StoredEvent) -> DomainEventProtocol[UUID]:
        stored = self.table.resolve(stored_event.topic)
        state: dict[str, Any] = stored.upcast(self.transcoder.decode(stored_event.state))
        etype = stored.type
        if etype.creates:
            # Only in memory: eventsourcing constructs the aggregate from it.
            state["originator_topic"] = get_topic(etype.aggregate)
        originator = stored_event.originator_id
        state["originator_id"] = originator if isinstance(originator, UUID) else UUID(originator)
        state["originator_version"] = stored_event.originator_version
        event = object.__new__(etype.cls)
        object.__setattr__(event, "__dict__", state)
        return cast(DomainEventProtocol[UUID], event)
