"""The log's origin and key rotations, read from and written to the log (R29, issue 28).

``origin_of`` is the origin every checkpoint of this log names: the ``log.named`` event's
(one index seek on the ``LogIdentity`` aggregate), else — a log never named — the store's
``catalog-ledger/<store id>``. ``name_log`` appends ``log.named`` when it is missing, with
that same origin (or one the operator gives, to restore a pinned origin onto a log that
was exported before it was named): every signer calls it before it signs, so that no
signed checkpoint names an origin the log itself does not state (``audit checkpoint
--sign``, ``audit rotate-key``, and the collector ``cosign``).
"""

from __future__ import annotations

import sqlalchemy as sa

from domain.errors import Conflict, InvalidInput
from domain.log_identity import LogIdentity
from domain.origin import catalog_origin, check_origin, default_origin, log_identity_id
from ledger.log import tables as schema
from ledger.log.sqltypes import enc
from ledger.store.runtime import Ledger

__all__ = [
    "name_log",
    "named_origin",
    "origin_of",
    "record_rotation",
    "rename_log",
    "rotations",
]


def named_origin(ledger: Ledger) -> str | None:
    """The origin the log states (its last ``log.named`` / ``log.renamed``), or None when
    the log was never named: one read of the log identity aggregate's few events, by its
    index (a tampered sequence is INTEGRITY naming the position)."""
    with ledger.db.read() as conn:
        identity = ledger.repository(conn).get(log_identity_id(), LogIdentity)
    return None if identity is None else str(identity.origin)


def store_origin(ledger: Ledger) -> str:
    """The origin of a log with no ``log.named``: ``catalog-ledger/<store id>``."""
    t = schema.meta
    with ledger.db.read() as conn:
        found = conn.execute(sa.select(t.c.value).where(t.c.name == b"store_id")).scalar()
    if found is None:
        raise InvalidInput("the store has no id; run `catalog-ledger init`", field="db")
    return default_origin(bytes(found).decode())


def origin_of(ledger: Ledger) -> str:
    """The checkpoint origin of this log (see the module doc)."""
    return named_origin(ledger) or store_origin(ledger)


def name_log(ledger: Ledger, origin: str | None = None) -> tuple[str, bool]:
    """``(origin, appended)``: name the log if it is not named yet.

    ``origin`` defaults to the origin the log has had so far (``store_origin``). Naming
    a log that is named already with another origin is CONFLICT: the origin of a log
    never changes (a new origin is a new log, which clients re-pin)."""
    if origin is not None:
        check_origin(origin)
    named = named_origin(ledger)
    if named is None:
        wanted = origin or store_origin(ledger)
        try:
            ledger.app.save(LogIdentity(origin=wanted), fence={log_identity_id(): 0})
            return wanted, True
        except Conflict:  # named meanwhile by another signer: read what it named
            named = named_origin(ledger)
            assert named is not None
    if origin is not None and origin != named:
        raise Conflict(
            f"the log is named {named!r} already; a log's origin never changes (a restore "
            "under another origin is a new log: start a new store and have clients re-pin)",
            field="origin",
            origin=named,
        )
    return named, False


def rename_log(ledger: Ledger, origin: str | None = None) -> str:
    """Give the log a new origin (``log.renamed``; ``log.named`` if it was never named):
    ``origin``, by default this store's ``catalog-ledger/<store id>``. From here on it is
    another log to witnesses and clients, which re-pin it. CONFLICT when the log already
    has that origin."""
    wanted = check_origin(origin) if origin is not None else store_origin(ledger)
    named = named_origin(ledger)
    if named is None:
        name_log(ledger, wanted)
        return wanted
    if named == wanted:
        raise Conflict(
            f"the log's origin is {named!r} already; give another with --origin",
            field="origin",
            origin=named,
        )
    with ledger.db.read() as conn:
        identity = ledger.repository(conn).get(log_identity_id(), LogIdentity)
    assert identity is not None
    identity.rename(wanted)
    ledger.app.save(identity, fence={identity.id: identity.version - 1})
    # The old origin's cosigned notes are another log's now: the collector stores the new
    # origin's, and `audit verify` ties every stored row to this log.
    t = schema.checkpoint
    with ledger.db.write() as conn:
        conn.execute(t.delete().where(t.c.origin.in_([enc(named), enc(catalog_origin(named))])))
    return wanted


def record_rotation(ledger: Ledger, statement: str) -> int:
    """Append ``log_key.rotated`` holding ``statement`` (the log is named first); returns
    the log position of the rotation event."""
    name_log(ledger)
    with ledger.db.read() as conn:
        identity = ledger.repository(conn).get(log_identity_id(), LogIdentity)
    assert identity is not None
    identity.rotate(statement)
    version = identity.version
    ledger.app.save(identity, fence={identity.id: version - 1})
    with ledger.db.read() as conn:
        last = ledger.recorder.last_events(conn, [identity.id])[identity.id]
    return last.position


def rotations(ledger: Ledger) -> list[str]:
    """Every rotation statement of the log, in log order."""
    with ledger.db.read() as conn:
        identity = ledger.repository(conn).get(log_identity_id(), LogIdentity)
    return [] if identity is None else list(identity.statements)
