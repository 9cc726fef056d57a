"""``export --jsonl``: every stored event, for auditors in any language (LOG-FORMAT.md)."""

from __future__ import annotations

import base64
from typing import Any, TextIO
from uuid import UUID

import orjson

from domain import merkle
from domain.digests import ZERO_CHAIN
from domain.errors import IntegrityFailure
from domain.event_types import (
    EVENT_TYPES,
    UnknownEventType,
)
from domain.origin import catalog_origin
from ledger.log.checkpoint_line import CheckpointLine
from ledger.log.trailer import Trailer
from ledger.store import carried_checkpoints
from ledger.store.log_identity import origin_of
from ledger.store.runtime import Ledger

_SQL = {str: "TEXT", int: "an INTEGER", float: "a REAL", type(None): "NULL"}


class DamagedExport(IntegrityFailure):
    """The export is complete (every row, verbatim, and the trailer) but rows of the
    store are damaged: exit 6 naming the first one, after the file is written."""


def export_jsonl(ledger: Ledger, out: TextIO) -> int:
    """Every event as one JSON line, then the trailer line (schema/LOG-FORMAT.md, "Export").

    Each record carries the exact stored state bytes (``state_b64``), so an
    auditor recomputes ``event_id`` and ``chain`` from the line alone, and says
    per record which log format and schema version the row was written in: a
    store written by 0.1 and appended to later holds both formats. A topic
    this release does not know is still exported (type, version and format
    null): the export never hides a row; ``audit verify`` fails it closed.

    A damaged row (a value not of its column's type, NULL, a known type whose state
    is not a JSON object) is written too, as stored, with a ``damage`` object naming
    what is wrong, for forensics; the trailer follows, so the file is complete, and
    then ``DamagedExport`` (INTEGRITY, exit 6) names the first damaged position.
    Returns the number of event lines.
    """
    count = damaged = 0
    first: tuple[int, str, str] | None = None
    tree: merkle.MerkleStack | None = merkle.MerkleStack()
    with ledger.db.read() as conn:
        head = ledger.recorder.stored_head(conn)  # the same read as the rows
        for row in ledger.recorder.scan_stored(conn):
            line, damage = _line(row)
            event = _bytes(row[5])
            if tree is not None and event is not None and len(event) == 32:
                tree.add(merkle.leaf_hash(event))
            else:
                tree = None  # no root over a log whose event ids are not all there
            if damage:
                line["damage"] = damage
                damaged += 1
                if first is None:
                    column, problem = next(iter(damage.items()))
                    first = (line["position"], column, problem)
            out.write(orjson.dumps(line).decode() + "\n")
            count += 1
        # The latest cosigned checkpoints of this log (not of an origin it had before a
        # log.renamed), read with the rows (R29): a restore keeps them.
        carried = _ours(ledger, carried_checkpoints.read_all(conn))
        for checkpoint in carried:
            out.write(orjson.dumps(checkpoint.to_json()).decode() + "\n")
    position, chain, head_problem = _head(head)
    trailer = Trailer(
        count=count,
        head_position=position,
        head_chain=chain,
        root=None if tree is None else tree.root(),
        damaged=damaged,
        checkpoints=len(carried),
    )
    out.write(orjson.dumps(trailer.to_json()).decode() + "\n")
    if first is not None:
        where, column, problem = first
        raise DamagedExport(
            f"position {where}: {column} {problem}; the export holds every row as stored "
            f"({count} events, {damaged} damaged: see the `damage` key of those lines)",
            position=where,
            field=column,
            check="stored",
            damaged=damaged,
            events=count,
        )
    if head_problem is not None:
        raise DamagedExport(
            f"the head row {head_problem}; the export holds every row as stored "
            f"({count} events; the trailer's head fields are null)",
            field="head",
            check="stored",
            damaged=0,
            events=count,
        )
    return count


def _ours(ledger: Ledger, stored: list[CheckpointLine]) -> list[CheckpointLine]:
    """The stored cosigned checkpoints of the log's current origin (and its catalog log's).
    A log whose identity events cannot be read (a damaged store) carries every row: the
    export never stops at damage, and ``import`` checks each line against the log."""
    if not stored:
        return stored
    try:
        origin = origin_of(ledger)
    except IntegrityFailure:
        return stored
    ours = (origin, catalog_origin(origin))
    return [c for c in stored if c.origin in ours]


