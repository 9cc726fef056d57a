"""The orjson transcoder: deterministic bytes for the same event.

Output is orjson with sorted keys, so the same event state encodes to the same
bytes in every process (dict insertion order, hash seeds and platform do not
matter). ``datetime`` values encode as RFC 3339 text; the event ``timestamp``
that every ``eventsourcing`` event carries is turned back into a ``datetime``
on decode, so ``decode(encode(state)) == state`` for every event state.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
from eventsourcing.persistence import Transcoder

_OPTIONS = orjson.OPT_SORT_KEYS


class OrjsonTranscoder(Transcoder):
    """Canonical, deterministic JSON bytes for event state."""

    def encode(self, obj: Any) -> bytes:
        return orjson.dumps(obj, option=_OPTIONS)

    def decode(self, data: bytes) -> Any:
        value = orjson.loads(data)
        if isinstance(value, dict):
            stamp = value.get("timestamp")
            if isinstance(stamp, str):
                value["timestamp"] = datetime.fromisoformat(stamp)
        return value
