"""``audit verify``'s check of the log's identity (R29): its key rotations.

Each ``log_key.rotated`` statement must be for the log's origin at its position, signed
by the key it names as old, and continue the chain of keys: its old key is the previous
rotation's new key. The first rotation's old key is the log's first key, which the log
cannot vouch for (clients pin it out of band). A statement that breaks any of this is
reported at its position (``check: "keys"``).
"""

from __future__ import annotations

from domain.errors import IntegrityFailure, InvalidInput
from domain.event_types import T_LOG_KEY_ROTATED, T_LOG_NAMED, T_LOG_RENAMED
from domain.key_rotation import Rotation, check_signature
from ledger.store.log_identity import store_origin
from ledger.store.runtime import Ledger


def check_log_keys(ledger: Ledger) -> list[tuple[int, str]]:
    """``(position, problem)`` for each rotation statement that is not what the log's
    chain of keys allows (empty: every rotation checks)."""
    with ledger.db.read() as conn:
        events = ledger.recorder.decoded_after(
            conn, after=0, topics=[T_LOG_NAMED, T_LOG_RENAMED, T_LOG_KEY_ROTATED]
        )
    origin = store_origin(ledger)
    problems: list[tuple[int, str]] = []
    previous: Rotation | None = None
    for event in events:
        if event.type != T_LOG_KEY_ROTATED:  # the origin in force from here on
            origin = str(event.data["origin"])
            continue
        statement = str(event.data["statement"])
        try:
            rotation = Rotation.parse(statement)
        except InvalidInput as exc:
            problems.append((event.position, f"the key rotation is malformed: {exc.message}"))
            continue
        if rotation.origin != origin:
            problems.append(
                (event.position, f"the key rotation is for {rotation.origin!r}, not {origin!r}")
            )
            continue
        if previous is not None and rotation.old != previous.new:
            problems.append(
                (
                    event.position,
                    f"the key rotation's old key {rotation.old.text()} is not the log's current "
                    f"key {previous.new.text()} (the previous rotation's new key)",
                )
            )
            continue
        try:
            check_signature(rotation.old, statement)
        except IntegrityFailure as exc:
            problems.append((event.position, exc.message))
            continue
        previous = rotation
    return problems