def _line(row: tuple[object, ...]) -> tuple[dict[str, Any], dict[str, str]]:
    """One row as an export line, and what is damaged in it (column -> problem).

    A row whose values are all of their column's type takes the short path (the
    export of a store in order costs what it did before the damage checks); anything
    else, or a known type whose state is not a JSON object, is looked at column by
    column in ``_damaged_line``."""
    position, agg, version, topic, state, event_id, chain = row
    if not (
        type(agg) is bytes
        and len(agg) == 16
        and type(version) is int
        and version >= 1
        and type(topic) is bytes
        and type(state) is bytes
        and type(event_id) is bytes
        and len(event_id) == 32
        and type(chain) is bytes
        and len(chain) == 32
    ):
        return _damaged_line(row)
    try:
        topic_text = topic.decode("utf-8")
        stored = EVENT_TYPES.resolve(topic)
        kind: tuple[Any, Any, Any] = (stored.format, stored.type.name, stored.version)
    except UnicodeDecodeError:
        return _damaged_line(row)
    except UnknownEventType:
        kind = (None, None, None)
    line: dict[str, Any] = {
        "position": position,
        "aggregate_id": str(UUID(bytes=agg)),
        "version": version,
        "topic": topic_text,
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
    if kind[0] is not None and not isinstance(line["state"], dict):
        return _damaged_line(row)
    return line, {}


def row_damage(row: tuple[object, ...]) -> dict[str, str]:
    """What is damaged in one stored row, as ``scan_stored`` returns it: column -> problem
    (the export's definition, which ``audit verify`` reports too). Empty: nothing."""
    return _line(row)[1]


def _damaged_line(row: tuple[object, ...]) -> tuple[dict[str, Any], dict[str, str]]:
    """``_line`` for a row with something wrong in it: every column checked and written
    as stored."""
    position, agg, version, topic, state, event_id, chain = row
    damage: dict[str, str] = {}
    topic_bytes = _bytes(topic)
    topic_text: object = _verbatim(topic)
    kind: tuple[Any, Any, Any] = (None, None, None)
    if topic_bytes is None:
        damage["topic"] = _not_bytes(topic)
    else:
        try:
            topic_text = topic_bytes.decode("utf-8")
        except UnicodeDecodeError:
            topic_text = topic_bytes.decode("utf-8", "replace")
            damage["topic"] = f"is not UTF-8 (shown with U+FFFD; stored hex {topic_bytes.hex()})"
        try:
            stored = EVENT_TYPES.resolve(topic_bytes)
            kind = (stored.format, stored.type.name, stored.version)
        except UnknownEventType:
            pass
    if type(version) is not int or version < 1:
        damage["version"] = (
            f"is {version}, not a version (>= 1)"
            if type(version) is int
            else f"is stored as {_sql(version)}, not an integer"
        )
        if isinstance(version, str):
            damage["version"] += f" (stored hex {_exact(version).hex()})"
    line: dict[str, Any] = {
        "position": int(position),  # type: ignore[call-overload]  # the integer primary key
        "aggregate_id": _sized(agg, 16, "aggregate_id", damage, uuid=True),
        "version": _verbatim(version),
        "topic": topic_text,
        "format": kind[0],
        "type": kind[1],
        "type_version": kind[2],
        "event_id": _sized(event_id, 32, "event_id", damage),
        "chain": _sized(chain, 32, "chain", damage),
        "state_b64": None,
        "state_hex": None,
        "state": None,
    }
    data = _bytes(state)
    if data is None and isinstance(state, str):
        data = _exact(state)
        damage["state"] = "is stored as TEXT, not bytes (state_b64 holds its bytes)"
    if data is None:
        line["state"] = _verbatim(state)
        damage["state"] = _not_bytes(state)
        return line, damage
    line["state_b64"] = base64.b64encode(data).decode("ascii")
    try:
        line["state"] = orjson.loads(data)
    except orjson.JSONDecodeError:
        line["state_hex"] = data.hex()
    if kind[0] is not None and "state" not in damage and not isinstance(line["state"], dict):
        if not data:
            damage["state"] = "is empty (the state of a known event type is a JSON object)"
        elif line["state_hex"] is not None:
            damage["state"] = "is not JSON (truncated or edited; state_hex holds the bytes)"
        else:
            damage["state"] = "is JSON but not an object (the state of a known event type is one)"
    return line, damage


def _head(head: tuple[object, object] | None) -> tuple[int | None, bytes | None, str | None]:
    """The head row as the trailer states it, and what is wrong with it (or None)."""
    if head is None:
        return 0, ZERO_CHAIN, None
    position, chain = head
    problems = []
    if type(position) is not int:
        problems.append(f"position is stored as {_sql(position)}, not an integer")
    chain_bytes = _bytes(chain)
    if chain_bytes is None or len(chain_bytes) != 32:
        problems.append(
            f"chain {_not_bytes(chain)}"
            if chain_bytes is None
            else f"chain is {len(chain_bytes)} bytes, not 32"
        )
        chain_bytes = None
    return (
        position if type(position) is int else None,
        chain_bytes,
        " and ".join(problems) or None,
    )


def _bytes(value: object) -> bytes | None:
    if type(value) is bytes:
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return None


def _sql(value: object) -> str:
    return _SQL.get(type(value), type(value).__name__)


def _not_bytes(value: object) -> str:
    if isinstance(value, str):
        return f"is stored as TEXT, not bytes (stored hex {_exact(value).hex()})"
    return f"is stored as {_sql(value)}, not bytes"


def _exact(text: str) -> bytes:
    """The stored bytes of a TEXT value (the raw scans keep invalid UTF-8 as surrogates)."""
    return text.encode("utf-8", "surrogateescape")


def _verbatim(value: object) -> object:
    """A stored value as JSON, unchanged: text, numbers and NULL as themselves, bytes as hex.
    Text that is not UTF-8 shows U+FFFD; the damage message then gives its hex."""
    data = _bytes(value)
    if data is not None:
        return data.hex()
    if isinstance(value, str):
        return _exact(value).decode("utf-8", "replace")
    return value


def _sized(
    value: object, size: int, column: str, damage: dict[str, str], *, uuid: bool = False
) -> object:
    """A fixed-size binary column: hex (a UUID for the aggregate id), or as stored, flagged."""
    data = _bytes(value)
    if data is None:
        damage[column] = _not_bytes(value)
        return _verbatim(value)
    if len(data) != size:
        damage[column] = f"is {len(data)} bytes, not {size} (shown in hex)"
        return data.hex()
    return str(UUID(bytes=data)) if uuid else data.hex()
