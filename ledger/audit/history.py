"""As-of questions answered from the log alone: a pack's history, an audience's view
at any revision.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any, cast

from sqlalchemy.engine import Connection

from domain.credentials import rfc3339
from domain.errors import IntegrityFailure, Missing
from domain.event_types import (
    AUDIENCE_TYPES,
    EVENT_TYPES,
    LIFECYCLE_TYPES,
    T_PREPARED,
    Decoded,
    UnknownEventType,
    decode_row,
    decode_state,
)
from domain.served import audience_digest
from ledger.audit.replay import CATALOG_TYPES, CatalogReplay
from ledger.audit.results import AudienceHistoryEvent, HistoryEvent, PastView
from ledger.store.runtime import Ledger

# -- as-of questions from the log alone -----------------------------------------------------------


def history(ledger: Ledger, pack: str) -> list[HistoryEvent]:
    """Every lifecycle event of ``pack``, in log order, decoded from the log."""
    out: list[HistoryEvent] = []
    with ledger.db.read() as conn, closing(ledger.recorder.scan_full(conn)) as rows:
        for row in rows:
            if _type_at(row[0], row[3]) in LIFECYCLE_TYPES:
                found = decode_row(row[1], row[0], row[2], row[3], row[4])
                if found.data.get("pack") == pack:
                    out.append(_pack_event(found, row[5]))
    return out


def _type_at(position: int, topic: bytes) -> str:
    """The type name of a stored topic; an unknown one is INTEGRITY naming the row (R23)."""
    try:
        return EVENT_TYPES.resolve(topic).type.name
    except UnknownEventType as exc:
        raise IntegrityFailure(
            f"the log row at position {position} is not readable: {exc.message}",
            **{**exc.details, "position": position},
        ) from None


def _pack_event(found: Decoded, event_id: bytes) -> HistoryEvent:
    """One lifecycle event as ``history --pack`` shows it."""
    position, name, data = found.position, found.type, found.data
    summary: dict[str, Any] = {
        k: data[k]
        for k in (
            "install_id",
            "ordinal",
            "origin",
            "epoch",
            "revision",
            "dirty",
            "reason",
            "from_install_id",
            "successor_install_id",
            "incarnation",
        )
        if k in data
    }
    if data.get("removed"):  # a retirement by removal (R7); shown only then, so
        summary["removed"] = True  # the history of older stores reads unchanged
    if name == T_PREPARED:
        summary["revision"] = data["source"].get("revision")
        summary["payload_hash"] = data["payload_hash"]
    # The summary keys are HistoryEvent's optional fields, copied as stored.
    event = {
        "position": position,
        "event": name,
        "event_id": event_id.hex(),
        "timestamp": data.get("timestamp"),
        **summary,
    }
    return cast(HistoryEvent, event)


#: Fields of binding and credential events ``history --audience`` copies as stored.
_AUDIENCE_FIELDS = (
    "pack",
    "kind",
    "key",
    "credential_set",
    "install_id",
    "from_install_id",
    "credential_id",
    "revision",  # an audience view event: the revision and the digest it committed (R28)
    "digest",
)
#: Credential times (microseconds in the log) shown as RFC 3339 UTC.
_AUDIENCE_TIMES = {
    "issued_at_us": "issued_at",
    "expires_at_us": "expires_at",
    "revoked_at_us": "revoked_at",
}


def audience_history(ledger: Ledger, audience: tuple[str, str]) -> list[AudienceHistoryEvent]:
    """Every binding, credential and published-view event of ``audience``, in log order,
    from the log alone. A credential's token digest is left out: it is nobody's business here."""
    out: list[AudienceHistoryEvent] = []
    kind, ident = audience
    with ledger.db.read() as conn, closing(ledger.recorder.scan_full(conn)) as rows:
        for row in rows:
            if _type_at(row[0], row[3]) not in AUDIENCE_TYPES:
                continue
            found = decode_row(row[1], row[0], row[2], row[3], row[4])
            data = found.data
            if (data.get("audience_kind"), data.get("audience_id")) == (kind, ident):
                out.append(_audience_event(found, row[5]))
    return out


def _audience_event(found: Decoded, event_id: bytes) -> AudienceHistoryEvent:
    """One binding or credential event as ``history --audience`` shows it."""
    position, data = found.position, found.data
    summary: dict[str, Any] = {k: data[k] for k in _AUDIENCE_FIELDS if k in data}
    for stored_name, shown in _AUDIENCE_TIMES.items():
        if stored_name in data:
            summary[shown] = rfc3339(data[stored_name])
    return cast(
        AudienceHistoryEvent,
        {
            "position": position,
            "event": found.type,
            "event_id": event_id.hex(),
            "timestamp": data.get("timestamp"),
            **summary,
        },
    )


def catalog_events(
    ledger: Ledger, conn: Connection, upto: int | None = None
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """The catalog lineage's events (what ``CatalogReplay`` reads), decoded, in log
    order up to ``upto`` (default: the head in ``conn``'s snapshot)."""
    head = ledger.recorder.head_in(conn).position if upto is None else upto
    for position, topic, state in ledger.recorder.scan(
        conn, after=0, upto=head, topics=EVENT_TYPES.topics_of(CATALOG_TYPES)
    ):
        name, data = decode_state(position, topic, state)
        yield position, name, data


def feed(replay: CatalogReplay, position: int, name: str, data: dict[str, Any]) -> None:
    """Feed ``replay`` one event; a log that does not replay is INTEGRITY at it."""
    problem = replay.feed(position, name, data)
    if problem is not None:
        raise IntegrityFailure(f"the log does not replay: {problem}", position=position)


def view_at(ledger: Ledger, audience: tuple[str, str], revision: int) -> PastView:
    """What ``audience`` was served at ``revision``, replayed from the log alone."""
    replay = CatalogReplay(keep=revision)
    with ledger.db.read() as conn:
        for position, name, data in catalog_events(ledger, conn):
            feed(replay, position, name, data)
            if revision in replay.revisions:
                break
    if revision not in replay.revisions:
        raise Missing(f"revision {revision} was never published")
    position, built = replay.revisions[revision]
    kind, ident = audience
    grants = [g for g in built.grants if (g[0], g[1]) == (kind, ident)]
    if not grants:
        raise Missing("no catalog view is published for this audience")
    facts_by_id = {tuple(f[:4]): f[4] for f in built.facts}
    fact_rows = sorted({(g[2], g[6], g[3], g[4]) for g in grants})
    edges = [[g[2], g[3], g[4], g[5], g[6]] for g in grants]
    entries = [[*f, facts_by_id[f]] for f in fact_rows]
    return {
        "audience": f"{kind}:{ident}",
        "revision": revision,
        "position": position,
        "content_digest": built.content_digest,
        "audience_digest": audience_digest(audience, edges, entries),
        "grants": [
            {"pack": e[0], "kind": e[1], "key": e[2], "credential_set": e[3], "install_id": e[4]}
            for e in edges
        ],
        "facts": [
            {
                "pack": f[0],
                "install_id": f[1],
                "kind": f[2],
                "key": f[3],
                "fact_digest": facts_by_id[f],
            }
            for f in fact_rows
        ],
    }
