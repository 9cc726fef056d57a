"""The catalog log (R29, LOG-FORMAT "Catalog log"): a second RFC 9162 tree over the
main log, whose leaf ``i`` is the event id of revision ``i + 1``'s ``catalog.published``
event, and the stored cosigned checkpoints of ``ledger_checkpoint``.

The tree is derived data, a pure function of the main log: its leaves are read from
``ledger_events`` with one range read on the ``(aggregate_id, version)`` unique index
(the catalog aggregate's events, in version order), each event id recomputed from its
stored bytes and compared with the stored one (fail closed: a row whose bytes do not
give its id is INTEGRITY naming its position).

Cost: ``CatalogLog`` keeps every leaf hash in memory (32 bytes and a version per
revision: a few hundred kilobytes for ten thousand revisions) and each tree size's root
once computed. A refresh reads only the revisions past the last one it holds (plus that
one, to check the log under it is still the same, else it starts again), so a read at an
unchanged catalog is one index seek returning one row, and a new revision costs reading
that revision. A proof over the in-memory leaves costs O(n) SHA-256 (the list-based
``domain.merkle`` generators): about a millisecond per thousand revisions, and the
callers cache what they build from it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain import merkle
from domain.audience_map import inclusion_proof
from domain.catalog import catalog_id
from domain.digests import event_id
from domain.errors import Conflict, IntegrityFailure, InvalidInput
from domain.event_types import EVENT_TYPES, T_PUBLISHED, UnknownEventType, decode_state
from domain.notes import Checkpoint, NoteSignature, cosignature_timestamp
from ledger.log import tables as schema
from ledger.log.db import Database
from ledger.log.sqltypes import dec, enc
from projections.queries.publication import BadNode, map_fetch


@dataclass(frozen=True)
class RevisionEvent:
    """A revision's ``catalog.published`` event as stored (its bytes give its id)."""

    position: int
    aggregate_id: UUID
    version: int
    topic: bytes
    state: bytes
    event_id: bytes

    def data(self) -> dict[str, Any]:
        return decode_state(self.position, self.topic, self.state)[1]

    def to_json(self) -> dict[str, Any]:
        """The bundle's ``revision_event`` member (LOG-FORMAT "Proof bundle")."""
        import base64

        return {
            "aggregate_id": str(self.aggregate_id),
            "version": self.version,
            "topic": self.topic.decode("utf-8", "surrogateescape"),
            "state_b64": base64.b64encode(self.state).decode(),
        }


def _events_sql(after_version: int) -> sa.Select[Any]:
    t = schema.events
    return (
        sa.select(t.c.position, t.c.version, t.c.topic, t.c.state, t.c.event_id)
        .where(t.c.aggregate_id == catalog_id().bytes, t.c.version >= after_version)
        .order_by(t.c.version)
    )


def _revision(position: int, topic: bytes, state: bytes) -> int | None:
    """The revision a catalog event publishes (``None``: not a ``catalog.published``)."""
    try:
        stored = EVENT_TYPES.resolve(topic)
    except UnknownEventType as exc:
        raise IntegrityFailure(
            f"the log row at position {position} is not readable: {exc.message}",
            position=position,
        ) from None
    if stored.type.name != T_PUBLISHED:
        return None
    revision = decode_state(position, topic, state)[1].get("revision")
    if type(revision) is not int:
        raise IntegrityFailure(
            f"the revision event at position {position} has no revision", position=position
        )
    return revision


