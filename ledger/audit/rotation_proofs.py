"""The log's key rotations as a runtime is shown them: each with its inclusion proof under
the stored cosigned checkpoint of the main log (R29; LOG-FORMAT "Key rotation").

``GET /v1/log/rotations`` serves ``rotations_document``: the stored main-log note (as the
collector ``cosign`` stored it: the log's signature, the witnesses' cosignatures) and, for
every ``log_key.rotated`` event, the event as stored (aggregate id, version, topic, state
bytes), its leaf index and its RFC 9162 inclusion proof under that note's tree. The
client (``ledger.client_keys``) checks all of it offline; nothing here is taken on trust
by anyone, but the server checks before it serves that the stored note is the main log's
at its size (else INTEGRITY ``checkpoint_mismatch`` naming ``ledger_checkpoint``) and that
every stored rotation event gives its stored id.

Read-only: proofs come from ``MerkleLog``'s node reads, never its ``flush`` (a replica's
account may only SELECT). A rotation the stored note does not cover yet (the collector has
not run since it was appended) is UNAVAILABLE ``checkpoint_pending``.
"""

from __future__ import annotations

import base64
from typing import Any

import sqlalchemy as sa

from domain import merkle
from domain.digests import event_id
from domain.errors import IntegrityFailure, Unavailable
from domain.event_types import EVENT_TYPES, T_LOG_KEY_ROTATED, UnknownEventType
from domain.origin import log_identity_id
from ledger.audit.proofs import MerkleLog
from ledger.log import tables as schema
from ledger.store.catalog_log import CHECKPOINT_TABLE, query_checkpoint
from ledger.store.log_identity import origin_of
from ledger.store.runtime import Ledger

#: The format of ``rotations_document``.
ROTATIONS_FORMAT = 1


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _rotation_rows(ledger: Ledger) -> list[tuple[int, int, bytes, bytes]]:
    """``(position, version, topic, state)`` of each ``log_key.rotated`` event, in log order
    (one range read on the ``(aggregate_id, version)`` index), each checked against its id."""
    t = schema.events
    ident = log_identity_id().bytes
    with ledger.db.read() as conn:
        rows = conn.execute(
            sa.select(t.c.position, t.c.version, t.c.topic, t.c.state, t.c.event_id)
            .where(t.c.aggregate_id == ident)
            .order_by(t.c.version)
        ).all()
    found = []
    for position, version, raw_topic, raw_state, stored in rows:
        topic, state = bytes(raw_topic), bytes(raw_state)
        if event_id(ident, int(version), topic, state) != bytes(stored):
            raise IntegrityFailure(
                f"the log row at position {position} does not give its stored event_id",
                table=schema.events.name,
                position=position,
            )
        try:
            name = EVENT_TYPES.resolve(topic).type.name
        except UnknownEventType as exc:
            raise IntegrityFailure(
                f"the log row at position {position} is not readable: {exc.message}",
                position=position,
            ) from None
        if name == T_LOG_KEY_ROTATED:
            found.append((int(position), int(version), topic, state))
    return found


def rotations_document(ledger: Ledger) -> dict[str, Any]:
    """The body of ``GET /v1/log/rotations`` (module docstring)."""
    origin = origin_of(ledger)
    rows = _rotation_rows(ledger)
    stored = query_checkpoint(ledger.db, origin)
    if not rows:
        return {"format": ROTATIONS_FORMAT, "checkpoint": None, "rotations": []}
    last = rows[-1][0]
    if stored is None or stored.size < last:
        covered = "no stored checkpoint" if stored is None else f"the stored one has {stored.size}"
        raise Unavailable(
            f"no cosigned main-log checkpoint covers the key rotation at position {last} yet "
            f"({covered}): the collector (`catalog-ledger cosign`) has not run since",
            reason="checkpoint_pending",
            position=last,
        )
    log = MerkleLog(ledger)
    if stored.size > log.size() or merkle.root_from(log.node, stored.size) != stored.root:
        raise IntegrityFailure(
            f"the stored checkpoint of {origin} in {CHECKPOINT_TABLE} does not match the "
            f"log: its root is not the main log's at size {stored.size}",
            table=CHECKPOINT_TABLE,
            origin=origin,
            reason="checkpoint_mismatch",
        )
    rotations = []
    for position, version, topic, state in rows:
        proof = merkle.inclusion_proof_from(log.node, position - 1, stored.size)
        rotations.append(
            {
                "event": {
                    "aggregate_id": str(log_identity_id()),
                    "version": version,
                    "topic": topic.decode("utf-8", "surrogateescape"),
                    "state_b64": _b64(state),
                },
                "leaf_index": position - 1,
                "inclusion": [_b64(p) for p in proof],
            }
        )
    return {"format": ROTATIONS_FORMAT, "checkpoint": stored.note, "rotations": rotations}
