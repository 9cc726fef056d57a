"""JSON Schema of every event type and version, generated from the type table.

Auditors in other languages read ``catalog-ledger export --jsonl``; this
document (checked in as ``schema/events.schema.json`` and checked for
staleness by a test) says what each line holds and, for every stored topic
(format v0 Python paths and format v1 ``type@version`` alike), which fields
that event's ``state`` must have.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import create_model

from domain.event_types import EVENT_TYPES, PRODUCT_TYPES, EventType


def state_schema(t: EventType, version: int, *, v0: bool = False) -> dict[str, Any]:
    """The state of ``t`` at schema ``version``: exactly its fields, all required."""
    hints = typing.get_type_hints(t.cls)
    for later, types in sorted(t.narrower_before.items()):
        if later > version:  # a field that version ``later`` widened, as it was before
            hints.update(types)
    fields: dict[str, Any] = {name: (hints[name], ...) for name in t.fields(version)}
    if v0 and t.creates:
        fields["originator_topic"] = (str, ...)  # format v0 only: a frozen Python path
    model = create_model(f"{t.name}@{version}", **fields)
    schema: dict[str, Any] = model.model_json_schema()
    schema["title"] = f"{t.name} v{version}" + (" (format v0)" if v0 else "")
    schema["additionalProperties"] = False
    return schema


def events_schema() -> dict[str, Any]:
    defs: dict[str, Any] = {}
    variants = []
    for t in PRODUCT_TYPES:
        for topic in t.stored_topics():
            stored = EVENT_TYPES.resolve(topic)
            ref = topic if stored.format == 1 else f"v0:{t.name}"
            defs[ref] = state_schema(t, stored.version, v0=stored.format == 0)
            variants.append(
                {
                    "properties": {
                        "topic": {"const": topic},
                        "type": {"const": t.name},
                        "type_version": {"const": stored.version},
                        "format": {"const": stored.format},
                        "state": {"$ref": f"#/$defs/{ref}"},
                    },
                }
            )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Catalog Ledger event export line (catalog-ledger export --jsonl)",
        "description": "One line per stored event; see schema/LOG-FORMAT.md.",
        "type": "object",
        "required": [
            "position",
            "aggregate_id",
            "version",
            "topic",
            "format",
            "type",
            "type_version",
            "event_id",
            "chain",
            "state_b64",
            "state",
        ],
        "properties": {
            "position": {"type": "integer", "minimum": 1},
            "aggregate_id": {"type": "string", "format": "uuid"},
            "version": {"type": "integer", "minimum": 1},
            "topic": {"type": "string"},
            "format": {"enum": [0, 1, None]},
            "type": {"type": ["string", "null"]},
            "type_version": {"type": ["integer", "null"], "minimum": 1},
            "event_id": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            "chain": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            "state_b64": {"type": "string", "contentEncoding": "base64"},
            "state": {"type": ["object", "null"]},
            "state_hex": {"type": ["string", "null"]},
        },
        "oneOf": variants,
        "$defs": defs,
    }