class CatalogLog:
    """The catalog log of one store, cached by size (module docstring: the cost)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._lock = threading.Lock()
        #: (version, position, event id) of each revision's event; the leaf hashes.
        self._events: list[tuple[int, int, bytes]] = []
        self._leaves: list[bytes] = []
        #: The last catalog event read (any type), to resume and to check it is still there.
        self._last: tuple[int, bytes] | None = None
        self._roots: dict[int, bytes] = {}

    def refresh(self, conn: Connection | None = None) -> int:
        """Read the revisions published since the last refresh; the log's size."""
        if conn is None:
            with self.db.read() as own:
                return self.refresh(own)
        with self._lock:
            after = self._last[0] if self._last is not None else 1
            rows = list(conn.execute(_events_sql(after)))
            if self._last is not None and (not rows or (rows[0][1], rows[0][4]) != self._last):
                # The log under the cache changed (a restore into this store): start again.
                self._events, self._leaves, self._last, self._roots = [], [], None, {}
                rows = list(conn.execute(_events_sql(1)))
            elif self._last is not None:
                rows = rows[1:]
            for row in rows:
                self._add(row)
            return len(self._events)

    def _add(self, row: Any) -> None:
        """One catalog event read from the log: checked, and a leaf if it is a revision."""
        position, version, topic, state, stored_id = row
        if not (
            type(position) is int
            and type(version) is int
            and all(isinstance(v, bytes) for v in (topic, state, stored_id))
        ):
            raise IntegrityFailure(
                f"the log row at position {position} is not of its declared types",
                table=schema.events.name,
                position=position,
            )
        if event_id(catalog_id().bytes, version, topic, state) != stored_id:
            raise IntegrityFailure(
                f"the log row at position {position} does not give its stored event_id: "
                "the catalog log is not served from a tampered row",
                table=schema.events.name,
                position=position,
            )
        self._last = (version, stored_id)
        revision = _revision(position, topic, state)
        if revision is None:
            return
        if revision != len(self._events) + 1:
            raise IntegrityFailure(
                f"the catalog event at position {position} publishes revision {revision} "
                f"after revision {len(self._events)}",
                position=position,
            )
        self._events.append((version, position, stored_id))
        self._leaves.append(merkle.leaf_hash(stored_id))

    @property
    def size(self) -> int:
        """The size as of the last refresh."""
        return len(self._events)

    def root(self, size: int) -> bytes:
        self._require(size, "size")
        found = self._roots.get(size)
        if found is None:
            found = self._roots[size] = merkle.root(self._leaves[:size])
        return found

    def checkpoint(self, origin: str) -> Checkpoint:
        """The checkpoint of the catalog log as of the last refresh."""
        return Checkpoint(origin, self.size, self.root(self.size))

    def event_id(self, revision: int) -> bytes:
        self._require(revision, "revision", least=1)
        return self._events[revision - 1][2]

    def inclusion(self, revision: int, size: int) -> list[bytes]:
        """The RFC 9162 inclusion proof of leaf ``revision - 1`` in the tree of ``size``."""
        self._require(size, "size", least=1)
        if not 1 <= revision <= size:
            raise InvalidInput(f"revision {revision} is not in a catalog log of size {size}",
                               field="revision")  # fmt: skip
        return merkle.inclusion_proof(self._leaves, revision - 1, size)

    def consistency(self, size1: int, size2: int) -> list[bytes]:
        """The RFC 9162 consistency proof from ``size1`` to ``size2``."""
        self._require(size2, "size")
        if not 0 < size1 <= size2:
            raise InvalidInput(
                f"since_size must be from 1 to {size2} (the catalog log's size)",
                field="since_size",
            )
        return merkle.consistency_proof(self._leaves, size1, size2)

    def revision_event(self, revision: int, conn: Connection | None = None) -> RevisionEvent:
        """Revision ``revision``'s event as stored (one primary-key read)."""
        self._require(revision, "revision", least=1)
        version, position, stored_id = self._events[revision - 1]
        if conn is None:
            with self.db.read() as own:
                return self.revision_event(revision, own)
        t = schema.events
        row = conn.execute(
            sa.select(t.c.topic, t.c.state).where(
                t.c.aggregate_id == catalog_id().bytes, t.c.version == version
            )
        ).one_or_none()
        if row is None:
            raise IntegrityFailure(
                f"the log row at position {position} (the catalog's version {version}) is "
                "gone from under the catalog log",
                table=schema.events.name,
                position=position,
                version=version,
            )
        topic, state = bytes(row[0]), bytes(row[1])
        if event_id(catalog_id().bytes, version, topic, state) != stored_id:
            raise IntegrityFailure(
                f"the log row at position {position} changed under the catalog log",
                table=schema.events.name,
                position=position,
            )
        return RevisionEvent(position, catalog_id(), version, topic, state, stored_id)

    def _require(self, value: int, field: str, *, least: int = 0) -> None:
        if not least <= value <= len(self._events):
            raise InvalidInput(
                f"{field} must be from {least} to {len(self._events)} (the catalog log's size)",
                field=field,
            )


def audience_proof(conn: Connection, key: bytes) -> list[bytes] | None:
    """The audience map inclusion proof of ``key`` from the map view's live nodes (sibling
    hashes, root first); ``None`` when the map view is not running. Not trusted: the
    caller checks it against a revision's ``audiences_root``. A malformed stored node is
    INTEGRITY naming the view's table."""
    fetch = map_fetch(conn)
    if fetch is None:
        return None
    try:
        return inclusion_proof(fetch, key)[0]
    except BadNode as exc:
        raise IntegrityFailure(
            f"a node of the audience map view is malformed ({exc}): rebuild the view",
            table="view_audience_map",
            rule="R28",
            reason="bad_audience_map",
        ) from None


