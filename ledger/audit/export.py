"""``export --jsonl``: every stored event, for auditors in any language (LOG-FORMAT.md)."""

from __future__ import annotations

import base64
from typing import Any, TextIO

import orjson

from domain.event_types import (
    EVENT_TYPES,
    UnknownEventType,
)
from ledger.store.runtime import Ledger


def export_jsonl(ledger: Ledger, out: TextIO) -> int:
    """Every event as one JSON line (schema/LOG-FORMAT.md, "Export").

    Each record carries the exact stored state bytes (``state_b64``), so an
    auditor recomputes ``event_id`` and ``chain`` from the line alone, and says
    per record which log format and schema version the row was written in: a
    store written by 0.1 and appended to later holds both formats. A topic
    this release does not know is still exported (type, version and format
    null): the export never hides a row; ``audit verify`` fails it closed.
    """
    from uuid import UUID

    count = 0
    with ledger.db.read() as conn:
        for position, agg, version, topic, state, event_id, chain in ledger.recorder.scan_full(
            conn
        ):
            try:
                stored = EVENT_TYPES.resolve(topic)
                kind: tuple[Any, Any, Any] = (stored.format, stored.type.name, stored.version)
            except UnknownEventType:
                kind = (None, None, None)
            line = {
                "position": position,
                "aggregate_id": str(UUID(bytes=agg)),
                "version": version,
                "topic": topic.decode("utf-8", "replace"),
                "format": kind[0],
                "type": kind[1],
                "type_version": kind[2],
                "event_id": event_id.hex(),
                "chain": chain.hex(),
                "state_b64": base64.b64encode(state).decode("ascii"),
                "state_hex": None,
                "state": None,
            }
            try:
                line["state"] = orjson.loads(state)
            except orjson.JSONDecodeError:
                line["state_hex"] = state.hex()
            out.write(orjson.dumps(line).decode() + "\n")
            count += 1
    return count
