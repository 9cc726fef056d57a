"""JSON Schema of every event, generated from the event classes themselves.

Auditors in other languages read ``catalog-ledger export --jsonl``; this
document (checked in as ``schema/events.schema.json`` and checked for
staleness by a test) says what each line and each event's ``state`` holds.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from eventsourcing.utils import get_topic
from pydantic import create_model

from domain.topics import event_classes

_NOT_STATE = {"originator_id", "originator_version"}


def state_schema(cls: type[Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    fields = {
        f.name: (hints[f.name], ...) for f in dataclasses.fields(cls) if f.name not in _NOT_STATE
    }
    model = create_model(cls.__qualname__.replace(".", ""), **fields)  # type: ignore[call-overload]
    schema: dict[str, Any] = model.model_json_schema()
    schema["additionalProperties"] = False
    return schema


def events_schema() -> dict[str, Any]:
    defs: dict[str, Any] = {}
    variants = []
    for cls in event_classes():
        name = cls.__qualname__.replace(".", "")
        defs[name] = state_schema(cls)
        variants.append(
            {
                "properties": {
                    "topic": {"const": get_topic(cls)},
                    "state": {"$ref": f"#/$defs/{name}"},
                },
            }
        )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Catalog Ledger event export line (catalog-ledger export --jsonl)",
        "type": "object",
        "required": ["position", "aggregate_id", "version", "topic", "event_id", "chain", "state"],
        "properties": {
            "position": {"type": "integer", "minimum": 1},
            "aggregate_id": {"type": "string", "format": "uuid"},
            "version": {"type": "integer", "minimum": 1},
            "topic": {"type": "string"},
            "event_id": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            "chain": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            "state": {"type": ["object", "null"]},
            "state_hex": {"type": ["string", "null"]},
        },
        "oneOf": variants,
        "$defs": defs,
    }
