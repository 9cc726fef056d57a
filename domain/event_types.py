"""The log's event types: product names, schema versions, and how every stored topic reads.

This module is the one table of type name <-> class (R23). The recorder's
mapper, the projections, the audit, ``history`` and the JSON Schema all read
it; nothing else lists event types. ``schema/LOG-FORMAT.md`` documents it.

Two log formats exist, and both are read forever:

* **format v0** (catalog-ledger 0.1): the topic is the Python path of the
  event class (``domain.lifecycle:Generation.Prepared``) and the state of a
  creating event carries ``originator_topic``, another Python path. Those
  strings are frozen below as text: they are history, not code references,
  so moving or renaming a class never breaks an old store.
* **format v1** (0.2 on): the topic is ``<type name>@<schema version>``
  (``generation.prepared@1``). The state holds the event's own fields and its
  ``timestamp``, nothing else.

Where the version lives: in the topic. The topic is already hashed into every
``event_id`` and is the column readers filter on, so a reader knows which
decoder a row needs (and fails closed on a version it does not know) before it
parses a byte of state, and the SQL topic filter selects exact versions.

A schema change is a new version: the event class gains fields, and
``added[n]`` names the fields version ``n`` added with the value a row of
version ``n - 1`` is read as (its upcast). Rows are never rewritten: an old
row's stored bytes stay exactly what was hashed; upcasting happens on read.

Renaming a type later: never change ``name`` of a type that has rows. Add
the old name to ``aliases`` (stored topics keep resolving), and write the new
name from then on; the spec's table records both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints
from uuid import UUID

import orjson
from eventsourcing.domain import Aggregate

from domain.catalog import AudienceBindings, Catalog, PublishedView
from domain.coordination import CommandRecord, Lease
from domain.credentials import Credential
from domain.errors import IntegrityFailure
from domain.lifecycle import Generation, PackActivation, PackHistory
from domain.log_identity import LogIdentity
from domain.records import LegacyRecord, LocalPack

#: The log format this release writes, and every format it reads.
WRITTEN_FORMAT = 1
READ_FORMATS = (0, 1)

_NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
#: State keys that are not event fields: ids live in their columns, classes in this table.
NOT_STATE = frozenset({"originator_id", "originator_version", "originator_topic"})


class UnknownEventType(IntegrityFailure):
    """A stored topic this release cannot read: unknown type, or a newer schema version."""


@dataclass(frozen=True)
class EventType:
    """One event type of the log: its product name, class and schema history."""

    name: str
    cls: type[Aggregate.Event]
    #: The aggregate the event belongs to (a creating event constructs it).
    aggregate: type[Aggregate]
    #: The Python-path topic 0.1 stored this type under (format v0), frozen text.
    v0_topic: str | None = None
    #: version -> {field: value a row of the previous version is read with}.
    added: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    #: Earlier names of this type, still read (see the module docstring).
    aliases: tuple[str, ...] = ()
    #: version -> {field: its type in every version before that one}, for a field a
    #: version widened (the JSON Schema of older versions stays exact).
    narrower_before: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name) or any(not _NAME.fullmatch(a) for a in self.aliases):
            raise ValueError(f"not a product type name: {self.name!r}")
        if sorted(self.added) != list(range(2, 2 + len(self.added))):
            raise ValueError(f"{self.name}: versions must run 2, 3, … without gaps")
        fields = set(self.fields())
        for version, defaults in self.added.items():
            if not set(defaults) <= fields:
                raise ValueError(f"{self.name} v{version} adds fields its class lacks")
        for version, types in self.narrower_before.items():
            if version not in self.added or not set(types) <= fields:
                raise ValueError(f"{self.name} v{version} widens a field it does not have")

    @property
    def version(self) -> int:
        """The schema version this release writes."""
        return 1 + len(self.added)

    @property
    def topic(self) -> str:
        """The format-v1 topic new events of this type are stored under."""
        return f"{self.name}@{self.version}"

    @property
    def creates(self) -> bool:
        """Whether the event constructs its aggregate (``originator_topic`` in eventsourcing)."""
        return issubclass(self.cls, Aggregate.Created)

    def fields(self, version: int | None = None) -> tuple[str, ...]:
        """The state fields of ``version`` (default: current), ``timestamp`` included."""
        names = [n for n in getattr(self.cls, "__dataclass_fields__", {}) if n not in NOT_STATE]
        later = {
            f for v, added in self.added.items() if v > (version or self.version) for f in added
        }
        return tuple(sorted(n for n in names if n not in later))

    def stored_topics(self) -> tuple[str, ...]:
        """Every topic a row of this type may be stored under, oldest first."""
        topics = [self.v0_topic] if self.v0_topic else []
        for name in (*self.aliases, self.name):
            topics += [f"{name}@{v}" for v in range(1, self.version + 1)]
        return tuple(topics)


@dataclass(frozen=True, slots=True)
class StoredType:
    """What one stored topic means: the type, the schema version and the log format."""

    type: EventType
    version: int
    format: int

    def upcast(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` as the current version of the type (in place; returned for chaining)."""
        if self.format == 0:
            state.pop("originator_topic", None)
        for version in range(self.version + 1, self.type.version + 1):
            for name, default in self.type.added[version].items():
                state.setdefault(name, default)
        return state