# -- stored cosigned checkpoints (ledger_checkpoint, schema version 3) -------------------


@dataclass(frozen=True)
class StoredCheckpoint:
    origin: str
    size: int
    root: bytes
    note: str
    stored_at_us: int


def from_row(row: Any) -> StoredCheckpoint:
    origin, size, root, note, at = row
    try:
        return StoredCheckpoint(dec(origin), int(size), bytes(root), dec(note), int(at))
    except (TypeError, ValueError, UnicodeDecodeError) as exc:
        raise IntegrityFailure(
            f"a row of {schema.checkpoint.name} is not of its declared types ({exc})",
            table=schema.checkpoint.name,
        ) from None


CHECKPOINT_TABLE = schema.checkpoint.name


def query_checkpoint(db: Database, origin: str) -> StoredCheckpoint | None:
    """``stored_checkpoint`` as one self-contained statement (``Database.query``: no
    transaction, this thread's connection), for the read service's hot path."""
    mark = "?" if db.is_sqlite else "%s"
    rows = db.query(
        "SELECT origin, size, root, note, stored_at_us FROM "
        f"{CHECKPOINT_TABLE} WHERE origin = {mark}",
        (enc(origin),),
    )
    return from_row(rows[0]) if rows else None


def stored_checkpoint(conn: Connection, origin: str) -> StoredCheckpoint | None:
    """The stored cosigned checkpoint of ``origin`` (one primary-key read)."""
    t = schema.checkpoint
    row = conn.execute(
        sa.select(t.c.origin, t.c.size, t.c.root, t.c.note, t.c.stored_at_us).where(
            t.c.origin == enc(origin)
        )
    ).one_or_none()
    return None if row is None else from_row(row)


def stored_checkpoints(conn: Connection) -> list[StoredCheckpoint]:
    """Every stored cosigned checkpoint, by origin."""
    t = schema.checkpoint
    rows = conn.execute(
        sa.select(t.c.origin, t.c.size, t.c.root, t.c.note, t.c.stored_at_us).order_by(t.c.origin)
    )
    return [from_row(row) for row in rows]


def store_checkpoint(db: Database, found: StoredCheckpoint) -> None:
    """Write (or replace) the stored cosigned checkpoint of ``found.origin``, as a
    compare-and-swap: never over a larger size, nor over the same size with another root.
    Two overlapping ``cosign`` runs: the one that would move the stored tree back (or
    aside) loses, CONFLICT naming the origin and both sizes, and stores nothing."""
    t = schema.checkpoint
    values = {
        "size": found.size,
        "root": found.root,
        "note": enc(found.note),
        "stored_at_us": found.stored_at_us,
    }
    origin = enc(found.origin)
    with db.write() as conn:
        changed = conn.execute(
            t.update()
            .where(
                t.c.origin == origin,
                sa.or_(
                    t.c.size < found.size, sa.and_(t.c.size == found.size, t.c.root == found.root)
                ),
            )
            .values(**values)
        ).rowcount
        if changed:
            return
        kept = conn.execute(sa.select(t.c.size, t.c.root).where(t.c.origin == origin)).one_or_none()
        if kept is None:  # a run that inserts it at once wins; this one: CONFLICT
            conn.execute(t.insert().values(origin=origin, **values))
            return
    raise Conflict(
        f"the stored checkpoint of {found.origin!r} is of size {kept[0]} (another cosign "
        f"run stored it, or the row was edited): size {found.size} "
        + ("would move it back" if kept[0] > found.size else "has another root")
        + "; nothing stored",
        origin=found.origin,
        size=found.size,
        stored_size=int(kept[0]),
    )


def cosignature_times(note: str) -> list[int]:
    """The timestamps of the note's ``cosignature/v1`` lines (``domain.notes``: a
    signature line whose signature is a timestamp and an Ed25519 signature), newest
    first. Not verified (the store holds no witness keys): for the operator's gauge only,
    never for a client's freshness."""
    times = []
    for line in note.rpartition("\n\n")[2].splitlines():
        try:
            times.append(cosignature_timestamp(NoteSignature.parse_line(line)))
        except (InvalidInput, IntegrityFailure):  # the log's own signature, or no line
            continue
    return sorted(times, reverse=True)
