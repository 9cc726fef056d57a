"""The catalog log and the audience map of a revision, recomputed from an export alone.

Written from schema/LOG-FORMAT.md ("Catalog log", "Audience map", the
``audience_view.published`` and ``catalog.published`` v2 entries of "Schema history"),
on top of ``reference_verifier`` (which first checks every event id and chain link of
the export): what an auditor replays to check what runtimes were shown. Like it, this
module imports nothing of the project.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterable
from typing import Any

from tests.support import reference_audience_map as audience_map
from tests.support import reference_verifier as ref


def records(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The event lines of an ``export --jsonl`` (verified by ``verify_export``), no trailer."""
    lines = list(lines)
    ref.verify_export(lines)
    return [r for r in map(json.loads, lines) if "trailer" not in r]


def _topic(record: dict[str, Any]) -> tuple[str, int]:
    name, _, version = record["topic"].partition("@")
    return name, int(version) if version.isdigit() else 0


def revision_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The catalog log's leaves in order: the catalog aggregate's ``catalog.published``
    events in version order, the one at index i being revision i + 1's."""
    catalog = str(uuid.UUID(bytes=ref.CATALOG_ID))
    found = sorted(
        (r for r in events if r["aggregate_id"] == catalog and _topic(r)[0] == "catalog.published"),
        key=lambda r: int(r["version"]),
    )
    for n, r in enumerate(found, start=1):
        state = json.loads(base64.b64decode(r["state_b64"]))
        if state["revision"] != n:
            raise ref.Mismatch(f"leaf {n - 1} is revision {state['revision']}'s event, not {n}'s")
    return found


def leaves(events: list[dict[str, Any]]) -> list[bytes]:
    return [ref.leaf(bytes.fromhex(r["event_id"])) for r in revision_events(events)]


def audiences_at(events: list[dict[str, Any]], revision: int) -> dict[tuple[str, str], bytes]:
    """Every audience in force after ``revision`` -> its view digest: the last
    ``audience_view.published`` of each audience up to that revision, unless null."""
    latest: dict[tuple[str, str], tuple[int, str | None]] = {}
    for r in events:
        if _topic(r)[0] != "audience_view.published":
            continue
        state = json.loads(base64.b64decode(r["state_b64"]))
        audience = (state["audience_kind"], state["audience_id"])
        if state["revision"] <= revision and latest.get(audience, (0, None))[0] < r["version"]:
            latest[audience] = (r["version"], state["digest"])
    return {a: bytes.fromhex(d) for a, (_, d) in latest.items() if d is not None}


def audiences_root(in_force: dict[tuple[str, str], bytes]) -> bytes:
    return audience_map.root({audience_map.key(*a): d for a, d in in_force.items()})