class EventTypeTable:
    """Type name <-> class <-> stored topics, for every event the log holds."""

    def __init__(self, types: Iterable[EventType] = ()) -> None:
        self._by_name: dict[str, EventType] = {}
        self._by_class: dict[type, EventType] = {}
        self._by_topic: dict[str, StoredType] = {}
        for t in types:
            self.register(t)

    def register(self, t: EventType) -> None:
        """Add a type; names, classes and stored topics must all be new."""
        topics = {}
        if t.v0_topic:
            topics[t.v0_topic] = StoredType(t, 1, 0)
        for name in (*t.aliases, t.name):
            for v in range(1, t.version + 1):
                topics[f"{name}@{v}"] = StoredType(t, v, 1)
        clash = set(topics) & set(self._by_topic)
        if t.name in self._by_name or t.cls in self._by_class or clash:
            raise ValueError(f"event type {t.name} clashes with a registered one")
        self._by_name[t.name] = t
        self._by_class[t.cls] = t
        self._by_topic.update(topics)

    def __iter__(self) -> Iterator[EventType]:
        return iter(self._by_name.values())

    def named(self, name: str) -> EventType:
        return self._by_name[name]

    def of_class(self, cls: type) -> EventType:
        try:
            return self._by_class[cls]
        except KeyError:
            raise TypeError(f"{cls.__qualname__} is not a registered log event type") from None

    def resolve(self, topic: str | bytes) -> StoredType:
        """The meaning of a stored topic; unknown types and versions fail closed (R23)."""
        text = topic.decode("utf-8", "replace") if isinstance(topic, bytes) else topic
        found = self._by_topic.get(text)
        if found is not None:
            return found
        name, at, version = text.rpartition("@")
        if at and name in self._by_name:
            known = self._by_name[name].version
            raise UnknownEventType(
                f"event type {name} version {version} is newer than this release reads "
                f"(up to {known}); upgrade catalog-ledger to read this log",
                topic=text,
                known_version=known,
            )
        raise UnknownEventType(f"unknown event type {text!r} in the log", topic=text)

    def decode(self, topic: str | bytes, state: bytes) -> tuple[str, dict[str, Any]]:
        """Type name and current-version state of a stored row (the read path of views)."""
        stored = self.resolve(topic)
        data = orjson.loads(state)
        if not isinstance(data, dict):
            raise IntegrityFailure("a stored event state is not a JSON object", topic=str(topic))
        return stored.type.name, stored.upcast(data)

    def topics_of(self, names: Iterable[str]) -> list[str]:
        """Every stored topic of the types ``names`` (for SQL topic filters)."""
        return sorted(t for name in names for t in self._by_name[name].stored_topics())


def _t(
    name: str,
    cls: type[Aggregate.Event],
    aggregate: type[Aggregate],
    v0_topic: str,
    added: Mapping[int, Mapping[str, Any]] | None = None,
    narrower_before: Mapping[int, Mapping[str, Any]] | None = None,
) -> EventType:
    return EventType(
        name, cls, aggregate, v0_topic, added or {}, narrower_before=narrower_before or {}
    )


# The v0 topics are the exact text 0.1 stored. They are history, not references to
# code: when a class moves or is renamed, these strings stay exactly as they are.
G, PA, PH, LP, LR = Generation, PackActivation, PackHistory, LocalPack, LegacyRecord
AB = AudienceBindings

#: Every event type of the product, in a stable order (the spec's table).
PRODUCT_TYPES: tuple[EventType, ...] = (
    _t("generation.prepared", G.Prepared, G, "domain.lifecycle:Generation.Prepared"),
    _t("generation.activated", G.Activated, G, "domain.lifecycle:Generation.Activated"),
    # v2: retirement by removal (R7): ``successor_install_id`` may be null, and
    # ``removed`` says so (rows written before are retirements by advance).
    _t(
        "generation.retired",
        G.Retired,
        G,
        "domain.lifecycle:Generation.Retired",
        {2: {"removed": False}},
        {2: {"successor_install_id": str}},
    ),
    _t("generation.failed", G.Failed, G, "domain.lifecycle:Generation.Failed"),
    _t("activation.started", PA.Started, PA, "domain.lifecycle:PackActivation.Started"),
    _t("activation.advanced", PA.Advanced, PA, "domain.lifecycle:PackActivation.Advanced"),
    # New in format v1 (issue 15): pack removal and re-installation (R7).
    EventType("activation.removed", PA.Removed, PA),
    EventType("activation.reinstalled", PA.Reinstalled, PA),
    _t("pack_history.opened", PH.Opened, PH, "domain.lifecycle:PackHistory.Opened"),
    _t("pack_history.attempted", PH.Attempted, PH, "domain.lifecycle:PackHistory.Attempted"),
    # v2 (issue 27, R30): ``file_digest``, the SHA-256 hex of the raw ``pack.json`` the
    # record was made from, so that apply parses a local pack only when its file changed
    # (rows written before say nothing: read as null, and the file is parsed).
    _t(
        "local_pack.installed",
        LP.Installed,
        LP,
        "domain.lifecycle:LocalPack.Installed",
        {2: {"file_digest": None}},
    ),
    _t(
        "local_pack.updated",
        LP.Updated,
        LP,
        "domain.lifecycle:LocalPack.Updated",
        {2: {"file_digest": None}},
    ),
    EventType("local_pack.removed", LP.Removed, LP),
    EventType("local_pack.reinstalled", LP.Reinstalled, LP, added={2: {"file_digest": None}}),
    _t("legacy.imported", LR.Imported, LR, "domain.lifecycle:LegacyRecord.Imported"),
    _t("lease.opened", Lease.Opened, Lease, "domain.coordination:Lease.Opened"),
    _t("lease.acquired", Lease.Acquired, Lease, "domain.coordination:Lease.Acquired"),
    _t("lease.renewed", Lease.Renewed, Lease, "domain.coordination:Lease.Renewed"),
    _t("lease.released", Lease.Released, Lease, "domain.coordination:Lease.Released"),
    # New in format v1 (0.2): no 0.1 row can hold it.
    EventType("lease.broken", Lease.Broken, Lease),
    _t(
        "command.recorded",
        CommandRecord.Recorded,
        CommandRecord,
        "domain.coordination:CommandRecord.Recorded",
    ),
    _t("audience.opened", AB.Opened, AB, "domain.catalog:AudienceBindings.Opened"),
    _t("binding.granted", AB.Granted, AB, "domain.catalog:AudienceBindings.Granted"),
    _t("binding.rebound", AB.Rebound, AB, "domain.catalog:AudienceBindings.Rebound"),
    # v2: a revocation names the install id the revoked binding pointed at
    # (rows written before say nothing: read as null).
    _t(
        "binding.revoked",
        AB.Revoked,
        AB,
        "domain.catalog:AudienceBindings.Revoked",
        {2: {"install_id": None}},
    ),
    _t("catalog.opened", Catalog.Opened, Catalog, "domain.catalog:Catalog.Opened"),
    # v2 (issue 24, R28): ``audiences_root`` commits every audience's view digest, and
    # the changed audiences move out of the revision event into their own
    # ``audience_view.published`` events (``audiences`` stays, always empty).
    _t(
        "catalog.published",
        Catalog.Published,
        Catalog,
        "domain.catalog:Catalog.Published",
        {2: {"audiences_root": None}},
    ),
    # New in issue 24 (R28): each audience's published view digest, per revision.
    EventType("audience_view.opened", PublishedView.Opened, PublishedView),
    EventType("audience_view.published", PublishedView.Published, PublishedView),
    # New in format v1 (issue 16): audience credentials (R26); the token's digest only.
    EventType("credential.issued", Credential.Issued, Credential),
    EventType("credential.revoked", Credential.Revoked, Credential),
    # New in issue 28 (R29): the log's own identity — its origin, named once, and its
    # signing-key rotations (domain/log_identity.py).
    EventType("log.named", LogIdentity.Named, LogIdentity),
    EventType("log.renamed", LogIdentity.Renamed, LogIdentity),
    EventType("log_key.rotated", LogIdentity.KeyRotated, LogIdentity),
)
#: The table every reader and writer uses (tests may register types of their own).
EVENT_TYPES = EventTypeTable(PRODUCT_TYPES)

# Type names, for the modules that dispatch on them.
T_PREPARED = "generation.prepared"
T_ACTIVATED = "generation.activated"
T_RETIRED = "generation.retired"
T_FAILED = "generation.failed"
T_STARTED = "activation.started"
T_ADVANCED = "activation.advanced"
T_REMOVED = "activation.removed"
T_REINSTALLED = "activation.reinstalled"
T_HISTORY_OPENED = "pack_history.opened"
T_ATTEMPTED = "pack_history.attempted"
T_LOCAL_INSTALLED = "local_pack.installed"
T_LOCAL_UPDATED = "local_pack.updated"
T_LOCAL_REMOVED = "local_pack.removed"
T_LOCAL_REINSTALLED = "local_pack.reinstalled"
T_LEGACY = "legacy.imported"
T_GRANTED = "binding.granted"
T_REBOUND = "binding.rebound"
T_REVOKED = "binding.revoked"
T_PUBLISHED = "catalog.published"
T_VIEW_OPENED = "audience_view.opened"
T_VIEW_PUBLISHED = "audience_view.published"
T_RECORDED = "command.recorded"
T_CREDENTIAL_ISSUED = "credential.issued"
T_CREDENTIAL_REVOKED = "credential.revoked"
T_LOG_NAMED = "log.named"
T_LOG_RENAMED = "log.renamed"
T_LOG_KEY_ROTATED = "log_key.rotated"

#: Types whose facts are about one pack's lifecycle (``history --pack``).
LIFECYCLE_TYPES = frozenset(
    t.name
    for t in EVENT_TYPES
    if t.aggregate in (Generation, PackActivation, PackHistory, LocalPack, LegacyRecord)
)
#: An audience's binding events (its bindings change only through these).
BINDING_TYPES = frozenset({T_GRANTED, T_REBOUND, T_REVOKED})
#: Events the audit replays (lifecycle, leases, the catalog lineage, bindings, credentials).
REPLAY_TYPES = frozenset(
    t.name
    for t in EVENT_TYPES
    if t.aggregate
    in (
        Generation,
        PackActivation,
        PackHistory,
        LocalPack,
        LegacyRecord,
        Lease,
        AudienceBindings,
        Catalog,
        PublishedView,
        Credential,
    )
)
#: Types whose facts are about one audience (``history --audience``): its bindings and
#: its credentials.
AUDIENCE_TYPES = frozenset(
    t.name for t in EVENT_TYPES if t.aggregate in (AudienceBindings, PublishedView, Credential)
)


@dataclass(frozen=True, slots=True)
class Decoded:
    """One log row decoded through the type table: its place, type and current-version
    state (upcast, R23)."""

    position: int
    aggregate_id: UUID
    version: int
    type: str
    data: dict[str, Any]


def decode_row(
    aggregate: object, position: object, version: object, topic: object, state: object
) -> Decoded:
    """A stored row as ``Decoded``; a row that is not what the log declares (a cell of
    another type, a state that is not its type's JSON object, a field missing) is
    INTEGRITY naming its position (R22, R28), never a crash."""
    at = position
    try:
        at = int(position)  # type: ignore[call-overload]
        name, data = EVENT_TYPES.decode(_stored_bytes(topic), _stored_bytes(state))
        _check_fields(EVENT_TYPES.named(name), data)
        return Decoded(at, UUID(bytes=_stored_bytes(aggregate)), int(version), name, data)  # type: ignore[call-overload]
    except IntegrityFailure as exc:
        raise IntegrityFailure(
            f"the log row at position {at} is not readable: {exc.message}",
            **{**exc.details, "position": at},
        ) from None
    except (TypeError, ValueError, AttributeError) as exc:  # orjson's error is a ValueError
        raise unreadable(at, exc) from None


def decode_state(position: int, topic: str | bytes, state: object) -> tuple[str, dict[str, Any]]:
    """``EVENT_TYPES.decode`` of the row at ``position`` (the replay paths, which read
    (position, topic, state) only): a state that is not its type's JSON object is
    INTEGRITY naming the position, as in ``decode_row``."""
    try:
        return EVENT_TYPES.decode(topic, _stored_bytes(state))
    except IntegrityFailure as exc:
        raise IntegrityFailure(
            f"the log row at position {position} is not readable: {exc.message}",
            **{**exc.details, "position": position},
        ) from None
    except (TypeError, ValueError) as exc:
        raise unreadable(position, exc) from None


def unreadable(position: object, exc: BaseException) -> IntegrityFailure:
    """INTEGRITY for a stored row whose cells do not decode as the log declares."""
    return IntegrityFailure(
        f"the log row at position {position} is not what the log declares "
        f"({type(exc).__name__}: {exc}); the row was edited outside the store",
        position=position,
    )


def _check_fields(etype: EventType, data: Mapping[str, Any]) -> None:
    """Every field of the (upcast) state is there and of its declared JSON type, and the
    ``timestamp`` is RFC 3339 text (the aggregates parse it)."""
    missing = [f for f in etype.fields() if f not in data]
    if missing:
        raise ValueError(f"fields missing: {', '.join(missing)}")
    for name, allowed in _json_types(etype).items():
        if type(data[name]) not in allowed:
            raise TypeError(f"field {name} is {_JSON_NAME.get(type(data[name]), 'another type')}")
    datetime.fromisoformat(data["timestamp"])  # ValueError when it is not a timestamp


#: How a Python value read from JSON is named in an error.
_JSON_NAME = {
    str: "text",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
    list: "an array",
    dict: "an object",
}
_JSON_TYPES: dict[str, dict[str, tuple[type, ...]]] = {}


def _json_types(etype: EventType) -> dict[str, tuple[type, ...]]:
    """field -> the Python types orjson reads its declared JSON type as (cached per type)."""
    found = _JSON_TYPES.get(etype.name)
    if found is None:
        hints = get_type_hints(etype.cls)
        found = {name: _allowed(hints[name]) for name in etype.fields()}
        _JSON_TYPES[etype.name] = found
    return found


def _allowed(hint: Any) -> tuple[type, ...]:
    if hint is datetime:
        return (str,)
    if isinstance(hint, UnionType) or get_origin(hint) is Union:
        return tuple(t for arg in get_args(hint) for t in _allowed(arg))
    if hint is type(None):
        return (type(None),)
    origin = get_origin(hint) or hint
    if origin in (str, int, bool, list, dict):
        return (origin,)
    if origin is float:
        return (float, int)
    raise TypeError(f"no JSON type for the field type {hint!r}")


def _stored_bytes(value: object) -> bytes:
    """A binary cell's value; anything else (TEXT, a number, NULL) is a TypeError."""
    if type(value) is bytes:
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"a binary column holds {type(value).__name__}")
